"""Self-speculative sampling is lossless: its output is distributed exactly as autoregressive sampling from head 1.

The check: the empirical joint distribution of the first tokens of many independent rows, against the exact
joint computed by enumeration from an independent implementation of temperature / top-k / top-p, must lie
within a total-variation threshold derived from the sample size alone. Its power is shown by negative
controls: each plausible wrong rule, swapped in, fails the same check on the same model.
"""

import itertools
import math

import pytest
import torch

from mtp.decode import GenerationConfig, generate
from mtp.decode import acceptance as acceptance_module
from mtp.decode import inference as inference_module
from mtp.decode import sampling as sampling_module
from mtp.decode.plan import Plan
from mtp.decode.sampling import processed_probs
from mtp.decode.settings import DraftSettings, HeadsSettings
from mtp.decode.tree import DraftTree
from tests.decode.helpers import HEAD_TYPES, NEVER, fixed_logits_model, head1_logits, tiny_model

VOCAB = 5
N_SAMPLES = 40_000
FALSE_ALARM = 1e-6
PROMPT = [1]


def counting_tables(n_future: int) -> torch.Tensor:
    """Logit tables (n_future, V, V) where drafts are often accepted but proposals differ sharply from the target.

    Head 1 (the target) after token a: a+1 (0.55), a+2 (0.30), a+3 (0.15), never a or a+4. Head j proposes
    the token j steps ahead from a+j (0.35), a+j+1 (0.40) and a+j+3 (0.25): after the most likely path its
    third choice lies outside the target's support, and it never proposes a+j+2, which the target allows.
    """
    tables = torch.full((n_future, VOCAB, VOCAB), NEVER)
    for a in range(VOCAB):
        for step, prob in ((1, 0.55), (2, 0.30), (3, 0.15)):
            tables[0, a, (a + step) % VOCAB] = math.log(prob)
        for j in range(2, n_future + 1):
            for step, prob in ((j, 0.35), (j + 1, 0.40), (j + 3, 0.25)):
                tables[j - 1, a, (a + step) % VOCAB] = math.log(prob)
    return tables


def reference_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> list[float]:
    """Temperature, then top-k, then top-p over the renormalized rest, written out token by token in float64."""
    scaled = [x / temperature for x in logits.double().tolist()]
    order = sorted(range(len(scaled)), key=lambda i: -scaled[i])
    kept = order[:top_k] if top_k else order
    peak = scaled[kept[0]]
    weights = {i: math.exp(scaled[i] - peak) for i in kept}
    total = sum(weights.values())
    nucleus, mass = [], 0.0
    for i in kept:  # most likely first: keep the smallest prefix whose mass reaches top_p
        if mass >= top_p:
            break
        nucleus.append(i)
        mass += weights[i] / total
    norm = sum(weights[i] for i in nucleus)
    return [weights[i] / norm if i in nucleus else 0.0 for i in range(len(scaled))]


def exact_joint(tables: torch.Tensor, plan: Plan, length: int) -> dict[tuple[int, ...], float]:
    """Probability of every continuation of ``length`` tokens of PROMPT under autoregressive sampling from head 1."""
    config = plan.sampling
    step = [reference_probs(tables[0, a], config.temperature, config.top_k, config.top_p) for a in range(VOCAB)]
    joint = {}
    for continuation in itertools.product(range(VOCAB), repeat=length):
        p, previous = 1.0, PROMPT[-1]
        for token in continuation:
            p, previous = p * step[previous][token], token
        if p > 0:
            joint[continuation] = p
    return joint


def tv_threshold(joint: dict, n: int, false_alarm: float = FALSE_ALARM) -> float:
    """A total variation that n samples drawn from ``joint`` itself exceed with probability below ``false_alarm``.

    E[TV] <= 1/2 sum_x sqrt(p(1 - p) / n) (Jensen, outcome by outcome); one sample moves the empirical TV by at
    most 1/n, so McDiarmid's inequality gives P(TV >= E[TV] + t) <= exp(-2 n t^2).
    """
    expected = 0.5 * sum(math.sqrt(p * (1 - p) / n) for p in joint.values())
    return expected + math.sqrt(math.log(1 / false_alarm) / (2 * n))


def sample_continuations(model, plan: Plan, n: int) -> list[tuple[int, ...]]:
    out, stats = generate(model, [PROMPT] * n, plan)
    assert all(len(row) == plan.sampling.max_new_tokens for row in out)  # no EOS here: every row runs to the budget
    return [tuple(row) for row in out]


def total_variation(samples: list[tuple[int, ...]], joint: dict) -> float:
    counts: dict[tuple[int, ...], int] = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    outcomes = set(counts) | set(joint)
    return 0.5 * sum(abs(counts.get(x, 0) / len(samples) - joint.get(x, 0.0)) for x in outcomes)


def check(heads: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 11, **decoding):
    """(total variation, threshold, samples outside the target's support) of self-speculative sampling; ``decoding``:
    more GenerationConfig settings (a tree, adaptive drafting, an acceptance rule)."""
    # heads + 1 tokens: the prefill's token, the first verified drafts, and the token after them (bonus or resampled)
    config = Plan().changed(
        max_new_tokens=heads + 1, temperature=temperature, top_k=top_k, top_p=top_p, heads=heads, seed=seed, **decoding
    )
    tables = counting_tables(heads)
    joint = exact_joint(tables, config, heads + 1)
    samples = sample_continuations(fixed_logits_model(tables), config, N_SAMPLES)
    outside = sum(s not in joint for s in samples)
    return total_variation(samples, joint), tv_threshold(joint, N_SAMPLES), outside


CASES = {
    "2heads": dict(heads=2),
    "3heads_T0.7_topp0.9": dict(heads=3, temperature=0.7, top_p=0.9),
    "3heads_T1.5_topk2": dict(heads=3, temperature=1.5, top_k=2),
    "4heads": dict(heads=4),
    "3heads_T0.7_topp0.9_top_drafts": dict(heads=3, temperature=0.7, top_p=0.9, draft_choice="top"),
    "3heads_T0.7_topp0.9_sampled_drafts": dict(heads=3, temperature=0.7, top_p=0.9, draft_choice="sampled"),
}


def variants(cases: dict, slow: set[str]) -> list:
    """``cases`` as parameters named by their keys; those in ``slow`` (each another variant of a promise an everyday
    variant already checks) run with the slow tests."""
    assert slow <= set(cases), slow - set(cases)
    return [
        pytest.param(case, id=name, marks=[pytest.mark.slow] if name in slow else []) for name, case in cases.items()
    ]


@pytest.mark.parametrize(
    "case", variants(CASES, {"4heads", "3heads_T0.7_topp0.9", "3heads_T1.5_topk2", "3heads_T0.7_topp0.9_top_drafts"})
)
def test_self_speculative_sampling_has_the_autoregressive_distribution(case):
    tv, threshold, outside = check(**case)
    assert outside == 0, "sampled a continuation the target gives probability 0"
    assert tv < threshold, f"total variation {tv:.4f} >= {threshold:.4f}"


def test_the_fixed_logits_model_gives_its_tables():
    tables = counting_tables(3)
    model = fixed_logits_model(tables)
    with torch.no_grad():
        logits = model(torch.arange(VOCAB)[None])[:, 0]  # (3, V, V): every head after every token
    finite = tables > NEVER
    torch.testing.assert_close(logits[finite], tables[finite], rtol=0, atol=1e-4)
    assert (processed_probs(logits, 1.0)[~finite] == 0).all()


def test_autoregressive_sampling_passes_the_same_check():
    config = Plan(GenerationConfig(4, temperature=0.7, top_p=0.9, seed=3), heads=HeadsSettings(heads=1))
    joint = exact_joint(counting_tables(1), config, 4)
    samples = sample_continuations(fixed_logits_model(counting_tables(1)), config, N_SAMPLES)
    assert total_variation(samples, joint) < tv_threshold(joint, N_SAMPLES)


def _wrong_rules():
    right_correction = acceptance_module.correction_probs
    return {
        # accept with probability min(1, q): ignores how likely the proposal made the draft
        "accept_with_target_probability": ("accept_drafts", lambda u, p, q: u < q),
        # after a rejection, sample from q itself instead of normalize(max(0, q - p))
        "resample_from_target": ("correction_probs", lambda q, p, rejected: q),
        # the bonus token (every draft passed) taken from the residual of the last draft's proposal
        "bonus_from_residual": (
            "correction_probs",
            lambda q, p, rejected: right_correction(q, p, torch.ones_like(rejected)),
        ),
        # the bonus token taken from the last head's proposal instead of the target
        "bonus_from_proposal": (
            "correction_probs",
            lambda q, p, rejected: torch.where(rejected[:, None], right_correction(q, p, rejected), p),
        ),
        # temperature and top-p shape the proposal but not the target
        "unprocessed_target": ("Rule.target", lambda self, logits: torch.softmax(logits.float(), dim=-1)),
    }


@pytest.mark.slow
@pytest.mark.parametrize("rule", _wrong_rules().keys())
def test_each_wrong_rule_fails_the_check(rule, monkeypatch):
    name, wrong = _wrong_rules()[rule]
    monkeypatch.setattr(f"mtp.decode.acceptance.{name}", wrong)
    tv, threshold, outside = check(**CASES["3heads_T0.7_topp0.9"])
    assert outside > 0 or tv >= threshold, f"{rule}: total variation {tv:.4f} < {threshold:.4f}"


def test_threshold_shrinks_with_the_sample_size():
    joint = {(0,): 0.5, (1,): 0.25, (2,): 0.25}
    assert tv_threshold(joint, 40_000) == pytest.approx(tv_threshold(joint, 10_000) / 2)


HEAD_BLOCK_CASES = {
    "plain": ("transformer", {}, 0),
    "top_k": ("transformer", {"top_k": 3}, 0),
    "top_p": ("transformer", {"top_p": 0.9}, 0),
    "top_p-sampled_drafts": ("transformer", {"top_p": 0.9, "draft_choice": "sampled"}, 0),
    "causal": ("causal", {}, 0),
    "causal-shared-top_p": ("causal-shared", {"top_p": 0.9}, 0),
    "draft-vocab-top_p": ("transformer", {"top_p": 0.9}, 2),
    "medusa-draft-vocab": ("medusa", {}, 3),
    "causal-decode-draft-vocab-top_p": ("causal", {"top_p": 0.9, "draft_first_ids": 2}, 0),
    "medusa-decode-draft-vocab": ("medusa", {"draft_first_ids": 3}, 0),
    "eagle3-top_p": ("eagle3", {"top_p": 0.9}, 0),
    "eagle3-draft-vocab": ("eagle3", {}, 3),
}
"""(head type, sampling settings, trained draft vocabulary)."""
SLOW_HEAD_BLOCK_CASES = set(HEAD_BLOCK_CASES) - {"plain", "causal", "draft-vocab-top_p", "eagle3-top_p"}
"""Run with the slow tests (the everyday suite keeps parallel, causal and eagle3 heads and a trained draft
vocabulary)."""


@pytest.mark.parametrize(
    ("head_type", "filters", "draft_vocab"),
    [
        pytest.param(*case, id=name, marks=[pytest.mark.slow] if name in SLOW_HEAD_BLOCK_CASES else [])
        for name, case in HEAD_BLOCK_CASES.items()
    ],
)
def test_lossless_with_head_blocks(head_type, filters, draft_vocab):
    """The same check on a random model with head blocks, where every context changes the logits; with a reduced
    draft vocabulary (trained, or the first token ids chosen at decoding), the drafts never propose the tokens outside
    it, which the target still gives."""
    settings = {**HEAD_TYPES[head_type], "draft_vocab": draft_vocab}
    model = tiny_model(n_future=3, vocab_size=4, seed=3, **settings)
    with torch.no_grad():
        model.heads.outputs[0].weight.mul_(60)  # peaked distributions, so that heads disagree with head 1
    config = Plan().changed(max_new_tokens=3, temperature=1.0, heads=3, seed=11, **filters)
    check_real_model(model, config)


def check_real_model(model, plan: Plan, rows: int = 12_000):
    """Sample ``rows`` continuations of [1, 2] with ``plan`` and check them against the exact joint of head 1's
    sampling (from full forwards, no cache), enumerated over the model's 4 tokens; returns the decoding statistics."""
    joint, config = {}, plan.sampling
    with torch.no_grad():
        for continuation in itertools.product(range(4), repeat=config.max_new_tokens):
            logits = head1_logits(model, torch.tensor([[1, 2, *continuation]]))[0]  # head 1, (2 + length, V)
            p = 1.0
            for i, token in enumerate(continuation):
                p *= reference_probs(logits[1 + i], config.temperature, config.top_k, config.top_p)[token]
            if p > 0:
                joint[continuation] = p
    out, stats = generate(model, [[1, 2]] * rows, plan)
    samples = [tuple(row) for row in out]
    assert all(s in joint for s in samples)
    assert total_variation(samples, joint) < tv_threshold(joint, rows)
    return stats


@pytest.mark.parametrize("seed", range(20))
def test_processed_probs_equal_the_reference(seed):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(9, generator=generator) * 2
    temperature = [0.5, 1.0, 1.7][seed % 3]
    top_k = [0, 1, 3, 9][seed % 4]
    top_p = [1.0, 0.5, 0.9, 0.99, 0.2][seed % 5]
    expected = torch.tensor(reference_probs(logits, temperature, top_k, top_p), dtype=torch.float64)
    torch.testing.assert_close(processed_probs(logits, temperature, top_k, top_p).double(), expected, atol=1e-6, rtol=0)


# -- trees, adaptive drafting, typical acceptance: the same check
TREE = DraftTree([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0)])
"""Three candidates at depth 1 (the third often outside the target's support), two below the first, chains below."""

DRAFTING = {
    "tree": dict(heads=4, tree=TREE),
    "tree_T0.7_topp0.9": dict(heads=4, temperature=0.7, top_p=0.9, tree=TREE),
    "chain_adaptive": dict(heads=4, adaptive_drafts=True),
    "tree_independent_siblings": dict(heads=4, tree=TREE, sibling_draws="independent"),
    "tree_top_drafts": dict(heads=4, tree=TREE, draft_choice="top"),
    "tree_T0.7_topp0.9_sampled_drafts": dict(heads=4, temperature=0.7, top_p=0.9, tree=TREE, draft_choice="sampled"),
}


@pytest.mark.parametrize("case", variants(DRAFTING, set(DRAFTING) - {"tree", "chain_adaptive"}))
def test_tree_and_adaptive_sampling_have_the_autoregressive_distribution(case):
    tv, threshold, outside = check(**case)
    assert outside == 0, "sampled a continuation the target gives probability 0"
    assert tv < threshold, f"total variation {tv:.4f} >= {threshold:.4f}"


def test_tree_sampling_with_leaves_unembedded_apart(monkeypatch):
    """The same check when head 1 is unembedded after the nodes with children, and after an accepted leaf apart."""
    monkeypatch.setattr(inference_module, "LEAVES_UNEMBEDDED_AT_ONCE", 0)
    tv, threshold, outside = check(**DRAFTING["tree"])
    assert outside == 0 and tv < threshold, f"total variation {tv:.4f} >= {threshold:.4f}"


def _wrong_tree_rules():
    return {
        # each sibling tested against the unnormalized rest of the target: later siblings pass too rarely
        "sibling_without_renormalizing": ("sibling_passes", lambda u, remaining, q, p: u * p < q),
        # a sibling's test ignores how likely its proposal made it (as if it were the top-ranked, one-hot candidate)
        "sibling_ignores_its_proposal": ("sibling_passes", lambda u, remaining, q, p: u * remaining.sum(-1) < q),
        # later siblings tested against the full target, as if no sibling had been rejected before them
        "rejection_leaves_the_target": ("residual_after_rejection", lambda remaining, proposal, rejected: remaining),
    }


@pytest.mark.slow
@pytest.mark.parametrize("rule", _wrong_tree_rules().keys())
def test_each_wrong_tree_rule_fails_the_check(rule, monkeypatch):
    name, wrong = _wrong_tree_rules()[rule]
    monkeypatch.setattr(acceptance_module, name, wrong)
    tv, threshold, outside = check(**DRAFTING["tree"])
    assert outside > 0 or tv >= threshold, f"{rule}: total variation {tv:.4f} < {threshold:.4f}"


@pytest.mark.slow
def test_typical_acceptance_is_lossy_and_the_check_sees_it():
    """Typical acceptance, documented as lossy, must fail the check: evidence the check would catch a lossy tree."""
    tv, threshold, _ = check(**DRAFTING["tree"], acceptance="typical")
    assert tv >= threshold


REAL_MODEL_DRAFTING = {
    "tree-transformer": ("transformer", dict(tree=DraftTree([(0,), (1,), (2,), (0, 0), (1, 0), (0, 1)]))),
    "tree-transformer-independent": (
        "transformer",
        dict(tree=DraftTree([(0,), (1,), (2,), (0, 0), (1, 0), (0, 1)]), sibling_draws="independent"),
    ),
    "tree-causal": ("causal", dict(tree=DraftTree([(0,), (1,), (0, 0), (0, 1)]))),
    "tree-p_min": ("medusa", dict(tree=DraftTree([(0,), (1,), (0, 0), (1, 0)]), draft_p_min=0.4)),
    "chain-p_min": ("medusa", dict(draft_p_min=0.4)),
    "tree-causal-top_drafts": ("causal", dict(tree=DraftTree([(0,), (1,), (0, 0), (0, 1)]), draft_choice="top")),
    "chain-transformer-top_drafts": ("transformer", dict(draft_choice="top")),
    "tree-eagle3": ("eagle3", dict(tree=DraftTree([(0,), (1,), (0, 0), (0, 1)]))),
}


SLOW_REAL_MODEL_DRAFTING = tuple(set(REAL_MODEL_DRAFTING) - {"tree-causal"})  # 3-5 s each; a causal tree everyday


@pytest.mark.parametrize(  # these variants with the slow tests
    "head_type, decoding",
    [
        pytest.param(*case, id=name, marks=[pytest.mark.slow] if name in SLOW_REAL_MODEL_DRAFTING else [])
        for name, case in REAL_MODEL_DRAFTING.items()
    ],
)
def test_tree_and_cut_sampling_lossless_with_head_blocks(head_type, decoding):
    """On a random model whose every context changes the logits (so the tree mask, the kept path and the confidence
    that cuts drafting all matter): four sampled tokens against the exact joint."""
    model = tiny_model(n_future=3, vocab_size=4, seed=3, **HEAD_TYPES[head_type])
    with torch.no_grad():
        model.heads.outputs[0].weight.mul_(60)  # peaked distributions, so that heads disagree with head 1
        if head_type == "medusa":  # heads of their own, head 2 surer than head 3: drafting is cut at either depth
            model.heads.outputs[1].weight.mul_(8)
            model.heads.outputs[2].weight.mul_(4)
    config = Plan().changed(max_new_tokens=4, temperature=1.0, heads=3, seed=5, **decoding)
    stats = check_real_model(model, config)
    if config.heads.draft_p_min:  # the cut happened, at some steps and not at others
        assert 0 < stats.drafted[1] < stats.drafted[0] < stats.forwards * 12_000


@pytest.mark.parametrize("scale", [8.0, 0.5], ids=["narrow_nucleus", "wide_nucleus"])
def test_top_p_over_a_large_vocabulary_equals_the_full_sort(scale, monkeypatch):
    """The CPU nucleus (among NumPy's candidates) is the one a full sort gives (the path of other devices), and the
    reference's."""
    logits = torch.randn(6, 5000, generator=torch.Generator().manual_seed(0)) * scale
    fast = processed_probs(logits, 0.8, top_p=0.9)
    probs = torch.softmax(logits / 0.8, dim=-1)
    on_cpu = sampling_module.nucleus_floor(probs, 0.9)
    not_cpu = lambda *_: pytest.fail("not the path other devices take")  # noqa: E731
    monkeypatch.setattr(sampling_module, "nucleus_candidates", not_cpu)
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("meta")))
    elsewhere = sampling_module.nucleus_floor(probs, 0.9)
    monkeypatch.undo()
    torch.testing.assert_close(on_cpu, elsewhere, rtol=0, atol=0)
    for row in range(6):
        expected = torch.tensor(reference_probs(logits[row], 0.8, 0, 0.9), dtype=torch.float64)
        torch.testing.assert_close(fast[row].double(), expected, atol=1e-6, rtol=0)


def test_top_p_keeps_a_tie_at_the_nucleus_edge_whole():
    """Hand-made: 0.4 + 0.2 reaches top-p 0.55; the other 0.2 is as likely as the last kept token, so it stays too
    (whatever order a sort leaves the two in); 0.1 and 0.1 go."""
    probs = processed_probs(torch.tensor([0.4, 0.2, 0.1, 0.2, 0.1]).log(), 1.0, top_p=0.55)
    torch.testing.assert_close(probs, torch.tensor([0.5, 0.25, 0.0, 0.25, 0.0]))
    just_over = processed_probs(torch.tensor([0.4, 0.2, 0.1, 0.2, 0.1]).log(), 1.0, top_p=0.39)
    torch.testing.assert_close(just_over, torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0]))


@pytest.mark.parametrize(
    ("choice", "device", "nucleus"),
    [("sampled", "cpu", True), ("tempered", "cpu", False), ("auto", "cpu", False), ("auto", "cuda", True)],
)
def test_sampled_drafts_come_from_the_law_the_choice_names(choice, device, nucleus):
    """sampled: the heads' law after temperature, top-k and top-p, as the target's; tempered (auto on CPU): after
    temperature and top-k only, so that no nucleus is sorted out."""
    from mtp.decode.heads_proposer import HeadsProposer

    config = Plan(
        GenerationConfig(temperature=0.5, top_k=4, top_p=0.6),
        heads=HeadsSettings(heads=3),
        drafts=DraftSettings(draft_choice=choice),
    )
    assert config.proposal_top_p(torch.device(device)) == (0.6 if nucleus else 1.0)
    assert config.proposal_top_p(torch.device(device), heads=False) == (1.0 if choice == "tempered" else 0.6)
    proposer = object.__new__(HeadsProposer)
    proposer.plan = config
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0]])
    expected = reference_probs(logits[0], 0.5, 4, 0.6 if choice == "sampled" else 1.0)
    torch.testing.assert_close(proposer.processed(logits)[0].double(), torch.tensor(expected, dtype=torch.float64))
