"""Quantized targets on CPU (``quantize="int8"`` or ``"int4"``): every matrix of the target, its heads and a draft
model quantized weight-only; greedy output at each precision equals that precision's own autoregressive output, the
verifying and drafting forwards read the same quantized weights, the products are close to float's, and a setting the
kernels do not take is one sentence before any weight is converted."""

import copy
import functools
import re

import pytest
import torch

from mtp.decode import GenerationConfig, generate
from mtp.decode.inference import InferenceModel
from mtp.decode.methods.draft_model import draft_model_drafter
from mtp.decode.methods.layer_skip import layer_skip_drafter
from mtp.decode.plan import Plan
from mtp.decode.quantize import QuantizedMatrices, QuantizedUnembedding
from mtp.decode.settings import StepSettings
from mtp.errors import SettingError
from mtp.model import MTPModel
from mtp.model.config import ModelConfig
from tests.decode.helpers import HEAD_TYPES, tiny_model, train_on_cycles
from tests.decode.test_generate import RAGGED
from tests.decode.test_int8 import relative_error, step_logits
from tests.decode.test_tree import partly_trained

PRECISIONS = ("int8", "int4")
EVERYDAY = ("transformer", "causal")
partly_trained_once = functools.cache(partly_trained)


def autoregressive(model, prompts, max_new_tokens: int, quantize: str) -> list[list[int]]:
    return generate(model, prompts, Plan(GenerationConfig(max_new_tokens)).changed(quantize=quantize))[0]


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize(
    "head_type",
    [pytest.param(h, marks=[] if h in EVERYDAY else [pytest.mark.slow]) for h in HEAD_TYPES],
)
def test_greedy_with_quantized_heads_equals_that_precisions_autoregressive(head_type, precision, trained_models):
    """A random model (drafts almost all rejected) and a trained one (drafts accepted), ragged prompts."""
    for model in (tiny_model(**HEAD_TYPES[head_type]), trained_models(head_type)):
        reference = autoregressive(model, RAGGED, 24, precision)
        for heads in (2, 4):
            plan = Plan().changed(max_new_tokens=24, heads=heads, quantize=precision)
            out, stats = generate(model, RAGGED, plan)
            assert out == reference, f"heads={heads}"
            assert stats.drafted[0] > 0
    assert sum(stats.accepted) > 0  # the trained model: the accepting branch ran


@pytest.fixture(scope="module")
def counting_target():
    return partly_trained_once("transformer")


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("method", ["draft", "layerskip"])
def test_greedy_with_a_quantized_drafter_equals_that_precisions_autoregressive(method, precision, counting_target):
    reference = autoregressive(counting_target, RAGGED, 30, precision)
    if method == "draft":
        drafter = draft_model_drafter(train_on_cycles(tiny_model(n_future=1, vocab_size=40, seed=7), steps=15))
    else:
        drafter = layer_skip_drafter(counting_target, frozenset({1}))
    drafter.gamma = 3
    out, stats = generate(counting_target, RAGGED, Plan(drafter=drafter).changed(max_new_tokens=30, quantize=precision))
    assert out == reference
    assert 0 < sum(stats.accepted) < sum(stats.drafted)
    assert drafter.drafting.quantize == precision  # the drafter drafted with its quantized form


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_bfloat16_model_quantized_decodes_its_own_autoregressive_tokens(precision, trained_model):
    model = copy.deepcopy(trained_model).to(torch.bfloat16)
    model.rope_cos, model.rope_sin = model.rope_cos.float(), model.rope_sin.float()  # as the loader keeps them
    reference = autoregressive(model, RAGGED, 24, precision)
    out, stats = generate(model, RAGGED, Plan().changed(max_new_tokens=24, heads=4, quantize=precision))
    assert out == reference and sum(stats.accepted) > 0


def quantized_parts(form) -> list:
    """The quantized stacks of a form's path, head 1's unembedding and its draft heads' matrices."""
    parts = [m for blocks in form.path for m in (blocks.qkv, blocks.wo, blocks.gate_up, blocks.down)]
    parts.append(form.head1_output.matrix)
    if form.drafter is not None:
        parts += [m for m in (form.drafter.blocks.qkv, form.drafter.blocks.wo, form.drafter.blocks.gate_up)]
        parts.append(form.drafter.blocks.down)
    return parts


@pytest.fixture
def calls(monkeypatch) -> set[QuantizedMatrices]:
    """The quantized stacks multiplied while the test runs."""
    called = set()
    multiply = QuantizedMatrices.__call__

    def recorded(self, x):
        called.add(self)
        return multiply(self, x)

    monkeypatch.setattr(QuantizedMatrices, "__call__", recorded)
    return called


@pytest.mark.parametrize("precision", PRECISIONS)
def test_verifying_and_drafting_read_the_same_quantized_weights(precision, calls):
    model = tiny_model()
    form = InferenceModel.of(model, 4, quantize=precision)
    alone = InferenceModel.of(model, 1, quantize=precision)  # autoregressive decoding's form
    assert form is InferenceModel.of(model, 4, quantize=precision) and form.quantize == precision
    float_form = InferenceModel.of(model, 4)
    assert all(not blocks.quantized and isinstance(blocks.qkv, torch.Tensor) for blocks in float_form.path)
    assert isinstance(form.head1_output, QuantizedUnembedding) and form.draft_output is form.head1_output
    parts = quantized_parts(form)
    assert all(isinstance(part, QuantizedMatrices) and part.precision == precision for part in parts)
    for ours, theirs in zip(quantized_parts(form)[: 4 * len(form.path) + 1], quantized_parts(alone), strict=True):
        for (w, scales), (w_alone, scales_alone) in zip(ours.weights, theirs.weights, strict=True):
            assert torch.equal(w, w_alone) and torch.equal(scales, scales_alone)
    generate(model, RAGGED, Plan().changed(max_new_tokens=8, heads=4, quantize=precision))
    assert calls == set(parts)  # every quantized matrix computes, the prompts' step included


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("head_type", ["transformer", "causal", "medusa", "eagle3"])
def test_quantized_logits_are_close_to_float(head_type, precision):
    model = tiny_model(**HEAD_TYPES[head_type])
    prompts = [[5, 6, 7, 8], [1, 2, 30, 4]]
    full = step_logits(InferenceModel.of(model, 4), prompts)
    quantized = step_logits(InferenceModel.of(model, 4, quantize=precision), prompts)
    error = relative_error(quantized, full)
    assert 0 < error < (0.05 if precision == "int8" else 0.3), error


@pytest.mark.parametrize("precision", PRECISIONS)
def test_quantized_products_are_close_to_float_and_each_row_its_own(precision):
    """Every row count multiplies the quantized weights, and a row's product does not depend on the rows beside it
    (what makes a step of k rows verify as k steps of one); an output width off the int4 kernel's multiple of 16."""
    stacked = torch.randn(3, 64, 40, generator=torch.Generator().manual_seed(0))
    matrices = QuantizedMatrices(stacked, precision)
    for rows in (1, 5, 40):
        x = torch.randn(3, rows, 64)
        product = matrices(x)
        assert product.shape == (3, rows, 40) and product.dtype == torch.float32
        error = relative_error(product, torch.bmm(x, stacked))
        assert 0 < error < (0.03 if precision == "int8" else 0.15), (rows, error)
        assert all(torch.equal(matrices(x[:, i : i + 1])[:, 0], product[:, i]) for i in range(rows))


def narrow_model(n_future: int = 2) -> MTPModel:
    """A model 48 wide: not a multiple of int4's groups of 32."""
    config = ModelConfig(vocab_size=40, d_model=48, n_layers=n_future + 1, n_heads=4, n_kv_heads=2, n_future=n_future)
    return MTPModel(config).eval()


@pytest.fixture
def nothing_converted(monkeypatch):
    """Fails a test that converts any weight (a quantized stack made)."""

    def refused(*args, **kwargs):
        raise AssertionError("a weight was converted before the setting was refused")

    monkeypatch.setattr(QuantizedMatrices, "__init__", refused)


REFUSALS = {
    "cuda": "quantize=int8 runs PyTorch's weight-only CPU kernels, and the model is on cuda; decode on CPU, or leave "
    "quantize=none.",
    "float16": "quantize=int4 decodes float32 and bfloat16 models, and this one is float16; load it in float32 or "
    "bfloat16 (dtype), or leave quantize=none.",
    "width": "quantize=int4 quantizes groups of 32 inputs, and this model's width (d_model) 48 is not a multiple of "
    "32; use quantize=int8, or a model whose width and MLP width are.",
    "mlp": "quantize=int4 quantizes groups of 32 inputs, and this model's MLP width 120 is not a multiple of 32; use "
    "quantize=int8, or a model whose width and MLP width are.",
    "value": "quantize=int3 must be one of none, int8, int4.",
    "draft_dtype": "quantize=int8 quantizes every matrix, the drafts' included, and draft_dtype=int8 quantizes the "
    "drafts alone; leave draft_dtype=auto with it.",
}


def refused(name: str):
    return pytest.raises(SettingError, match=f"^{re.escape(REFUSALS[name])}$")


def test_quantize_where_the_kernels_do_not_run_is_one_sentence_before_any_weight_is_converted(nothing_converted):
    with refused("cuda"):
        StepSettings(quantize="int8").check_model(tiny_model().config, torch.device("cuda"), torch.float32)
    with refused("float16"):
        generate(tiny_model().half(), [[1, 2, 3]], Plan().changed(max_new_tokens=4, quantize="int4"))
    narrow = narrow_model()
    with refused("width"):
        generate(narrow, [[1, 2, 3]], Plan().changed(max_new_tokens=4, heads=2, quantize="int4"))
    with refused("mlp"):
        generate(tiny_model(ffn_multiple_of=40), [[1, 2, 3]], Plan().changed(max_new_tokens=4, quantize="int4"))
    drafter = draft_model_drafter(narrow_model(n_future=1))  # the target fits; its draft does not
    with refused("width"):
        generate(tiny_model(), [[1, 2, 3]], Plan(drafter=drafter).changed(max_new_tokens=4, quantize="int4"))
    with refused("value"):
        StepSettings(quantize="int3")
    with refused("draft_dtype"):
        Plan().changed(heads=2, quantize="int8", draft_dtype="int8")
    assert len(generate(narrow, [[1, 2, 3]], Plan().changed(max_new_tokens=2))[0][0]) == 2  # float decodes as before


@pytest.mark.slow
@pytest.mark.parametrize("precision", PRECISIONS)
def test_compiled_decoding_of_a_quantized_target_equals_its_eager_decoding(precision, counting_target):
    """Compiled, the quantized blocks run eager (compile does not see into the kernels): the same tokens."""
    reference = autoregressive(counting_target, RAGGED, 16, precision)
    plan = Plan().changed(max_new_tokens=16, heads=4, compile=True, quantize=precision)
    assert generate(counting_target, RAGGED, plan)[0] == reference
