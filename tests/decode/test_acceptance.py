"""The acceptance rules on hand-made distributions, drafts and uniforms: every outcome forced (all accepted, none, a
prefix, a cut draft, a rejected sibling in a tree), for every rule, beside the statistical checks of
test_lossless.py, which these make readable when they fail."""

import collections
import itertools
import math

import pytest
import torch

from mtp.decode.acceptance import Greedy, Lossless, NodeLaws, TreeVerification, Typical, rule_for
from mtp.decode.heads_proposer import proposer_for
from mtp.decode.plan import Plan, Proposer
from mtp.decode.sampling import RandomLayout, sample_distinct, sample_many, top_tokens
from mtp.decode.settings import GenerationConfig, HeadsSettings
from mtp.decode.tree import DraftTree

V = 4


def logits(*rows: list[float]) -> torch.Tensor:
    """(1, len(rows), V) logits whose softmax is each given distribution (zeros stay impossible)."""
    return torch.tensor(rows).log()[None]


def one_hot(token: int) -> list[float]:
    return [float(i == token) for i in range(V)]


def draws_for(rule, tests: list[float], next_token: float) -> torch.Tensor:
    """One row of a step's uniforms: the acceptance tests, then the next token's; everything else 0.5."""
    draws = torch.full((1, rule.layout.per_step), 0.5)
    draws[0, : len(tests)] = torch.tensor(tests)
    draws[0, rule.layout.tests] = next_token
    return draws


class StandIn(Proposer):
    """A drafter of ``gamma`` drafts a step that only declares its uniforms (no step is built here)."""

    method, beside_heads = "stand-in", True

    def __init__(self, gamma: int) -> None:
        self.gamma = gamma


def sampling(gamma: int = 0, **settings) -> Plan:
    """A sampling plan of 5 heads, or of ``settings``, with a drafter of ``gamma`` drafts (0: none)."""
    return Plan(drafter=StandIn(gamma) if gamma else None).changed(**{"temperature": 1.0, "heads": 5, **settings})


def test_the_config_picks_the_rule():
    assert isinstance(rule_for(Plan(GenerationConfig(), heads=HeadsSettings(heads=5))), Greedy)
    assert isinstance(
        rule_for(Plan(GenerationConfig(acceptance="typical"), heads=HeadsSettings(heads=5))), Greedy
    )  # ignores typical
    assert isinstance(rule_for(sampling()), Lossless)
    assert isinstance(rule_for(sampling(acceptance="typical")), Typical)


LAYOUT_TREE = DraftTree([(0,), (1,), (0, 0), (0, 1), (1, 0)])
LAYOUTS = {  # (tests, heads' chain, drafter, heads' tree): what sampled outputs for a seed rest on, pinned
    "chain": (sampling(), (4, 4, 0, 0)),
    "tree": (sampling(tree=LAYOUT_TREE), (4, 4, 0, 5)),
    "typical-tree": (sampling(tree=LAYOUT_TREE, acceptance="typical"), (4, 4, 0, 5)),
    "drafter": (sampling(3, heads=1), (3, 0, 3, 0)),
    "spectr-heads": (sampling(drafts_per_step=3, acceptance="spectr"), (12, 4, 0, 12)),
    "drafter-sequences": (sampling(3, heads=1, drafts_per_step=2), (4, 0, 6, 0)),
    "drafter-spectr": (sampling(3, heads=1, drafts_per_step=2, acceptance="spectr"), (6, 0, 6, 0)),
    "hybrid": (sampling(3, heads=3, drafts_per_step=2), (5, 2, 8, 0)),
    "hybrid-chain": (sampling(4, heads=3), (5, 2, 6, 0)),
}


def layout_of(plan: Plan) -> RandomLayout:
    """The layout a step of ``plan`` uses, made as :func:`~mtp.decode.generate` makes it: of what the rule and the
    proposer (the heads, the plan's drafter, or both) each declare."""
    proposer = proposer_for(plan)  # not joined to a form: the draws it declares do not read one
    return rule_for(plan, proposer.draws(plan)).layout


@pytest.mark.parametrize("name", LAYOUTS)
def test_random_layout_gives_every_number_one_use(name):
    config, _ = LAYOUTS[name]
    layout = layout_of(config)
    draws = torch.arange(layout.per_step, dtype=torch.float)[None]
    used = [*layout.acceptance(draws, 0, layout.tests)[0].tolist(), layout.next_token(draws).item()]
    used += layout.drafts(draws)[0].tolist() + layout.drafter(draws)[0].tolist()
    used += layout.nodes(draws, 0, layout.tree_nodes)[0].tolist()
    assert sorted(used) == list(range(layout.per_step)), config
    tree = config.step_tree
    if tree is not None and config.sampling.acceptance == "spectr":
        assert layout.tests == tree.size  # every node of a depth may be a candidate


@pytest.mark.parametrize("name", LAYOUTS)
def test_random_layout_numbers_stay_as_they_were(name):
    """Where each uniform of a step goes decides every sampled output for a seed: a layout made of other declarations
    must place them as before (tests, the heads' chain, a drafter's, the heads' tree nodes), or a seed's outputs
    change."""
    config, pinned = LAYOUTS[name]
    layout = layout_of(config)
    assert (layout.tests, layout.chain_drafts, layout.drafter_drafts, layout.tree_nodes) == pinned


# -- chains: drafts (1, 4); head 1's logits after the base and each draft (1, 5, V)
CHAIN = torch.tensor([[1, 2, 3, 0]])


def greedy_chain(matching: int, live: int = 4) -> tuple[int, int]:
    """Head 1's argmax equals the first ``matching`` drafts, then differs (token after position j: 3 - j % 2)."""
    argmax = [CHAIN[0, j].item() if j < matching else (CHAIN[0, j].item() + 1) % V for j in range(4)] + [2]
    head1 = logits(*[[0.7 if i == t else 0.1 for i in range(V)] for t in argmax])
    rule = rule_for(Plan(GenerationConfig(), heads=HeadsSettings(heads=5)))
    accepted, token = rule.chain(head1, CHAIN, torch.tensor([live]), None, None)
    return accepted.item(), token.item()


@pytest.mark.parametrize(
    ("matching", "live", "expected"),
    [
        (4, 4, (4, 2)),  # always accept: the bonus token is head 1's after the last draft
        (0, 4, (0, 2)),  # never: head 1's token after the base (draft 1 is 1, head 1 says 2)
        (2, 4, (2, 0)),  # 2 of 4: head 1's after draft 2 (draft 3 is 3, head 1 says 0)
        (
            4,
            2,
            (2, 3),
        ),  # a cut draft: only 2 verified, head 1's token after draft 2 follows even though draft 3 matches
    ],
    ids=["all", "none", "two", "cut"],
)
def test_greedy_chain(matching, live, expected):
    assert greedy_chain(matching, live) == expected


def lossless_chain(targets, proposals, tests, next_uniform, live=4) -> tuple[int, int]:
    rule = rule_for(sampling())
    probs = torch.tensor([proposals])  # (1, 4, V)
    draws = draws_for(rule, tests, next_uniform)
    accepted, token = rule.chain(logits(*targets), CHAIN, torch.tensor([live]), probs, draws)
    return accepted.item(), token.item()


HALVES = [0.25, 0.25, 0.25, 0.25]


def test_lossless_chain_accepts_what_the_target_gives_at_least_the_proposal():
    targets = [one_hot(1), one_hot(2), one_hot(3), one_hot(0), [0.1, 0.2, 0.3, 0.4]]
    proposals = [one_hot(1), one_hot(2), one_hot(3), one_hot(0)]
    # q(x) = p(x) = 1 passes for any uniform; the bonus token is drawn from the target after the last draft
    assert lossless_chain(targets, proposals, [0.999] * 4, 0.35) == (4, 2)


def test_lossless_chain_rejects_a_draft_the_target_rules_out_and_draws_from_the_residual():
    # draft 1 (token 1) has target probability 0; residual max(0, q - p) with p one-hot on 1: q itself, minus nothing
    targets = [[0.5, 0.0, 0.25, 0.25], *[HALVES] * 4]
    proposals = [one_hot(1), *[HALVES] * 3]
    assert lossless_chain(targets, proposals, [0.0] * 4, 0.6) == (0, 2)  # cdf 0.5, 0.5, 0.75, 1


def test_lossless_chain_tests_each_draft_with_min_1_q_over_p():
    # draft 3 (token 3): q = 0.2, p = 0.8: passes with probability 0.25, so uniform 0.2 passes and 0.3 fails
    targets = [one_hot(1), one_hot(2), [0.4, 0.0, 0.4, 0.2], HALVES, HALVES]
    proposals = [one_hot(1), one_hot(2), [0.0, 0.0, 0.2, 0.8], HALVES]
    assert lossless_chain(targets, proposals, [0.9, 0.9, 0.2, 0.999], 0.5)[0] == 4  # draft 4: q = p
    accepted, token = lossless_chain(targets, proposals, [0.9, 0.9, 0.3, 0.0], 0.99)
    # 2 of 4; the residual normalize(max(0, q - p)) = (0.4, 0, 0.2, 0) / 0.6: uniform 0.99 gives token 2, never 3
    assert (accepted, token) == (2, 2)
    assert lossless_chain(targets, proposals, [0.9, 0.9, 0.3, 0.0], 0.6)[1] == 0  # 0.6 < 0.4 / 0.6


def test_lossless_chain_a_cut_draft_is_not_rejected():
    """Row verifies 2 drafts (live 2): the token after them comes from the target, not from a residual."""
    targets = [one_hot(1), one_hot(2), [0.5, 0.5, 0.0, 0.0], HALVES, HALVES]
    proposals = [one_hot(1), one_hot(2), one_hot(0), HALVES]
    # the residual after a rejection of token 0 would be one-hot on 1; the target draws 0 with uniform 0.3
    assert lossless_chain(targets, proposals, [0.0] * 4, 0.3, live=2) == (2, 0)
    assert lossless_chain(targets, proposals, [0.999, 0.999, 0.999, 0.0], 0.3, live=4) == (2, 1)  # rejected


def typical_chain(targets, live=4, next_uniform=0.5) -> tuple[int, int]:
    rule = rule_for(sampling(acceptance="typical", typical_epsilon=0.3, typical_delta=0.3))
    accepted, token = rule.chain(logits(*targets), CHAIN, torch.tensor([live]), None, draws_for(rule, [], next_uniform))
    return accepted.item(), token.item()


def test_typical_chain_accepts_above_the_entropy_threshold():
    confident = [one_hot(1), one_hot(2), one_hot(3), one_hot(0), [0.1, 0.2, 0.3, 0.4]]
    assert typical_chain(confident, next_uniform=0.35) == (4, 2)  # the next token sampled from head 1
    # uniform head 1 at draft 3: entropy log 4, threshold min(0.3, 0.3 / 4) = 0.075 < 0.25: passes
    assert typical_chain([one_hot(1), one_hot(2), HALVES, one_hot(0), HALVES])[0] == 4
    # draft 3 (token 3) at probability 0.05 under a peaked head 1 (threshold 0.3 exp(-H) > 0.05): rejected
    peaked = [0.9, 0.04, 0.01, 0.05]
    assert 0.3 * math.exp(sum(p * math.log(p) for p in peaked)) > 0.05
    assert typical_chain([one_hot(1), one_hot(2), peaked, one_hot(0), HALVES], next_uniform=0.1) == (2, 0)
    assert typical_chain(confident, live=1)[0] == 1  # cut


# -- trees: root, then (0,) (1,) (0, 0) (1, 0): nodes 1 and 2 at depth 1, 3 under 1, 4 under 2
TREE = DraftTree([(0,), (1,), (0, 0), (1, 0)])


def tree_step(tokens: list[int], head1_rows: list[list[float]], live: int = 2) -> TreeVerification:
    head1 = logits(*head1_rows)
    rows = torch.arange(1)
    return TreeVerification(
        head1, torch.arange(5), lambda nodes: head1[rows, nodes], torch.tensor([tokens]), TREE, torch.tensor([live])
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_top_tokens_are_torch_argmax_the_first_of_equal_maxima(dtype):
    """The greedy rules' and drafts' argmax (NumPy's on CPU) against torch's, on every shape a step gives it, with
    ties: hand-made first (the first of equal maxima wins), then random logits rounded to make ties common, and a
    non-contiguous view."""
    tied = torch.tensor([[0.1, 0.7, 0.7, 0.2], [0.9, 0.1, 0.9, 0.9]], dtype=dtype)
    assert top_tokens(tied).tolist() == [1, 0]
    generator = torch.Generator().manual_seed(0)
    for shape in [(5,), (3, 7), (2, 4, 300), (3, 2, 4, 33)]:
        logits = (torch.randn(shape, generator=generator) * 4).round().to(dtype)
        assert torch.equal(top_tokens(logits), logits.argmax(dim=-1)), shape
    wide = (torch.randn(6, 9, 50, generator=generator) * 3).round().to(dtype).transpose(0, 1)[:, ::2]
    assert torch.equal(top_tokens(wide), wide.argmax(dim=-1))


def test_greedy_tree_takes_the_accepted_sibling_and_its_child():
    # head 1 after the root: 2 (node 1 drafted 1: rejected; node 2 drafted 2: accepted), after node 2: 3 (node 4 is 3)
    step = tree_step([0, 1, 2, 0, 3], [one_hot(2), one_hot(0), one_hot(3), one_hot(1), one_hot(1)])
    depth, token, path = Greedy(GenerationConfig(), None).tree(step, None, None)
    assert (depth.item(), token.item(), path[0].tolist()) == (2, 1, [0, 2, 4])
    cut = tree_step([0, 1, 2, 0, 3], [one_hot(2), one_hot(0), one_hot(3), one_hot(1), one_hot(1)], live=1)
    depth, token, path = Greedy(GenerationConfig(), None).tree(cut, None, None)
    assert (depth.item(), token.item(), path[0].tolist()) == (1, 3, [0, 2, 2])
    # nothing accepted: head 1's token after the root
    none = tree_step([0, 1, 2, 0, 3], [one_hot(3), *[one_hot(0)] * 4])
    depth, token, path = Greedy(GenerationConfig(), None).tree(none, None, None)
    assert (depth.item(), token.item(), path[0].tolist()) == (0, 3, [0, 0, 0])


def test_lossless_tree_tries_the_next_sibling_against_the_residual():
    """Node 1 (token 1) is rejected (uniform 0.9 > q/p = 0.5); the target becomes normalize(max(0, q - p)) and
    node 2 (token 2) is tested against it: it passes with min(1, q'(2) / p(2))."""
    rule = rule_for(sampling(tree=TREE, heads=3))
    q_root = [0.0, 0.25, 0.75, 0.0]  # head 1 after the root
    proposal_depth1 = [0.0, 0.5, 0.5, 0.0]  # both depth-1 nodes drawn from it
    # after rejecting token 1: max(0, q - p) = (0, 0, 0.25, 0), normalized one-hot on 2: node 2 passes whatever p(2)
    heads_after = [q_root, HALVES, one_hot(3), HALVES, HALVES]  # after node 2 head 1 says 3; node 4 drafted 3
    step = tree_step([0, 1, 2, 0, 3], heads_after)
    probs = torch.tensor([[proposal_depth1, one_hot(3)]])  # (1, depth, V)
    tests = [0.9, 0.999, 0.5]  # depth 1: node 1, node 2; depth 2: the child of the node reached
    depth, token, path = rule.tree(step, NodeLaws(probs), draws_for(rule, tests, 0.5))
    assert (depth.item(), path[0].tolist()) == (2, [0, 2, 4])
    # (without renormalizing, uniform * p < q'(x) with the unnormalized q'(2) = 0.25, node 2 would fail at 0.999)
    # node 1 accepted instead (uniform 0.1 < 0.5): its subtree is taken, node 2 never tried
    step = tree_step([0, 1, 2, 0, 3], [q_root, one_hot(0), HALVES, HALVES, HALVES])
    probs = torch.tensor([[proposal_depth1, one_hot(0)]])
    depth, token, path = rule.tree(step, NodeLaws(probs), draws_for(rule, [0.1, 0.0, 0.5], 0.5))
    assert (depth.item(), path[0].tolist()) == (2, [0, 1, 3])


def test_lossless_tree_each_test_reads_its_own_uniform_when_siblings_go_untried():
    """Node 1 passes (uniform 0.1), so node 2 is never tried; the test of node 3 (token 0, drawn with p = 1, head 1
    after node 1 gives it q = 0.5) reads the third uniform whatever was skipped before it: 0.9 rejects it, 0.4 passes.
    Then the token after node 1 comes from the residual, (0, 0.5, 0, 0.5) normalized."""
    rule = rule_for(sampling(tree=TREE, heads=3))
    step = tree_step([0, 1, 2, 0, 3], [[0.0, 0.5, 0.5, 0.0], [0.5, 0.25, 0.0, 0.25], HALVES, HALVES, HALVES])
    probs = torch.tensor([[[0.0, 0.5, 0.5, 0.0], one_hot(0)]])
    depth, token, path = rule.tree(step, NodeLaws(probs), draws_for(rule, [0.1, 0.0, 0.9], 0.4))
    assert (depth.item(), path[0].tolist(), token.item()) == (1, [0, 1, 1], 1)
    depth, token, path = rule.tree(step, NodeLaws(probs), draws_for(rule, [0.1, 0.99, 0.4], 0.4))
    assert (depth.item(), path[0].tolist()) == (2, [0, 1, 3])


def test_lossless_tree_bonus_token_after_the_deepest_node_comes_from_head_1_there():
    rule = rule_for(sampling(tree=TREE, heads=3))
    step = tree_step([0, 1, 2, 0, 3], [one_hot(1), one_hot(0), HALVES, HALVES, one_hot(2)])
    probs = torch.tensor([[one_hot(1), one_hot(0)]])
    depth, token, path = rule.tree(step, NodeLaws(probs), draws_for(rule, [0.5, 0.5, 0.5], 0.99))
    assert (depth.item(), path[0].tolist(), token.item()) == (2, [0, 1, 3], 3)  # after node 3: uniform 0.99 -> 3


# -- siblings drawn without replacement (sibling_draws="distinct", Sequoia's rule) against independently (SpecInfer's)
def test_a_distinct_sibling_is_tested_without_the_elder_ones():
    """Node 1 (token 1) fails (uniform 0.9 > q/p = 0.4); the target becomes normalize(max(0, q - p)) = (0, 0, 5/6,
    1/6). Node 2 (token 3) was drawn without token 1: its law is (0, 0, 1/2, 1/2), so it passes with 1/6 / 1/2 = 1/3,
    and uniform 0.5 rejects it; drawn independently (p(3) = 1/4) it passes with 2/3, and 0.5 accepts it. After the
    distinct rejection what is left is normalize(max(0, (0, 0, 5/6, 1/6) - (0, 0, 1/2, 1/2))): token 2."""
    q_root, proposal = [0.0, 0.2, 0.5, 0.3], [0.0, 0.5, 0.25, 0.25]
    heads_after = [q_root, HALVES, one_hot(0), HALVES, HALVES]  # after node 2 head 1 says 0; node 4 drafted 0
    probs = torch.tensor([[proposal, one_hot(0)]])
    tests = [0.9, 0.5, 0.5]  # depth 1: node 1, node 2; depth 2: the child of the node reached
    # distinct: token 2 from what is left; independent: node 2, then node 4 (head 1 says 0), then HALVES' 0.3 quantile
    for draws, expected in [("distinct", (0, [0, 0, 0], 2)), ("independent", (2, [0, 2, 4], 1))]:
        rule = rule_for(sampling(tree=TREE, heads=3, sibling_draws=draws))
        laws = NodeLaws(probs, distinct=draws == "distinct")
        depth, token, path = rule.tree(tree_step([0, 1, 3, 0, 0], heads_after), laws, draws_for(rule, tests, 0.3))
        assert (depth.item(), path[0].tolist(), token.item()) == expected, draws
    # a uniform below 1/3 passes the distinct node 2 too
    rule = rule_for(sampling(tree=TREE, heads=3))
    depth, token, path = rule.tree(
        tree_step([0, 1, 3, 0, 0], heads_after), NodeLaws(probs, distinct=True), draws_for(rule, [0.9, 0.3, 0.5], 0.3)
    )
    assert (depth.item(), path[0].tolist()) == (2, [0, 2, 4])


def test_a_distinct_sibling_drawn_after_its_law_ran_out_is_not_tried():
    """The proposal has one token (1); node 2's draw after it has nothing left (here token 3, probability 0 under the
    proposal), so it is no candidate even though head 1 gives 3 probability 0.3: node 1 fails and the token comes
    from the residual max(0, q - p) = (0, 0, 0.5, 0.3) normalized, whose 0.7 quantile is token 3 (a tried node 2
    would have passed whatever its uniform)."""
    rule = rule_for(sampling(tree=TREE, heads=3))
    step = tree_step([0, 1, 3, 0, 0], [[0.0, 0.2, 0.5, 0.3], HALVES, HALVES, HALVES, HALVES])
    probs = torch.tensor([[one_hot(1), one_hot(0)]])
    for next_uniform, expected in [(0.7, 3), (0.5, 2)]:
        draws = draws_for(rule, [0.9, 0.0, 0.0], next_uniform)
        depth, token, path = rule.tree(step, NodeLaws(probs, distinct=True), draws)
        assert (depth.item(), path[0].tolist(), token.item()) == (0, [0, 0, 0], expected)


def test_distinct_draws_take_the_inverse_cdf_of_what_is_left():
    """probs (0.1, 0, 0.4, 0.2, 0.3): uniform 0.3 -> token 2; then without it (1/6, 0, 0, 1/3, 1/2), 0.55 -> token
    4; then (1/3, 0, 0, 2/3, 0), 0.1 -> token 0 and 0.5 -> token 3; a fourth draw has only token 3 left."""
    probs = torch.tensor([[0.1, 0.0, 0.4, 0.2, 0.3]] * 2)
    uniforms = torch.tensor([[0.3, 0.55, 0.1], [0.3, 0.55, 0.5]])
    assert sample_distinct(probs, uniforms).tolist() == [[2, 4, 0], [2, 4, 3]]
    assert sample_distinct(probs[:1], torch.tensor([[0.3, 0.55, 0.1, 0.99]])).tolist() == [[2, 4, 0, 3]]
    assert sample_distinct(probs[None], uniforms[None]).shape == (1, 2, 3)  # any leading dimensions


def test_distinct_draws_have_the_law_of_sampling_without_replacement():
    """Ordered triples from 60,000 rows of a 6-token law against their exact probabilities (p(a) p(b) / (1 - p(a))
    ...), within the total variation that 60,000 exact samples exceed with probability 1e-6; drawing with replacement
    (every triple's law the product) is far outside it."""
    p = torch.tensor([0.05, 0.3, 0.0, 0.25, 0.15, 0.25])
    n = 60_000
    samples = sample_distinct(p.expand(n, -1), torch.rand(n, 3, generator=torch.Generator().manual_seed(0)))
    counts = collections.Counter(map(tuple, samples.tolist()))
    exact = {}
    for triple in itertools.permutations([0, 1, 3, 4, 5], 3):
        law, left = 1.0, 1.0
        for token in triple:
            law, left = law * p[token].item() / left, left - p[token].item()
        exact[triple] = law
    tv = 0.5 * sum(abs(counts.get(t, 0) / n - exact.get(t, 0.0)) for t in set(counts) | set(exact))
    threshold = 0.5 * sum(math.sqrt(q * (1 - q) / n) for q in exact.values()) + math.sqrt(math.log(1e6) / (2 * n))
    assert tv < threshold, f"total variation {tv:.4f} >= {threshold:.4f}"
    with_replacement = sample_many(p.expand(n, -1), torch.rand(n, 3, generator=torch.Generator().manual_seed(0)))
    counts = collections.Counter(map(tuple, with_replacement.tolist()))
    tv = 0.5 * sum(abs(counts.get(t, 0) / n - exact.get(t, 0.0)) for t in set(counts) | set(exact))
    assert tv > 4 * threshold


# -- top-ranked drafts under lossless sampling (draft_choice="top"): no proposal law, each draft's is itself (one-hot)
def test_lossless_chain_of_top_drafts_passes_each_with_its_target_probability():
    # draft 1 (token 1) at q = 0.6: uniform 0.59 passes, 0.61 fails
    targets = [[0.1, 0.6, 0.3, 0.0], one_hot(2), one_hot(3), one_hot(0), [0.1, 0.2, 0.3, 0.4]]
    rule = rule_for(sampling(draft_choice="top"))
    accepted, token = rule.chain(logits(*targets), CHAIN, torch.tensor([4]), None, draws_for(rule, [0.59] * 4, 0.35))
    assert (accepted.item(), token.item()) == (4, 2)  # all passed: the bonus token from the target after draft 4
    # rejected: the next token from q without the draft, (0.25, 0, 0.75, 0): uniform 0.2 gives 0, 0.3 gives 2 (never 1)
    for uniform, expected in ((0.2, 0), (0.3, 2), (0.99, 2)):
        draws = draws_for(rule, [0.61, 0.0, 0.0, 0.0], uniform)
        accepted, token = rule.chain(logits(*targets), CHAIN, torch.tensor([4]), None, draws)
        assert (accepted.item(), token.item()) == (0, expected), uniform


def test_lossless_chain_of_top_drafts_accepts_2_of_4_and_never_resamples_the_rejected_draft():
    targets = [one_hot(1), one_hot(2), [0.5, 0.0, 0.0, 0.5], HALVES, HALVES]  # draft 3 (token 3) at q = 0.5
    rule = rule_for(sampling(draft_choice="top"))
    for uniform in (0.0, 0.5, 0.999):  # the residual after rejecting 3 is one-hot on 0, whatever the uniform
        draws = draws_for(rule, [0.999, 0.999, 0.5, 0.0], uniform)
        accepted, token = rule.chain(logits(*targets), CHAIN, torch.tensor([4]), None, draws)
        assert (accepted.item(), token.item()) == (2, 0)
    # cut after 2 drafts: the token after them comes from the target itself, 3 included
    draws = draws_for(rule, [0.999, 0.999, 0.5, 0.0], 0.999)
    accepted, token = rule.chain(logits(*targets), CHAIN, torch.tensor([2]), None, draws)
    assert (accepted.item(), token.item()) == (2, 3)


def test_lossless_tree_of_top_drafts_tries_the_next_sibling_without_the_rejected_one():
    """Node 1 (token 1, q = 0.5) is rejected (uniform 0.6); the target becomes q without token 1, renormalized:
    node 2 (token 2, q = 0.3 -> 0.6) passes at uniform 0.55 and would fail at 0.65."""
    rule = rule_for(sampling(tree=TREE, heads=3, draft_choice="top"))
    q_root = [0.2, 0.5, 0.3, 0.0]
    for uniform, expected in ((0.55, (2, [0, 2, 4])), (0.65, (0, [0, 0, 0]))):
        step = tree_step([0, 1, 2, 0, 3], [q_root, HALVES, one_hot(3), HALVES, HALVES])
        depth, token, path = rule.tree(step, None, draws_for(rule, [0.6, uniform, 0.0], 0.5))
        assert (depth.item(), path[0].tolist()) == expected, uniform
    # both depth-1 nodes rejected: the next token from q without tokens 1 and 2, one-hot on 0
    assert token.item() == 0


def test_bounded_chain_tests_decide_as_the_processed_distributions_do(monkeypatch):
    """On CPU a chain's drafts are tested against bounds on head 1's top-p probabilities (no nucleus is sorted out);
    random logits, drafts, proposals, cut drafts and uniforms: every accepted count and next token equals the one the
    processed distributions give (the bounds undecided for some rows of some trials, whose distributions are then
    processed)."""
    from mtp.decode import acceptance

    generator = torch.Generator().manual_seed(0)
    fell_back, some_rows, passes = 0, 0, acceptance.nucleus_passes

    def counted(*args):
        nonlocal fell_back, some_rows
        result = passes(*args)
        fell_back += bool(result[1].any())
        some_rows += bool(result[1].any() and not result[1].all())  # the others' outcomes kept from the bounds
        return result

    monkeypatch.setattr(acceptance, "nucleus_passes", counted)
    for trial in range(600):
        V, B, D = (5, 40)[trial % 2], 3, 4
        config = sampling(temperature=(0.7, 1.3)[trial % 2], top_p=(0.9, 0.5, 0.99)[trial % 3], heads=D + 1)
        rule = rule_for(config)
        head1 = torch.randn(B, D + 1, V, generator=generator) * 2
        drafts = torch.randint(0, V, (B, D), generator=generator)
        proposals = torch.softmax(torch.randn(B, D, V, generator=generator), dim=-1)
        proposals = None if trial % 5 == 0 else proposals  # top-ranked drafts too
        live = torch.randint(0, D + 1, (B,), generator=generator)
        draws = torch.rand(B, rule.layout.per_step, generator=generator)
        monkeypatch.setattr(acceptance, "BOUNDED_TESTS", True)
        bounded = rule.chain(head1, drafts, live, proposals, draws)
        monkeypatch.setattr(acceptance, "BOUNDED_TESTS", False)
        processed = rule.chain(head1, drafts, live, proposals, draws)
        assert all(torch.equal(a, b) for a, b in zip(bounded, processed, strict=True)), trial
    assert 0 < fell_back < 60  # some undecided tests, as rare as the bounds make them
    assert some_rows > 0  # in calls where other rows were decided


def test_bounded_tree_tests_decide_as_the_processed_distributions_do(monkeypatch):
    """On CPU a tree's first child at each node is tested against bounds on head 1's top-p probabilities, its law
    processed only once a try there fails or the walk ends; random trees (cut to fewer inputs too), logits, nodes,
    laws (or top-ranked nodes), depths verified and uniforms: every accepted depth, next token and path equals the one
    the processed distributions give, with trials where the bounds decide every try, and trials where they fall back."""
    from mtp.decode import acceptance

    generator = torch.Generator().manual_seed(0)
    decided, fell_back, surely_pass = 0, 0, Lossless._surely_pass

    def counted(*args):
        nonlocal decided, fell_back
        result = surely_pass(*args)
        decided, fell_back = decided + result, fell_back + (not result)
        return result

    monkeypatch.setattr(Lossless, "_surely_pass", counted)
    trees = [
        DraftTree([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]),
        DraftTree([(0,), (1,), (0, 0), (1, 0)]),
        DraftTree([(0,), (0, 0), (0, 1), (0, 0, 0), (0, 1, 0)]),
    ]
    for trial in range(600):
        tree, B, Vt = trees[trial % 3], 3, (5, 40)[trial % 2]
        config = sampling(temperature=(0.7, 1.3)[trial % 2], top_p=(0.9, 0.5, 0.99)[trial % 3], tree=tree)
        rule = rule_for(config)
        S = tree.size + 1 - (trial % 4 == 1)  # a step cut before its last node too
        parents, slot = tree.parents_within(S, torch.device("cpu"))
        head1 = torch.randn(B, len(parents), Vt, generator=generator) * 2
        after_all = torch.randn(B, S, Vt, generator=generator) * 2
        after_all[:, parents] = head1
        rows = torch.arange(B)
        # each node's token drawn from head 1 after its parent: first children often pass, and often fail
        parent_laws = torch.softmax(after_all[:, tree.tensors(torch.device("cpu"))["parent"][:S]], dim=-1)
        inputs = torch.multinomial(parent_laws.reshape(-1, Vt), 1, generator=generator).reshape(B, S)
        live = torch.randint(0, tree.depth + 1, (B,), generator=generator)
        step = TreeVerification(head1, slot, lambda nodes, a=after_all, r=rows: a[r, nodes], inputs, tree, live)
        laws = None
        if trial % 5:  # nodes drawn from laws that give their tokens some probability (top-ranked nodes otherwise)
            probs = torch.softmax(torch.randn(B, tree.depth, Vt, generator=generator), dim=-1)
            laws = NodeLaws(probs)
        draws = torch.rand(B, rule.layout.per_step, generator=generator)
        monkeypatch.setattr(acceptance, "BOUNDED_TESTS", True)
        bounded = rule.tree(step, laws, draws)
        monkeypatch.setattr(acceptance, "BOUNDED_TESTS", False)
        processed = rule.tree(step, laws, draws)
        assert all(torch.equal(a, b) for a, b in zip(bounded, processed, strict=True)), trial
    assert decided > 100 and fell_back > 100  # both ways taken often
