"""int8 drafting on CPU (``draft_dtype="int8"``): the draft side (heads of every type, a draft model, layer skip) runs
int8 matrices while head 1 verifies at full precision, so greedy output equals autoregressive output and sampling stays
lossless; the int8 matrices are really the ones drafting, and their logits are close to full precision's."""

import functools

import pytest
import torch

from mtp.decode import GenerationConfig, generate
from mtp.decode.inference import ATTENTION, FEED_FORWARD, InferenceModel
from mtp.decode.int8 import MAX_ROWS, Int8Matrices, Int8Unembedding
from mtp.decode.methods.draft_model import draft_model_drafter
from mtp.decode.methods.layer_skip import layer_skip_drafter
from mtp.decode.methods.prompt_lookup import LookupDrafter
from mtp.decode.plan import Plan
from mtp.decode.settings import DraftSettings, HeadsSettings
from mtp.errors import SettingError
from tests.decode.helpers import HEAD_TYPES, tiny_model, train_on_cycles
from tests.decode.test_generate import RAGGED
from tests.decode.test_lossless import check_real_model
from tests.decode.test_tree import partly_trained

INT8 = {"draft_dtype": "int8"}
partly_trained_once = functools.cache(partly_trained)
PROMPTS = {"batch1": [[5, 6, 7]], "ragged": RAGGED}


def slow_int8_case(batch: str, head_type: str) -> bool:
    # causal-shared drafts as causal does; medusa heads unembed with their own outputs as linear ones do
    return (batch == "batch1" and head_type != "transformer") or head_type in ("causal-shared", "medusa")


def autoregressive(model, prompts, max_new_tokens: int) -> list[list[int]]:
    return generate(model, prompts, Plan(GenerationConfig(max_new_tokens)))[0]


@pytest.mark.parametrize(  # one prompt alone on the other head types with the slow tests: everyday in ragged batches
    ("head_type", "prompts"),
    [
        pytest.param(
            head_type,
            prompts,
            id=f"{batch}-{head_type}",
            marks=[pytest.mark.slow] if slow_int8_case(batch, head_type) else [],
        )
        for batch, prompts in PROMPTS.items()
        for head_type in HEAD_TYPES
    ],
)
def test_greedy_with_int8_heads_equals_autoregressive(head_type, prompts, trained_models):
    """A random model (drafts almost all rejected), a trained one (drafts accepted), a reduced draft vocabulary."""
    # linear heads partly trained (drafts pass 50-80%): the other types reuse test_generate's trained models
    trained = partly_trained_once(head_type) if head_type == "linear" else trained_models(head_type)
    for model in (tiny_model(**HEAD_TYPES[head_type]), trained):
        reference = autoregressive(model, prompts, 30)
        for heads in (2, 4):
            out, stats = generate(model, prompts, Plan().changed(max_new_tokens=30, heads=heads, **INT8))
            assert out == reference, f"heads={heads}"
            assert stats.drafted[0] > 0
    assert stats.acceptance[0] > 0.5  # the trained model: the accepting branch ran
    reduced = tiny_model(draft_vocab=20, **HEAD_TYPES[head_type])
    out, _ = generate(reduced, prompts, Plan().changed(max_new_tokens=30, heads=4, **INT8))
    assert out == autoregressive(reduced, prompts, 30)


@pytest.fixture(scope="module")
def counting_target():
    return partly_trained("transformer")


def int8_drafter(method: str, target):
    if method == "draft":
        return draft_model_drafter(train_on_cycles(tiny_model(n_future=1, vocab_size=40, seed=7), steps=15))
    if method == "sublayers":  # block 0's MLP alone (its attention skipped), blocks 1 and 2's attention alone
        return layer_skip_drafter(target, frozenset({(0, ATTENTION), (1, FEED_FORWARD), (2, FEED_FORWARD)}))
    return layer_skip_drafter(target, frozenset({1}))


@pytest.mark.parametrize("method", ["draft", "layerskip", "sublayers"])
@pytest.mark.parametrize("prompts", PROMPTS.values(), ids=PROMPTS.keys())
def test_greedy_with_an_int8_drafter_equals_autoregressive(method, prompts, counting_target):
    reference = autoregressive(counting_target, prompts, 40)
    drafter = int8_drafter(method, counting_target)
    for gamma, decoding in ((3, {}), (4, dict(adaptive_drafts=True))):
        drafter.gamma = gamma
        out, stats = generate(
            counting_target, prompts, Plan(drafter=drafter).changed(max_new_tokens=40, **decoding, **INT8)
        )
        assert out == reference, decoding
        assert 0 < sum(stats.accepted) < sum(stats.drafted)
    # the same drafter in full precision afterwards: its own form, and the target's, were left as they were
    out, _ = generate(counting_target, prompts, Plan(GenerationConfig(40), drafter=drafter.with_gamma(3)))
    assert out == reference and autoregressive(counting_target, prompts, 40) == reference


def test_int8_sampling_stays_lossless():
    """The total-variation check against the exact joint of head 1's sampling, on a random model whose every context
    changes the logits, with int8 heads and an int8 layer-skip draft."""
    model = tiny_model(n_future=3, vocab_size=4, seed=3)
    with torch.no_grad():
        model.heads.outputs[0].weight.mul_(60)  # peaked distributions, so that drafts disagree with head 1
    stats = check_real_model(model, Plan().changed(max_new_tokens=3, temperature=1.0, heads=3, seed=11, **INT8))
    assert 0 < sum(stats.accepted) < sum(stats.drafted)
    drafted = Plan(drafter=layer_skip_drafter(model, frozenset({0}), gamma=2))
    stats = check_real_model(model, drafted.changed(max_new_tokens=4, temperature=1.0, seed=5, **INT8))
    assert 0 < sum(stats.accepted) < sum(stats.drafted)


def int8_parts(*objects) -> set[Int8Matrices]:
    """Every Int8Matrices held by these objects, their attributes, lists and Int8Unembeddings."""
    found, seen = set(), set()

    def visit(thing) -> None:
        if id(thing) in seen:
            return
        seen.add(id(thing))
        if isinstance(thing, Int8Matrices):
            found.add(thing)
        elif isinstance(thing, Int8Unembedding):
            visit(thing.matrix)
        elif isinstance(thing, list | tuple):
            for item in thing:
                visit(item)
        elif hasattr(thing, "__dict__") and not isinstance(thing, torch.Tensor | InferenceModel):
            for name, value in vars(thing).items():
                if name != "_quantized":  # a float part's memo of its quantized copies
                    visit(value)

    for thing in objects:
        visit(thing)
    return found


@pytest.fixture
def calls(monkeypatch) -> set[Int8Matrices]:
    """The int8 matrices multiplied while the test runs."""
    called = set()
    multiply = Int8Matrices.__call__

    def recorded(self, x):
        called.add(self)
        return multiply(self, x)

    monkeypatch.setattr(Int8Matrices, "__call__", recorded)
    return called


@pytest.mark.parametrize("head_type", HEAD_TYPES)
def test_int8_heads_draft_with_int8_weights_and_verify_at_full_precision(head_type, calls):
    model = tiny_model(draft_vocab=20 if head_type == "transformer" else 0, **HEAD_TYPES[head_type])
    full, int8 = InferenceModel.of(model, 4), InferenceModel.of(model, 4, draft_dtype="int8")
    assert int8 is InferenceModel.of(model, 4, draft_dtype="int8") and int8.draft_dtype == "int8"
    assert int8.path is full.path and int8.head1_output is full.head1_output  # the verification, shared and float
    assert all(not blocks.quantized and blocks.qkv.dtype == torch.float32 for blocks in int8.path)
    parts = int8_parts(int8.drafter, int8.draft_output)
    assert parts and not int8_parts(full.drafter, full.draft_output, full.path, full.head1_output)
    assert all(w.dtype == torch.int8 for m in parts for w in m.weights())
    kernels = {m.kernel for m in parts}
    assert kernels == ({"fbgemm"} if head_type == "linear" else {"fbgemm", "weight_only"})  # unembeddings; blocks
    generate(model, RAGGED, Plan().changed(max_new_tokens=8, heads=4, **INT8))
    assert calls == parts  # every int8 matrix drafts, and nothing else is int8


@pytest.mark.parametrize("method", ["draft", "layerskip"])
def test_int8_drafters_draft_with_int8_weights_and_leave_the_target_alone(method, counting_target, calls):
    drafter = int8_drafter(method, counting_target)
    drafter.gamma = 3  # this drafter, whose forms are looked at after
    generate(counting_target, RAGGED, Plan(drafter=drafter).changed(max_new_tokens=8, **INT8))
    parts = int8_parts(drafter.drafting.path, drafter.drafting.head1_output)
    assert len(parts) == 4 * len(drafter.drafting.path) + 1  # q/k/v, output, gate/up, down; the unembedding
    assert calls == parts
    target = InferenceModel.of(counting_target, 1)
    assert not int8_parts(target.path, target.head1_output, drafter.form.path, drafter.form.head1_output)
    assert all(blocks.qkv.dtype == torch.float32 for blocks in target.path)


@torch.inference_mode()
def step_logits(form: InferenceModel, prompts: list[list[int]]) -> torch.Tensor:
    """Head 1's logits after the prompts (B, V) and the draft heads' (h, B, V), the drafts fixed to token 0 so that a
    causal chain's later depths read the same tokens in every form."""
    tokens = torch.tensor(prompts)
    B, S = tokens.shape
    cache = form.new_cache(B, 64)
    cache.begin(S)
    head1, hidden = form.verify(tokens, cache)
    if form.drafter is None:
        return head1[:, -1]
    drafts = []

    def choose(logits, first):
        drafts.append(logits)
        return torch.zeros(logits.shape[:2], dtype=torch.long)

    form.draft(hidden, cache, torch.full((B,), S - 1), tokens, torch.zeros(B, dtype=torch.long), choose)
    return torch.cat([head1[:, -1][None], *drafts])


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    finite = b.isfinite()  # a reduced draft vocabulary leaves -inf outside it
    assert torch.equal(finite, a.isfinite())
    return float((a[finite] - b[finite]).norm() / b[finite].norm())


@pytest.mark.parametrize("head_type", HEAD_TYPES)
def test_int8_draft_logits_are_close_to_full_precision(head_type):
    model = tiny_model(draft_vocab=20 if head_type == "medusa" else 0, **HEAD_TYPES[head_type])
    prompts = [[5, 6, 7, 8], [1, 2, 30, 4]]
    full = step_logits(InferenceModel.of(model, 4), prompts)
    int8 = step_logits(InferenceModel.of(model, 4, draft_dtype="int8"), prompts)
    assert torch.equal(int8[0], full[0])  # head 1: the same computation
    error = relative_error(int8[1:], full[1:])
    assert 0 < error < 0.05, error


@pytest.mark.parametrize("method", ["draft", "layerskip", "sublayers"])
def test_int8_drafter_logits_are_close_to_full_precision(method, counting_target):
    form = int8_drafter(method, counting_target).form
    full = step_logits(form, [[5, 6, 7, 8], [1, 2, 30, 4]])
    error = relative_error(step_logits(form.int8_drafter(), [[5, 6, 7, 8], [1, 2, 30, 4]]), full)
    assert 0 < error < 0.05, error


@pytest.mark.parametrize("kernel", ["weight_only", "fbgemm"])
def test_int8_products_are_close_to_float_and_many_rows_multiply_the_float_matrices(kernel):
    stacked = torch.randn(3, 32, 48, generator=torch.Generator().manual_seed(0))
    matrices = Int8Matrices(stacked, kernel)
    for rows in (1, 5, MAX_ROWS[kernel]):
        x = torch.randn(3, rows, 32)
        error = relative_error(matrices(x), torch.bmm(x, stacked))
        assert 0 < error < 0.03, (rows, error)
    many = torch.randn(3, MAX_ROWS[kernel] + 1, 32)
    assert torch.equal(matrices(many), torch.bmm(many, stacked))  # a prompt's step: float
    torch.testing.assert_close(matrices.dequantized(), stacked, atol=stacked.abs().max().item() / 254, rtol=0)


def test_int8_drafting_is_refused_where_it_means_nothing(counting_target):
    with pytest.raises(SettingError, match="draft_dtype=int8 quantizes the drafts, but heads=1 without a drafter"):
        generate(counting_target, [[1, 2, 1]], Plan().changed(max_new_tokens=8, **INT8))
    with pytest.raises(SettingError, match="draft_dtype=int4 must be one of auto, int8"):
        Plan(GenerationConfig(8), heads=HeadsSettings(heads=2), drafts=DraftSettings(draft_dtype="int4"))
    with pytest.raises(SettingError, match="prompt lookup drafts without a model"):
        generate(
            counting_target,
            [[1, 2, 1]],
            Plan(drafter=LookupDrafter(1, 40, "cpu", gamma=2)).changed(max_new_tokens=8, **INT8),
        )
    with pytest.raises(SettingError, match="int8 CPU kernels, and the model is on cuda; decode on CPU"):
        Plan().changed(max_new_tokens=8, heads=2, **INT8).check_device(torch.device("cuda"))
    Plan().changed(max_new_tokens=8, heads=2, **INT8).check_device(torch.device("cpu"))


@pytest.mark.slow
def test_compiled_decoding_with_int8_drafts_equals_autoregressive(counting_target):
    """Compiled, the float blocks run compiled and the int8 ones eager, in one step (heads) or apart (layer skip)."""
    reference = autoregressive(counting_target, RAGGED, 16)
    out, _ = generate(counting_target, RAGGED, Plan().changed(max_new_tokens=16, heads=4, compile=True, **INT8))
    assert out == reference
    drafter = layer_skip_drafter(counting_target, frozenset({1}), compile=True, gamma=3)
    out, _ = generate(counting_target, RAGGED, Plan(drafter=drafter).changed(max_new_tokens=16, compile=True, **INT8))
    assert out == reference
