"""An independent reference for the model: every head path equals transformers' LlamaForCausalLM with the same weights.

Causality and cached-versus-full tests cannot see a wrong position encoding or a wrong block, since both
sides of them run the same code; Hugging Face's Llama is an implementation nobody here wrote.
"""

import pytest
import torch

from mtp.interop.llama import head_path_state_dict, llama_config
from mtp.model import MTPModel
from mtp.model.config import ModelConfig

transformers = pytest.importorskip(
    "transformers", reason="the Hugging Face reference needs transformers: pip install -e '.[hf]'"
)

CASES = {
    "transformer_heads": dict(head_type="transformer", n_layers=6, rope_theta=10000.0),
    "linear_heads": dict(head_type="linear", n_layers=3, rope_theta=500.0),
}


def reference_model(model: MTPModel, k: int):
    """transformers' LlamaForCausalLM holding head k's path of ``model`` (eager attention, fp32)."""
    config = transformers.LlamaConfig(**llama_config(model.config), attn_implementation="eager")
    reference = transformers.LlamaForCausalLM(config).eval()
    reference.load_state_dict(head_path_state_dict(model, k), strict=True)
    return reference


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_every_head_path_equals_hugging_face_llama(case):
    torch.manual_seed(0)
    # init_std 0.1 at width 64 makes attention peaked, so that positions and blocks visibly matter
    config = ModelConfig(
        vocab_size=101, d_model=64, n_heads=4, n_kv_heads=2, n_future=3, init_std=0.1, max_seq_len=64, **case
    )
    model = MTPModel(config).eval()
    with torch.no_grad():  # norms away from 1, so that a norm applied in the wrong place shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    tokens = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(tokens)  # (3, 2, 40, 101)
        for k in range(1, 4):
            theirs = reference_model(model, k)(tokens).logits
            torch.testing.assert_close(ours[k - 1], theirs, rtol=1e-5, atol=1e-5, msg=f"head {k}")
    assert ours.std() > 0.5  # logits far from zero: an absolute tolerance of 1e-5 is a tight check


def test_mapping_covers_every_parameter_of_a_head_path():
    model = MTPModel(ModelConfig(vocab_size=11, d_model=16, n_layers=4, n_heads=2, n_kv_heads=1, n_future=2))
    used = {id(t) for k in (1, 2) for t in head_path_state_dict(model, k).values()}
    assert used == {id(p) for p in model.parameters()}
