"""Captured steps (mtp.decode.graphs) on CPU: the graphs' plumbing under a stand-in that replays by rerunning the step
on the buffers a graph owns (the same contract as a CUDA graph: inputs read from those buffers only, outputs
overwritten at each replay). tests/test_gpu.py runs the same promises with real CUDA graphs."""

import pytest
import torch

from mtp.decode import GenerationConfig, generate, inference
from mtp.decode import graphs as graphs_module
from mtp.decode.inference import InferenceModel
from mtp.decode.plan import Plan
from mtp.decode.settings import HeadsSettings, StepSettings
from mtp.decode.tree import DraftTree, full_tree
from mtp.errors import SettingError
from tests.decode.helpers import tiny_model

PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [20], [3, 4]]


@pytest.fixture
def rerun_on_cpu(monkeypatch):
    """Steps captured on CPU by the stand-in, and attention spans in buckets of 8 there, as on CUDA (of 128)."""
    monkeypatch.setitem(graphs_module.CAPTURES, "cpu", graphs_module.Rerun)
    monkeypatch.setitem(inference.SPAN_MULTIPLE, "cpu", 8)


def decode(model, config, prompts=PROMPTS):
    eager, eager_stats = generate(model, prompts, config)
    captured, stats = generate(model, prompts, config.changed(cuda_graphs=True))
    return eager, captured, eager_stats, stats


def configs(heads: int, tree: DraftTree | None = None) -> list[GenerationConfig]:
    # max_new_tokens 40 crosses span buckets of 8 (set below); rows end at different steps (eos 0 in sampling)
    return [
        Plan(GenerationConfig(max_new_tokens=40), heads=HeadsSettings(heads=heads, tree=tree)),
        Plan(
            GenerationConfig(max_new_tokens=40, temperature=1.0, seed=3, eos_id=0),
            heads=HeadsSettings(heads=heads, tree=tree),
        ),
    ]


@pytest.mark.parametrize("head_type", ["transformer", "eagle3", pytest.param("causal", marks=pytest.mark.slow)])
def test_captured_steps_decode_what_eager_steps_do(trained_models, head_type, rerun_on_cpu):
    """Greedy and sampled (same seed), autoregressive, chains and a tree, a batch whose rows accept different drafts
    and end at different steps: the same tokens and acceptance as eager steps, with steps captured and replayed."""
    for model in (trained_models(head_type), tiny_model(seed=2, vocab_size=24)):
        tree = full_tree(2, 2) if head_type == "transformer" else None
        for config in configs(1) + configs(4) + (configs(3, tree) if tree else []):
            eager, captured, eager_stats, stats = decode(model, config)
            assert captured == eager, config
            assert stats.accepted == eager_stats.accepted and stats.forwards == eager_stats.forwards
            assert stats.captures > 0 and stats.capture_s > 0 or config.temperature  # sampling may replay all


def test_a_second_call_replays_the_first_calls_graphs(rerun_on_cpu):
    """The cache's storage is the form's, so a call on prompts of nearby lengths captures nothing new, and a batch
    that loses rows keeps them in the same storage's first rows: a second call replays every batch size."""
    model = tiny_model(seed=4, vocab_size=24)  # its own: forms (and their graphs) are kept per model
    config = Plan(
        GenerationConfig(max_new_tokens=12), heads=HeadsSettings(heads=4), step=StepSettings(cuda_graphs=True)
    )
    first, stats = generate(model, PROMPTS[:1], config)
    again, replayed = generate(model, [PROMPTS[0][:2]], config)
    assert stats.captures > 0 and replayed.captures == 0
    assert (
        again == generate(model, [PROMPTS[0][:2]], Plan(GenerationConfig(max_new_tokens=12), HeadsSettings(heads=4)))[0]
    )
    graphs = InferenceModel.of(model, 4, cuda_graphs=True).graphs
    ragged = Plan(
        GenerationConfig(max_new_tokens=30, temperature=1.0, eos_id=0, seed=5),
        heads=HeadsSettings(heads=4),
        step=StepSettings(cuda_graphs=True),
    )
    first, stats = generate(model, PROMPTS, ragged)
    assert stats.row_forwards < stats.forwards * len(PROMPTS)  # rows left the batch
    again, replayed = generate(model, PROMPTS, ragged)
    assert again == first and stats.captures > 0 and replayed.captures == 0
    assert {key[1] for key in graphs.graphs} <= {keys.data_ptr() for keys, _ in graphs.storage.values()}


def test_captured_steps_need_a_device_that_captures(trained_model):
    with pytest.raises(SettingError, match="cuda_graphs captures steps as CUDA graphs, and the model is on cpu"):
        generate(
            trained_model,
            PROMPTS,
            Plan(GenerationConfig(), heads=HeadsSettings(heads=2), step=StepSettings(cuda_graphs=True)),
        )


def test_a_replay_reads_the_step_from_the_graphs_buffers(rerun_on_cpu):
    """A graph's outputs are overwritten at the next replay, and what it reads is only what was copied in."""
    graphs = graphs_module.StepGraphs(torch.device("cpu"))
    model = tiny_model(n_future=1)
    form = InferenceModel.of(model, 1)
    cache = form.new_cache(1, 16)
    cache.begin(1)
    step = graphs.run("verify", form._verify, cache, torch.tensor([[3]]), None)
    first = step[0].clone()
    cache.commit(1)
    cache.begin(1)
    again = graphs.run("verify", form._verify, cache, torch.tensor([[4]]), None)
    assert again[0] is step[0] and not torch.equal(first, again[0])
    assert graphs.captures == 1


def test_graphs_go_with_the_storage_they_replay_on(rerun_on_cpu, monkeypatch):
    """A form keeps the storages of its last KEPT_STORAGES cache shapes; the graphs of one it drops go with it."""
    monkeypatch.setattr(graphs_module, "KEPT_STORAGES", 1)
    model = tiny_model(seed=5, vocab_size=24)
    config = Plan(GenerationConfig(max_new_tokens=6), heads=HeadsSettings(heads=2), step=StepSettings(cuda_graphs=True))
    graphs = InferenceModel.of(model, 2, cuda_graphs=True).graphs
    for batch in (1, 2):
        generate(model, PROMPTS[:batch], config)
    ((keys, _),) = graphs.storage.values()
    assert keys.size(1) == 2 and {key[1] for key in graphs.graphs} == {keys.data_ptr()}


def test_a_second_generate_call_at_the_same_time_is_refused(rerun_on_cpu):
    """Captured steps replay on the form's cache storage: a call while another decodes (a thread) would overwrite it."""
    model = tiny_model(seed=6, vocab_size=24)
    config = Plan(GenerationConfig(max_new_tokens=4), heads=HeadsSettings(heads=2), step=StepSettings(cuda_graphs=True))
    graphs = InferenceModel.of(model, 2, cuda_graphs=True).graphs
    graphs.claim()  # as a call running in another thread would
    with pytest.raises(RuntimeError, match="already decoding with cuda_graphs in another generate call"):
        generate(model, PROMPTS, config)
    graphs.release()
    generate(model, PROMPTS, config)
    assert not graphs.decoding  # released when the call ends
