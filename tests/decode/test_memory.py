"""A decoding step's memory: estimated from its shapes, refused in one sentence when it would not fit, before decoding
(the measuring tree of an 8-head model, 4 candidates under every node, once took a machine down)."""

from dataclasses import replace

import pytest
import torch

from mtp.decode import GenerationConfig, loop, memory, tree_fit
from mtp.decode.memory import available_bytes, check_step_fits, step_bytes
from mtp.decode.plan import Plan
from mtp.decode.settings import HeadsSettings
from mtp.decode.tree import full_tree
from mtp.errors import UserError
from mtp.model.config import ModelConfig
from tests.decode.helpers import tiny_model

BYTE8 = ModelConfig(vocab_size=320, d_model=192, n_layers=10, n_heads=6, n_kv_heads=2, n_future=8)
"""The byte8 checkpoint's shapes."""


def fitting_cache_length(nodes: int) -> int:
    """The cache length --tree auto decodes with: 64-token prompts, 64 new tokens, 7 drafts, a tree of ``nodes``."""
    return 64 + 64 + 2 * (7 + 1) + nodes


@pytest.fixture
def eighteen_gigabytes(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device: 18 * 10**9)


def test_the_full_measuring_tree_of_eight_heads_is_refused_in_one_sentence(eighteen_gigabytes):
    nodes = full_tree(4, 7).size
    assert nodes == 21844
    with pytest.raises(UserError) as refused:
        check_step_fits(BYTE8, 8, fitting_cache_length(nodes), nodes + 1, nodes, "cpu")
    message = str(refused.value)
    assert message.startswith("a decoding step over the 21,844-node draft tree at batch 8 needs about ")
    assert "GB (attention over 21,845 positions), more than half of the 18 GB this machine has available" in message
    assert message.endswith("use a tree of fewer nodes or a smaller batch.")
    assert "\n" not in message and message.count(". ") == 0


def test_a_sixteen_node_tree_and_a_long_prompt_fit(eighteen_gigabytes):
    check_step_fits(BYTE8, 8, fitting_cache_length(16), 17, 16, "cpu")
    check_step_fits(BYTE8, 1, 4096, 4000, 0, "cpu")  # a prompt's step


def test_the_estimate_counts_attention_logits_and_cache():
    need = step_bytes(BYTE8, batch_size=8, max_len=21988, step_positions=21845, tree_nodes=21844)
    assert need.attention == 8 * 6 * 21845 * 21988 * 4  # scores (B, n_heads, S, span), float32
    assert need.logits == 8 * 21845 * 320 * 4
    assert need.cache == 10 * 2 * 8 * 21988 * 2 * 32 * 4  # every block's keys and values
    assert need.total > 100 * 10**9
    half = step_bytes(BYTE8, 8, 21988, 21845, 21844, dtype=torch.bfloat16).cache
    assert half == need.cache // 2
    causal = replace(BYTE8, head_type="causal")
    assert step_bytes(causal, 8, 100, 8).cache == need.cache * 100 // 21988 + 7 * 8 * 100 * 192 * 4  # hidden states


def test_a_chain_or_a_prompt_is_named_as_positions_and_a_gpu_by_its_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2 * 10**9, 80 * 10**9))
    refusal = r"over 30,000 positions per row at batch 4 .* half of the 2.0 GB cuda has free; use shorter prompts"
    with pytest.raises(UserError, match=refusal + ", fewer drafts or a smaller batch.$"):
        check_step_fits(BYTE8, 4, 30000, 30000, 0, "cuda")


def test_the_available_memory_is_read_here():
    available = available_bytes(torch.device("cpu"))
    assert available is None or available > 0
    assert available_bytes(torch.device("meta")) is None  # unknown: nothing is refused
    check_step_fits(BYTE8, 8, 10**6, 10**6, 0, "meta")


def test_fitting_refuses_before_decoding_when_the_measuring_step_does_not_fit(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device: 10**6)
    decoded = []
    monkeypatch.setattr(loop.InferenceModel, "of", lambda *args: decoded.append(args))  # what decoding starts with
    with pytest.raises(UserError, match="256-node draft tree at batch 2"):
        tree_fit.fit_to_model(
            tiny_model(n_future=8), [[1, 2], [3]], 16, Plan(GenerationConfig(8), heads=HeadsSettings(heads=8))
        )
    assert not decoded


def test_a_prompts_step_is_sized_by_the_logits_it_reads_its_last_position(monkeypatch):
    """The prompts' step reads head 1's logits at each row's last position only: a wide batch of long prompts over a
    large vocabulary decodes where logits at every prompt position would not fit (the GPU heads recipe's distillation,
    161-token prompts x 1,024 rows x 49,152 tokens, was refused for 43 GB of logits it never computes)."""
    model, prompts = tiny_model(vocab_size=4000), [[1 + (i * 7 + j) % 3000 for j in range(60)] for i in range(8)]
    every = step_bytes(model.config, 8, 80, 60)  # logits at all 60 positions: 8 x 60 x 4000 x 4 bytes
    last = step_bytes(model.config, 8, 80, 60, logit_positions=1)
    assert every.logits == 60 * last.logits == 8 * 60 * 4000 * 4
    drafting = step_bytes(model.config, 8, 80, 4)
    available = 2 * max(last.total, drafting.total) + 1  # half of it holds the prompts' and the drafting steps
    assert 2 * every.total > available
    monkeypatch.setattr(memory, "available_bytes", lambda device: available)
    outputs, _ = loop.generate(model, prompts, Plan(GenerationConfig(8), HeadsSettings(heads=4)))
    assert all(len(row) == 8 for row in outputs)
    with pytest.raises(UserError, match=r"over 60 positions per row at batch 8 .*\(logits of 60 positions\)"):
        check_step_fits(model.config, 8, 80, 60, 0, "cpu")  # every position's logits: refused, and said so
