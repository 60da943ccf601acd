"""Several draft sequences per step (SpecTr's k-sequential selection, and SpecInfer's rule on the same trees) and the
hybrid of a draft model with the target's heads: the rule on hand-made distributions (its rho, its residual, every
outcome forced), greedy output equal to autoregressive output, and sampling with the autoregressive distribution,
with negative controls that must fail the same check."""

import math

import pytest
import torch

from mtp.decode import GenerationConfig, generate
from mtp.decode import acceptance as acceptance_module
from mtp.decode.acceptance import NodeLaws, SpecTr, TreeVerification, rule_for, spectr_residual, spectr_rho
from mtp.decode.methods.draft_model import draft_model_drafter, staged_drafter
from mtp.decode.methods.layer_skip import layer_skip_drafter
from mtp.decode.methods.prompt_lookup import LookupDrafter
from mtp.decode.plan import Plan
from mtp.decode.settings import DraftSettings, HeadsSettings
from mtp.decode.tree import DraftTree
from mtp.errors import SettingError
from tests.decode.helpers import HEAD_TYPES, fixed_logits_model, tiny_model, train_on_cycles
from tests.decode.test_drafters import VOCAB, check_drafter, draft_tables, drafter_for
from tests.decode.test_lossless import check, check_real_model, counting_tables
from tests.decode.test_tree import partly_trained

V = 4


# -- the rule on hand-made distributions
def test_rho_and_residual_of_two_candidates_by_hand():
    """p = (1/2, 1/2, 0, 0), q = (1/4, 1/4, 1/2, 0), k = 2: beta(rho) = 1 / (2 rho), and rho beta >= 1 - (1 - beta)^2
    holds from (1 - 1 / (2 rho))^2 >= 1/2, rho* = 1 + 1/sqrt(2). Then one of the two candidates passes with
    probability 1 - (1 - beta)^2 = 1/2, the most any coupling allows (q(0) + q(1)), and the residual is token 2."""
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    q = torch.tensor([[0.25, 0.25, 0.5, 0.0]])
    rho = spectr_rho(p, q, torch.tensor([2]))
    assert rho.item() == pytest.approx(1 + 1 / math.sqrt(2), abs=1e-6)
    beta = torch.minimum(p, q / rho).sum().item()
    assert 1 - (1 - beta) ** 2 == pytest.approx(0.5, abs=1e-6)
    torch.testing.assert_close(spectr_residual(p, q, rho, torch.tensor([2])), torch.tensor([[0.0, 0.0, 0.5, 0.0]]))


@pytest.mark.parametrize(
    ("p", "q"),
    [
        ([0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.5, 0.0]),
        ([0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4]),  # p = q: every candidate passes, rho 1
        ([1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5]),  # disjoint: nothing passes, the residual is q
        ([0.7, 0.1, 0.1, 0.1], [0.05, 0.05, 0.45, 0.45]),
    ],
)
@pytest.mark.parametrize("k", [1, 2, 4])
def test_one_candidate_of_k_or_the_residual_is_distributed_as_the_target(p, q, k):
    """Exactly, by enumerating the k candidates: P(output x) = sum over candidate draws of the rule's acceptance
    probabilities, plus P(all fail) times the normalized residual, must equal q(x); and rho = 1 for one candidate."""
    p, q = torch.tensor([p], dtype=torch.float64), torch.tensor([q], dtype=torch.float64)
    count = torch.tensor([k])
    rho = spectr_rho(p, q, count)
    if k == 1:
        assert rho.item() == pytest.approx(1.0)
    passes = torch.minimum(torch.ones_like(p), q / (rho[:, None] * p)).nan_to_num(0.0)  # min(1, q / (rho p))
    once = (p * passes)[0]  # (V,) probability that one candidate is x and passes
    fail = 1 - once.sum()
    accepted = once * sum(fail**i for i in range(k))  # the first passing candidate is x
    residual = spectr_residual(p, q, rho, count)[0]
    output = accepted + fail**k * residual / residual.sum()
    torch.testing.assert_close(output, q[0], atol=1e-6, rtol=0)


# root, then (0,) (1,) (0, 0) (1, 0): nodes 1 and 2 at depth 1, 3 under 1, 4 under 2
TREE = DraftTree([(0,), (1,), (0, 0), (1, 0)])
HALVES = [0.5, 0.5, 0.0, 0.0]


def one_hot(token: int) -> list[float]:
    return [float(i == token) for i in range(V)]


def spectr_step(tokens, head1_rows, depth_laws, tests, next_uniform=0.5, live=2):
    rule = rule_for(
        Plan(GenerationConfig(temperature=1.0, acceptance="spectr"), heads=HeadsSettings(heads=3, tree=TREE))
    )
    assert isinstance(rule, SpecTr) and rule.layout.tests == TREE.size
    head1 = torch.tensor(head1_rows).log()[None]
    rows = torch.arange(1)
    step = TreeVerification(
        head1, torch.arange(5), lambda nodes: head1[rows, nodes], torch.tensor([tokens]), TREE, torch.tensor([live])
    )
    draws = torch.full((1, rule.layout.per_step), 0.5)
    draws[0, : len(tests)] = torch.tensor(tests)
    draws[0, rule.layout.tests] = next_uniform
    depth, token, path = rule.tree(step, NodeLaws(torch.tensor([depth_laws])), draws)
    return depth.item(), token.item(), path[0].tolist()


def test_spectr_takes_a_child_of_any_node_that_agrees_with_the_accepted_token():
    """Nodes 1 and 2 both drafted token 1; node 1 passes. At depth 2 the candidates are node 3 (under node 1, token 0)
    and node 4 (under node 2, token 3): head 1 after token 1 gives only 3, so node 3 fails and node 4 passes, and the
    path runs through node 2, whose keys equal node 1's."""
    after_one = one_hot(3)
    depth, token, path = spectr_step(
        [0, 1, 1, 0, 3], [HALVES, after_one, after_one, HALVES, one_hot(2)], [HALVES, HALVES], [0.1, 0.9, 0.5, 0.9]
    )
    assert (depth, path, token) == (2, [0, 2, 4], 2)  # the bonus token: head 1 after node 4


def test_spectr_every_candidate_failing_samples_the_residual():
    """q = (1/4, 1/4, 1/2, 0) after the root, both depth-1 candidates drafted from p = (1/2, 1/2, 0, 0): each passes
    with probability q / (rho p) = 1/2 / rho ~ 0.29; with uniforms 0.9 both fail, and the token comes from the
    residual, which is token 2 alone."""
    q_root = [0.25, 0.25, 0.5, 0.0]
    depth, token, path = spectr_step([0, 0, 1, 0, 0], [q_root, *[HALVES] * 4], [HALVES, HALVES], [0.9, 0.9, 0.0, 0.0])
    assert (depth, token, path) == (0, 2, [0, 0, 0])
    # the second candidate passes where the first fails (0.25 < 1/2 / rho): node 2's subtree is taken
    depth, token, path = spectr_step(
        [0, 0, 1, 0, 3], [q_root, HALVES, one_hot(3), HALVES, one_hot(1)], [HALVES, one_hot(3)], [0.9, 0.25, 0.9, 0.1]
    )
    assert (depth, path, token) == (2, [0, 2, 4], 1)


def test_spectr_verifies_no_deeper_than_a_row_asks():
    depth, token, path = spectr_step(
        [0, 1, 1, 0, 3],
        [HALVES, one_hot(3), one_hot(3), HALVES, HALVES],
        [HALVES, HALVES],
        [0.1, 0.1, 0.0, 0.0],
        live=1,
    )
    assert (depth, path, token) == (1, [0, 1, 1], 3)  # head 1 after node 1, though node 4 would pass


def test_branches_tree_and_its_chain_order():
    tree = DraftTree.branches([2, 2, 1])
    assert tree.paths == [(0,), (1,), (2,), (0, 0), (1, 0)]
    assert tree.branch_order() == [0, 2, 4, 1, 3]  # chain 0: 0, 1; chain 1: 2, 3; chain 2: 4
    assert Plan(
        GenerationConfig(), heads=HeadsSettings(heads=4), drafts=DraftSettings(drafts_per_step=3)
    ).step_tree == DraftTree.branches([3, 3, 3])
    model = draft_model_drafter(tiny_model(n_future=1, vocab_size=40))
    assert Plan(drafter=model.with_gamma(2), drafts=DraftSettings(drafts_per_step=2)).step_tree == DraftTree.branches(
        [2, 2]
    )
    assert Plan(heads=HeadsSettings(heads=3), drafter=model.with_gamma(3)).step_tree == DraftTree.branches(
        [3, 2]
    )  # hybrid: + the heads' chain
    assert Plan(GenerationConfig(), heads=HeadsSettings(heads=4)).step_tree is None


def test_bad_settings_of_several_drafts_are_refused():
    with pytest.raises(ValueError, match="drafts_per_step=0 must be at least 1"):
        Plan(GenerationConfig(), heads=HeadsSettings(heads=3), drafts=DraftSettings(drafts_per_step=0))
    with pytest.raises(ValueError, match="does not combine with a tree"):
        Plan(
            GenerationConfig(),
            heads=HeadsSettings(heads=3, tree=DraftTree.chain(2)),
            drafts=DraftSettings(drafts_per_step=2),
        )
    with pytest.raises(ValueError, match="does not combine with adaptive_drafts"):
        DraftSettings(drafts_per_step=2, adaptive_drafts=True)
    with pytest.raises(ValueError, match=r"hybrid step \(gamma=2 drafts beside heads=3\) mixes two"):
        Plan(
            GenerationConfig(temperature=1.0, acceptance="spectr"),
            heads=HeadsSettings(heads=3),
            drafter=LookupDrafter(1, 40, "cpu", gamma=2),
        )
    with pytest.raises(ValueError, match="acceptance=other must be one of exact, typical, spectr"):
        Plan(GenerationConfig(acceptance="other"), heads=HeadsSettings(heads=3))
    with pytest.raises(ValueError, match="draft_choice=top drafts the top-ranked tokens; use draft_choice=auto"):
        Plan(
            GenerationConfig(temperature=1.0, acceptance="spectr"),
            heads=HeadsSettings(heads=3),
            drafts=DraftSettings(drafts_per_step=2, draft_choice="top"),
        )
    with pytest.raises(ValueError, match="draft_choice=best must be one of auto, sampled, tempered, top"):
        Plan(GenerationConfig(), heads=HeadsSettings(heads=3), drafts=DraftSettings(draft_choice="best"))


# -- greedy: every way of drafting several sequences decodes autoregressive decoding's tokens
@pytest.fixture(scope="module")
def counting_target():
    return partly_trained("transformer")


PROMPTS = [[3, 9, 1, 4, 4], [7, 30], [2, 2, 2, 30, 31, 5, 6, 8, 11], [5]]


@pytest.mark.parametrize("head_type", ["transformer", "causal", "medusa"])
def test_greedy_sequences_of_the_heads_equal_autoregressive(head_type):
    model = partly_trained(head_type)
    reference, _ = generate(model, PROMPTS, Plan(GenerationConfig(24)))
    out, stats = generate(
        model, PROMPTS, Plan(GenerationConfig(24), HeadsSettings(heads=4), drafts=DraftSettings(drafts_per_step=3))
    )
    assert out == reference
    assert stats.tree_nodes == 9 and 0 < stats.accepted[-1] < stats.drafted[-1]


@pytest.mark.parametrize("method", ["draft", "layerskip"])
@pytest.mark.parametrize("decoding", [dict(drafts_per_step=3), dict(heads=4), dict(heads=3, drafts_per_step=2)])
def test_greedy_draft_sequences_and_hybrids_equal_autoregressive(method, decoding, counting_target):
    model = counting_target
    reference, _ = generate(model, PROMPTS, Plan(GenerationConfig(32)))
    drafter = drafter_for(method, model, 40).with_gamma(3)
    plan = Plan(drafter=drafter).changed(max_new_tokens=32, **decoding)
    out, stats = generate(model, PROMPTS, plan)
    assert out == reference, decoding
    assert 0 < sum(stats.accepted) < sum(stats.drafted)
    assert stats.method == ("hybrid" if decoding.get("heads", 1) > 1 else method)
    alone, _ = generate(model, PROMPTS[1:2], plan)
    assert alone == reference[1:2]


@pytest.mark.parametrize("decoding", [dict(heads=4), dict(heads=2, temperature=0.0)])
def test_greedy_prompt_lookup_beside_the_heads_equals_autoregressive(decoding, counting_target):
    model = counting_target
    prompts = [list(p) for p in PROMPTS]
    prompts[2][4:7] = prompts[2][:3]  # a repeated trigram, for lookup to find; rows without a match pad its chain
    reference, _ = generate(model, prompts, Plan(GenerationConfig(32)))
    plan = Plan(drafter=LookupDrafter(2, 40, "cpu", gamma=3)).changed(max_new_tokens=32, **decoding)
    out, stats = generate(model, prompts, plan)
    assert out == reference
    assert stats.method == "hybrid" and stats.method_params["drafter"] == "lookup"
    assert 0 < sum(stats.accepted) < sum(stats.drafted)


def test_prompt_lookup_beside_the_heads_accepts_where_either_is_right():
    """A target that repeats its prompt's cycle once it has seen it (what lookup drafts) and whose heads 2..3 always
    predict the next tokens (what a counting model's do): each step accepts the longer of the two chains, so the
    hybrid beats both alone, exactly (greedy, hand-made logits)."""
    vocab = 12
    tables = torch.full((3, vocab, vocab), -30.0)
    for a in range(vocab):
        for k in range(3):
            tables[k, a, (a + k + 1) % vocab] = 10.0  # head k+1 after token a: a + k + 1
    model = fixed_logits_model(tables)
    prompt = [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0]]  # the counting continues, and lookup knows the cycle
    config = GenerationConfig(24)
    reference, _ = generate(model, prompt, Plan(config))
    heads = HeadsSettings(heads=3)
    heads_alone = generate(model, prompt, Plan(config, heads))
    lookup_alone = generate(model, prompt, Plan(config, drafter=LookupDrafter(2, vocab, "cpu", gamma=6)))
    hybrid = generate(model, prompt, Plan(config, heads, LookupDrafter(2, vocab, "cpu", gamma=6)))
    assert heads_alone[0] == lookup_alone[0] == hybrid[0] == reference
    assert heads_alone[1].tokens_per_forward < hybrid[1].tokens_per_forward
    assert hybrid[1].accepted[:6] == lookup_alone[1].accepted[:6]  # the lookup chain (6 deep) wins every step


def test_a_hybrid_accepts_the_heads_drafts_where_the_draft_model_is_wrong(counting_target):
    """A draft model that never drafts the right token (a random one) next to the target's trained heads: the hybrid
    step accepts the heads' drafts, so it beats the draft model alone."""
    model = counting_target
    draft = draft_model_drafter(tiny_model(n_future=1, vocab_size=40, seed=9), gamma=3)
    _, alone = generate(model, PROMPTS, Plan(GenerationConfig(32), drafter=draft))
    _, hybrid = generate(model, PROMPTS, Plan(GenerationConfig(32), HeadsSettings(heads=4), draft))
    assert hybrid.tokens_per_forward > alone.tokens_per_forward + 0.2


# -- sampling: the exact joint against many rows
@pytest.mark.parametrize(
    "case",
    [
        pytest.param(dict(heads=3, drafts_per_step=2, acceptance="spectr"), marks=pytest.mark.slow),  # as k4's
        dict(heads=3, drafts_per_step=4, acceptance="spectr", temperature=0.7, top_p=0.9),
        pytest.param(dict(heads=3, drafts_per_step=3), marks=pytest.mark.slow),  # SpecInfer's rule: everyday in hybrids
        pytest.param(  # ~5 s: with the slow tests
            dict(heads=4, tree=DraftTree([(0,), (1,), (2,), (0, 0), (1, 0), (0, 0, 0)]), acceptance="spectr"),
            marks=pytest.mark.slow,
        ),
    ],
    ids=["spectr-k2", "spectr-k4-T0.7-topp0.9", "specinfer-k3", "spectr-tree"],
)
def test_several_sequences_of_the_heads_sample_the_autoregressive_distribution(case):
    tv, threshold, outside = check(**case)
    assert outside == 0, "sampled a continuation the target gives probability 0"
    assert tv < threshold, f"total variation {tv:.4f} >= {threshold:.4f}"


def test_spectr_accepts_more_tokens_per_forward_with_more_sequences():
    """Sampled from the fixed tables (heads that propose far from the target): k sequences accept more per step
    than one chain, and SpecTr's rule at least as much as SpecInfer's on the same tree."""
    model = fixed_logits_model(counting_tables(3))

    def tokens_per_forward(**decoding) -> float:
        config = Plan().changed(max_new_tokens=16, temperature=1.0, heads=3, seed=3, **decoding)
        return generate(model, [[1]] * 2000, config)[1].tokens_per_forward

    chain = tokens_per_forward()
    k2, k4 = (tokens_per_forward(drafts_per_step=k, acceptance="spectr") for k in (2, 4))
    assert chain + 0.1 < k2 < k4
    assert k4 >= tokens_per_forward(drafts_per_step=4) - 0.02


def _wrong_spectr_rules():
    return {
        # every candidate tested with min(1, q / p): k tries over-accept the likeliest drafts
        "rho_fixed_at_one": ("spectr_rho", lambda proposal, target, k: torch.ones_like(target[:, 0])),
        # after every candidate failed, the token drawn from the target instead of the residual
        "residual_is_the_target": ("spectr_residual", lambda proposal, target, rho, k: target),
        # the residual of one candidate (k = 1) after k failed ones
        "residual_of_one_candidate": (
            "spectr_residual",
            lambda proposal, target, rho, k: acceptance_module.correction_probs(
                target, proposal, torch.ones_like(k, dtype=torch.bool)
            ),
        ),
    }


@pytest.mark.slow
@pytest.mark.parametrize("rule", _wrong_spectr_rules().keys())
def test_each_wrong_spectr_rule_fails_the_check(rule, monkeypatch):
    name, wrong = _wrong_spectr_rules()[rule]
    monkeypatch.setattr(acceptance_module, name, wrong)
    tv, threshold, outside = check(heads=3, drafts_per_step=4, acceptance="spectr")
    assert outside > 0 or tv >= threshold, f"{rule}: total variation {tv:.4f} < {threshold:.4f}"


@pytest.mark.parametrize(
    "decoding",
    [
        pytest.param(dict(drafts_per_step=3, acceptance="spectr"), marks=pytest.mark.slow),  # ~4 s each: slow
        pytest.param(
            dict(drafts_per_step=2), marks=pytest.mark.slow
        ),  # a drafter's sequences: everyday on a real model
        dict(heads=3),  # hybrid: the draft model's chain and the heads' chain, SpecInfer's rule
        pytest.param(dict(heads=3, drafts_per_step=2, temperature=0.7, top_p=0.9), marks=pytest.mark.slow),
    ],
    ids=["draft-spectr-k3", "draft-specinfer-k2", "hybrid", "hybrid-k2-T0.7-topp0.9"],
)
def test_draft_sequences_and_hybrids_sample_the_autoregressive_distribution(decoding):
    drafter = draft_model_drafter(fixed_logits_model(draft_tables()))
    tables = counting_tables(3) if decoding.get("heads", 1) > 1 else None  # head 1: the same target
    tv, threshold, outside, stats = check_drafter(drafter, tables=tables, **decoding)
    assert sum(stats.accepted) > 0.2 * sum(stats.drafted)
    assert outside == 0, "sampled a continuation the target gives probability 0"
    assert tv < threshold, f"total variation {tv:.4f} >= {threshold:.4f}"


@pytest.mark.parametrize("decoding", [dict(heads=3), pytest.param(dict(heads=3, top_p=0.9), marks=pytest.mark.slow)])
def test_prompt_lookup_beside_the_heads_samples_the_autoregressive_distribution(decoding):
    """Lookup's one-hot chain beside the heads' sampled chain, one tree, SpecInfer's rule (PROMPT's last bigram came
    before, so lookup drafts; the heads draft from the counting tables)."""
    tv, threshold, outside, stats = check_drafter(LookupDrafter(2, VOCAB, "cpu"), tables=counting_tables(3), **decoding)
    assert stats.method == "hybrid" and sum(stats.accepted) > 0.2 * sum(stats.drafted)
    assert outside == 0, "sampled a continuation the target gives probability 0"
    assert tv < threshold, f"total variation {tv:.4f} >= {threshold:.4f}"


@pytest.mark.slow
def test_draft_sequences_sharing_their_draws_fail_the_check(monkeypatch):
    """A negative control: every draft sequence drawn with the first sequence's uniforms (so all k are one) but tested
    as k independent candidates."""
    from mtp.decode.methods import draft_model

    chains = draft_model.ModelDrafter.draft_chains

    def shared(self, gamma, draws):
        if draws is not None:
            draws = draws[:, :gamma].repeat(1, self.branches)
        return chains(self, gamma, draws)

    monkeypatch.setattr(draft_model.ModelDrafter, "draft_chains", shared)
    drafter = draft_model_drafter(fixed_logits_model(draft_tables()))
    tv, threshold, outside, _ = check_drafter(drafter, rows=15_000, drafts_per_step=3, acceptance="spectr")
    assert outside > 0 or tv >= threshold, f"total variation {tv:.4f} < {threshold:.4f}"


@pytest.mark.parametrize(  # the other head types with the slow tests (each ~4 s)
    "head_type",
    ["transformer", pytest.param("causal", marks=pytest.mark.slow), pytest.param("medusa", marks=pytest.mark.slow)],
)
def test_spectr_lossless_with_head_blocks(head_type):
    """On a random model whose every context changes the logits (the tree mask, the kept path through an agreeing
    node and the drafts all matter)."""
    model = tiny_model(n_future=3, vocab_size=4, seed=3, **HEAD_TYPES[head_type])
    with torch.no_grad():
        model.heads.outputs[0].weight.mul_(60)
    config = Plan(
        GenerationConfig(max_new_tokens=4, temperature=1.0, seed=5, acceptance="spectr"),
        heads=HeadsSettings(heads=3),
        drafts=DraftSettings(drafts_per_step=3),
    )
    check_real_model(model, config)


@pytest.mark.parametrize(  # the hybrid with the slow tests: everyday on the fixed tables
    "decoding", [dict(drafts_per_step=2, acceptance="spectr"), pytest.param(dict(heads=3), marks=pytest.mark.slow)]
)
def test_draft_sequences_and_hybrids_lossless_on_real_models(decoding):
    model = tiny_model(n_future=3, vocab_size=4, seed=3)
    with torch.no_grad():
        model.heads.outputs[0].weight.mul_(60)
    drafter = layer_skip_drafter(model, frozenset({0}), gamma=2)
    config = Plan(drafter=drafter).changed(max_new_tokens=4, temperature=1.0, seed=5, **decoding)
    stats = check_real_model(model, config)
    assert 0 < sum(stats.accepted) < sum(stats.drafted)


# -- staged: a draft model decoded speculatively (its own drafts from lookup or its heads)
@pytest.fixture(scope="module")
def small_drafts():
    """Small draft models trained on counting windows: one head (drafts by lookup), two heads (drafts by its heads)."""
    return {
        inner: train_on_cycles(tiny_model(n_future=2 if inner == "heads" else 1, vocab_size=40, seed=7), steps=15)
        for inner in ("lookup", "heads")
    }


@pytest.mark.parametrize("inner", ["lookup", "heads"])
def test_staged_drafts_are_the_draft_models_own_greedy_drafts(inner, counting_target, small_drafts):
    """Greedy, a staged draft drafts exactly what the same draft model drafts autoregressively (so the target accepts
    the same), in fewer draft forwards (a batch's inner steps last until its slowest row has its drafts); and the
    output is autoregressive decoding's, alone and in a hybrid."""
    model, draft = counting_target, small_drafts[inner]
    reference, _ = generate(model, PROMPTS, Plan(GenerationConfig(32)))
    staged = staged_drafter(draft, inner, gamma=4)
    out, stats = generate(model, PROMPTS, Plan(GenerationConfig(32), drafter=staged))
    assert out == reference
    _, plain = generate(model, PROMPTS, Plan(GenerationConfig(32), drafter=draft_model_drafter(draft, gamma=4)))
    assert (stats.drafted, stats.accepted) == (plain.drafted, plain.accepted)
    assert stats.method == "staged" and stats.method_params["inner"] == inner
    # the draft's own heads, trained on the same counting, pass often; lookup finds little in counting sequences
    assert (
        stats.draft_forwards < plain.draft_forwards
        if inner == "heads"
        else stats.draft_forwards <= plain.draft_forwards
    )
    hybrid, _ = generate(model, PROMPTS, Plan(GenerationConfig(32), HeadsSettings(heads=3), staged))
    assert hybrid == reference
    alone, _ = generate(model, PROMPTS[1:2], Plan(GenerationConfig(32), drafter=staged))
    assert alone == reference[1:2]


def test_a_sampled_staged_draft_whose_lookup_finds_nothing_decodes(small_drafts):
    """Sampling, an inner step after which no row's lookup finds a match (one-token prompts: nothing before the last
    token to match) leaves no inner drafts to verify, and their laws an empty stack: the draft decodes on."""
    draft = small_drafts["lookup"]
    for seed in range(3):
        plan = Plan(GenerationConfig(8, temperature=1.0, seed=seed), drafter=staged_drafter(draft, "lookup", gamma=3))
        out, _ = generate(draft, [[1], [2]], plan)
        assert [len(row) for row in out] == [8, 8]


def staged_tables() -> torch.Tensor:
    """A draft with two heads: head 1 the draft of test_drafters (far from the target), head 2 proposing a+2 and a+3
    after token a, often wrong about what head 1 samples next: inner drafts pass at some steps only."""
    head2 = torch.full((1, 5, 5), -1e4)
    for a in range(5):
        head2[0, a, (a + 2) % 5], head2[0, a, (a + 3) % 5] = math.log(0.6), math.log(0.4)
    return torch.cat([draft_tables(), head2])


@pytest.mark.slow  # about 6 s a case: with the everyday suite near its 6-minute budget, CI's slow run has them
@pytest.mark.parametrize(
    ("inner", "decoding"),
    [("heads", {}), ("lookup", {}), ("heads", dict(temperature=0.7, top_p=0.9)), ("heads", dict(heads=3))],
    ids=["heads", "lookup", "heads-T0.7-topp0.9", "hybrid"],
)
def test_staged_sampling_has_the_autoregressive_distribution(inner, decoding):
    drafter = staged_drafter(fixed_logits_model(staged_tables() if inner == "heads" else draft_tables()), inner)
    tables = counting_tables(3) if decoding.get("heads", 1) > 1 else None
    tv, threshold, outside, stats = check_drafter(drafter, gamma=3, tables=tables, **decoding)
    assert sum(stats.accepted) > 0.2 * sum(stats.drafted)
    assert outside == 0, "sampled a continuation the target gives probability 0"
    assert tv < threshold, f"total variation {tv:.4f} >= {threshold:.4f}"


@pytest.mark.slow
def test_staged_drafts_verified_against_their_inner_proposals_fail_the_check(monkeypatch):
    """A negative control: the target verifies each staged draft against the law of the draft model one position
    later (a law misaligned with its draft)."""
    from mtp.decode.methods import draft_model

    chains = draft_model.StagedDrafter.draft_chains

    def misaligned(self, gamma, draws):
        tokens, probs = chains(self, gamma, draws)
        return tokens, probs.roll(1, dims=1) if probs is not None else None

    monkeypatch.setattr(draft_model.StagedDrafter, "draft_chains", misaligned)
    drafter = staged_drafter(fixed_logits_model(staged_tables()), "heads")
    tv, threshold, outside, _ = check_drafter(drafter, gamma=3, rows=15_000)
    assert outside > 0 or tv >= threshold, f"total variation {tv:.4f} < {threshold:.4f}"


@pytest.mark.parametrize(
    "decoding", [dict(drafts_per_step=2), dict(heads=3), dict(staged="heads"), dict(staged="heads", heads=3)]
)
def test_int8_draft_sequences_hybrids_and_staged_drafts_equal_autoregressive(decoding, counting_target, small_drafts):
    """int8 drafts (the draft model's, its heads' when staged, the target's heads in a hybrid) propose only: greedy
    output stays autoregressive decoding's."""
    model = counting_target
    reference, _ = generate(model, PROMPTS, Plan(GenerationConfig(32)))
    staged = decoding.pop("staged", None)
    draft = small_drafts["heads"]
    drafter = staged_drafter(draft, staged, gamma=3) if staged else draft_model_drafter(draft, gamma=3)
    plan = Plan(drafter=drafter).changed(max_new_tokens=32, draft_dtype="int8", **decoding)
    out, stats = generate(model, PROMPTS, plan)
    assert out == reference, decoding
    assert 0 < sum(stats.accepted) < sum(stats.drafted)


@pytest.mark.parametrize("choice", ["top", "tempered"])
def test_a_staged_draft_refuses_other_drafts_than_its_own_when_sampling(choice):
    drafter = staged_drafter(fixed_logits_model(staged_tables()), "heads", gamma=3)
    with pytest.raises(SettingError, match="a staged draft samples its drafts .* use draft_choice=auto with it"):
        Plan(GenerationConfig(4, temperature=1.0), drafter=drafter, drafts=DraftSettings(draft_choice=choice))
