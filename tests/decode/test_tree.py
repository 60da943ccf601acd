"""Draft trees: their structure, greedy tree decoding equal to greedy autoregressive decoding for every head type
(rows accepting paths through lower-ranked candidates, at ragged depths), and fitting a tree from rank counts."""

import itertools
import json
from collections import Counter

import pytest
import torch

from mtp.decode import GenerationConfig, generate, inference, tree_fit
from mtp.decode.plan import Plan
from mtp.decode.settings import HeadsSettings
from mtp.decode.stats import DecodeStats
from mtp.decode.tree import DraftTree, fit_tree, full_tree, path_counts, ranked_tree, read_tree
from mtp.errors import UserError
from tests.decode.helpers import HEAD_TYPES, tiny_model, train_on_cycles

TREE = DraftTree([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (1, 1), (0, 0, 0), (0, 0, 1), (2, 0), (1, 0, 0)])


def test_tree_structure():
    tree = DraftTree([(1,), (0, 0), (0,), (1, 0)])  # any order: nodes follow depth, then ranks
    assert tree.paths == [(0,), (1,), (0, 0), (1, 0)]
    assert tree.parent == [0, 0, 0, 1, 2]
    assert tree.node_depth == [0, 1, 1, 2, 2]
    assert tree.ranks_at_depth == [2, 1]
    assert tree.ancestors[4] == [0, 2, 4] and tree.ancestors[1] == [0, 1, 1]
    attends = tree.tensors(torch.device("cpu"))["attends"]
    expected = torch.tensor(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]], dtype=torch.bool
    )
    assert torch.equal(attends, expected)
    candidates = [torch.tensor([[7, 8]]), torch.tensor([[9]])]  # depth 1: ranks 0, 1; depth 2: rank 0
    assert tree.node_tokens(candidates).tolist() == [[7, 8, 9, 9]]
    assert DraftTree.chain(3).paths == [(0,), (0, 0), (0, 0, 0)]
    with pytest.raises(ValueError, match="no parent"):
        DraftTree([(0,), (1, 0)])


def partly_trained(head_type: str):
    """A model whose drafts are right often but not always, and often at a lower rank: trees pay off unevenly."""
    steps = 40 if head_type == "eagle3" else 20  # its one layer learns every depth's offset from the states it reads
    model = train_on_cycles(tiny_model(n_future=4, vocab_size=40, seed=1, **HEAD_TYPES[head_type]), steps=steps)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    return model


@pytest.mark.parametrize("head_type", HEAD_TYPES)
def test_greedy_tree_decoding_equals_autoregressive(head_type, monkeypatch):
    # head 1 unembedded after every node at once, or after the nodes with children and then the accepted one
    monkeypatch.setattr(inference, "LEAVES_UNEMBEDDED_AT_ONCE", 100 if head_type in ("linear", "medusa") else 0)
    model = partly_trained(head_type)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 40, (n,), generator=generator).tolist() for n in (5, 2, 9, 3)]
    reference, _ = generate(model, prompts, Plan(GenerationConfig(24), HeadsSettings(heads=1)))
    for decoding in (dict(tree=TREE), dict(tree=TREE, draft_p_min=0.2), dict(adaptive_drafts=True)):
        out, stats = generate(model, prompts, Plan().changed(max_new_tokens=24, heads=4, **decoding))
        assert out == reference, decoding
        assert 0 < stats.accepted[-1] < stats.drafted[-1]  # the deepest drafts pass at some steps only
    alone, _ = generate(model, prompts[1:2], Plan(GenerationConfig(24), HeadsSettings(heads=4, tree=TREE)))
    assert alone == reference[1:2]


def test_typical_acceptance_leaves_greedy_decoding_exact():
    model = partly_trained("transformer")
    reference, _ = generate(model, [[3, 4, 5]], Plan(GenerationConfig(16), heads=HeadsSettings(heads=1)))
    out, stats = generate(
        model, [[3, 4, 5]], Plan(GenerationConfig(16, acceptance="typical"), heads=HeadsSettings(heads=4, tree=TREE))
    )
    assert out == reference
    assert "tree_nodes=11 acceptance=greedy" in stats.line()  # what ran, not what was asked


def test_path_counts_and_the_fitted_tree():
    measuring = full_tree(2, 3)
    ended_at = [(0, 0, 1), (0, 1), (1, 0, 0), (0, 0), ()]  # the accepted path of five row-steps
    counts = path_counts(measuring, Counter(measuring.paths.index(p) + 1 if p else 0 for p in ended_at))
    assert counts == Counter({(0,): 3, (0, 0): 2, (0, 0, 1): 1, (0, 1): 1, (1,): 1, (1, 0): 1, (1, 0, 0): 1})
    tree, expected = fit_tree(counts, positions=5, nodes=3, depth=3)
    assert tree.paths == [(0,), (1,), (0, 0)]  # (0, 0) and (0,) first; then the shallowest of the count-1 paths
    assert expected == pytest.approx((3 + 2 + 1) / 5)
    shallow, _ = fit_tree(counts, positions=5, nodes=10, depth=1)
    assert shallow.paths == [(0,), (1,)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[0], [0, 0", "is not valid JSON"),
        ('{"paths": [[0], ["a"]]}', "a list of integer ranks"),
        ('{"paths": [[0], [1, 0]]}', "has no parent"),
        ('{"paths": [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]}', "reaches depth 4"),
        ('{"paths": [[0], [40]]}', "rank 40 but the vocabulary has 40"),
    ],
)
def test_bad_tree_files_are_one_sentence(tmp_path, text, message):
    path = tmp_path / "tree.json"
    path.write_text(text)
    with pytest.raises(UserError, match=message):
        read_tree(path, drafts=3, vocab_size=40)


def test_a_tree_file_round_trips(tmp_path):
    path = tmp_path / "tree.json"
    path.write_text(TREE.to_json(expected_accepted=1.5))
    assert read_tree(path, drafts=3, vocab_size=40) == TREE


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_the_ranked_tree_keeps_to_its_budget_and_takes_the_lowest_rank_sums(width):
    for depth in range(1, 9):
        every = [p for d in range(1, depth + 1) for p in itertools.product(range(width), repeat=d)]
        for budget in (1, 7, 100, 256):
            tree = ranked_tree(width, depth, budget)
            assert tree.size == min(budget, len(every)), (depth, budget)
            assert tree.depth <= depth and max(max(p) for p in tree.paths) < width
            kept = set(tree.paths)
            for p in tree.paths:  # a parent, and an earlier sibling: children are tried in rank order
                assert len(p) == 1 or p[:-1] in kept
                assert p[-1] == 0 or (*p[:-1], p[-1] - 1) in kept
            left_out = [sum(p) for p in every if p not in kept]
            assert not left_out or max(map(sum, kept)) <= min(left_out), (depth, budget)


def test_the_ranked_tree_is_the_full_tree_when_that_fits():
    assert ranked_tree(4, 3, 256) == full_tree(4, 3)  # 84 nodes: 4-head models are measured as before
    assert ranked_tree(4, 3, 84) == full_tree(4, 3)
    assert ranked_tree(4, 3, 83) != full_tree(4, 3)
    assert ranked_tree(2, 5, 1000) == full_tree(2, 5)
    assert ranked_tree(4, 7, 7) == DraftTree.chain(7)  # rank sum 0: the chain of top candidates
    with pytest.raises(ValueError, match="at least 1"):
        ranked_tree(4, 3, 0)


def measuring_trees(monkeypatch) -> list[DraftTree]:
    """The trees :func:`tree_fit.fit_to_model` decodes with, recorded as it calls generate."""
    seen = []

    def recording(model, prompts, config):
        seen.append(config.heads.tree)
        return generate(model, prompts, config)

    monkeypatch.setattr(tree_fit, "generate", recording)
    return seen


def test_fitting_four_heads_measures_with_the_full_tree(monkeypatch):
    seen = measuring_trees(monkeypatch)
    fitted = tree_fit.fit_to_model(
        partly_trained("transformer"),
        [[3, 4, 5], [9, 1]],
        6,
        Plan(GenerationConfig(12), heads=HeadsSettings(heads=4)),
    )
    assert seen == [full_tree(4, 3)]
    assert 1 <= fitted.tree.size <= 6 and fitted.steps > 0


def test_fitting_eight_heads_measures_with_a_bounded_tree(monkeypatch):
    seen = measuring_trees(monkeypatch)
    model = tiny_model(n_future=8, vocab_size=40, seed=2)
    fitted = tree_fit.fit_to_model(
        model, [[3, 4, 5], [9, 1, 7, 2]], 16, Plan(GenerationConfig(8), heads=HeadsSettings(heads=8))
    )
    assert [t.size for t in seen] == [tree_fit.MEASURE_NODES]  # not 4 + 16 + ... + 4^7 = 21,844
    assert seen[0].depth == 7
    assert 1 <= fitted.tree.size <= 16 and fitted.tree.depth <= 7


def test_nondecreasing_pools_a_timing_spike_with_its_neighbours():
    assert tree_fit.nondecreasing([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert tree_fit.nondecreasing([5.0, 4.0, 3.0]) == [4.0, 4.0, 4.0]
    assert tree_fit.nondecreasing([1.0, 2.0, 2.0, 7.0]) == [1.0, 2.0, 2.0, 7.0]
    assert tree_fit.nondecreasing([2.0, 9.0, 1.0, 3.0, 10.0]) == [2.0, 13 / 3, 13 / 3, 13 / 3, 10.0]
    assert tree_fit.nondecreasing([]) == []


def timed_by(monkeypatch, step_ms) -> list[DraftTree | None]:
    """fit_to_model with its timing runs given step times: ``step_ms(tree)`` ms a step (tree None: the chain); the
    measuring run decodes for real. Returns the trees timed, in order."""
    timed = []

    def fake(model, prompts, config):
        tree = config.heads.tree
        if tree is not None and tree.size > max(tree_fit.FASTEST_SIZES):  # the measuring tree
            return generate(model, prompts, config)
        timed.append(tree)
        assert len(prompts) == 1 and config.sampling.max_new_tokens == 12  # batch 1, no longer than the fitting's
        return None, DecodeStats(rows=1, forwards=11, wall_time_s=step_ms(tree) / 100, prefill_s=0.0)

    monkeypatch.setattr(tree_fit, "generate", fake)
    return timed


@pytest.mark.parametrize("chain_ms", [1.0, 1e6])
def test_a_fastest_fit_takes_the_size_with_the_most_expected_tokens_per_ms(monkeypatch, chain_ms):
    """Trees cost 1 ms plus 0.5 ms a node: the fit keeps the size with the best expected tokens per ms, every size
    and the chain timed in each round; a chain at 1 ms a step beats every tree (decode without one)."""
    timed = timed_by(monkeypatch, lambda tree: chain_ms if tree is None else 1 + 0.5 * tree.size)
    model, prompts = partly_trained("transformer"), [[3, 4, 5], [9, 1], [7, 7, 2]]
    fitted = tree_fit.fit_to_model(
        model, prompts, tree_fit.FASTEST, Plan(GenerationConfig(12), heads=HeadsSettings(heads=4))
    )
    sizes = [t.nodes for t in fitted.trials]
    assert sizes == sorted(set(sizes)) and sizes[0] == 1 and len(sizes) > 2
    assert len(timed) == tree_fit.TIMING_ROUNDS * (len(sizes) + 1) and timed.count(None) == tree_fit.TIMING_ROUNDS
    for trial in fitted.trials:
        assert trial.ms_per_step == pytest.approx(1 + 0.5 * trial.nodes)
    best = max(fitted.trials, key=lambda t: t.expected_tokens / (1 + 0.5 * t.nodes))
    assert fitted.tree.size == best.nodes and 1 + fitted.expected_accepted == pytest.approx(best.expected_tokens)
    assert fitted.chain.nodes == 3 and fitted.chain.ms_per_step == pytest.approx(chain_ms)
    assert fitted.chain_faster == (chain_ms == 1.0)
    assert ("faster than any tree" in fitted.summary()) == (chain_ms == 1.0)
    assert json.loads(fitted.to_json())["sizes_tried"][0][0] == 1


def test_a_fixed_budget_times_nothing(monkeypatch):
    timed = timed_by(monkeypatch, lambda tree: 1.0)
    fitted = tree_fit.fit_to_model(
        partly_trained("transformer"), [[3, 4, 5]], 4, Plan(GenerationConfig(12), heads=HeadsSettings(heads=4))
    )
    assert timed == [] and fitted.trials == [] and fitted.chain is None and not fitted.chain_faster
    assert "sizes_tried" not in json.loads(fitted.to_json())


def test_tree_decoding_with_spans_rounded_up_equals_autoregressive(monkeypatch):
    """As on a GPU (inference.SPAN_MULTIPLE): a tree step attends over its span rounded up to a multiple of 8, the
    positions beyond masked whatever they hold (a tree's nodes left behind by the last step among them)."""
    model = partly_trained("transformer")
    prompts = [[5, 6, 7, 8, 9], [2, 3], [1, 2, 3, 4, 5, 6, 7, 8, 9]]
    reference, _ = generate(model, prompts, Plan(GenerationConfig(24), HeadsSettings(heads=1)))
    monkeypatch.setitem(inference.SPAN_MULTIPLE, "cpu", 8)
    for decoding in (dict(heads=1), dict(heads=4), dict(heads=4, tree=TREE)):
        out, stats = generate(model, prompts, Plan().changed(max_new_tokens=24, **decoding))
        assert out == reference, decoding
        assert decoding["heads"] == 1 or stats.accepted[0] > 0
