"""Drafters other than the heads (a draft model, layer skip, prompt lookup): greedy output equal to autoregressive
output, batch 1 and ragged; sampling with the autoregressive distribution, with negative controls that must fail."""

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from mtp.decode import GenerationConfig, generate
from mtp.decode import acceptance as acceptance_module
from mtp.decode.heads_proposer import HeadsProposer
from mtp.decode.inference import InferenceModel
from mtp.decode.methods import Target, prompt_lookup
from mtp.decode.methods.draft_model import ModelDrafter, draft_model_drafter
from mtp.decode.methods.layer_skip import layer_skip_drafter
from mtp.decode.methods.prompt_lookup import LookupDrafter
from mtp.decode.plan import Drafting, Plan, Proposer
from mtp.decode.settings import DraftSettings, HeadsSettings
from tests.decode.helpers import NEVER, fixed_logits_model, head1_logits, tiny_model, train_on_cycles
from tests.decode.test_lossless import check_real_model, reference_probs, total_variation, tv_threshold
from tests.decode.test_tree import partly_trained

VOCAB = 5


def drafter_for(method: str, target, vocab_size: int):
    """A fresh drafter of each kind for ``target``: a separately trained small model, the target without two of its
    blocks, prompt lookup on bigrams."""
    if method == "draft":
        draft = train_on_cycles(tiny_model(n_future=1, vocab_size=vocab_size, seed=7), steps=15)
        return draft_model_drafter(draft)
    if method == "layerskip":
        return layer_skip_drafter(target, frozenset({1}))
    return LookupDrafter(2, vocab_size, "cpu")


@pytest.fixture(scope="module")
def counting_target():
    return partly_trained("transformer")


@pytest.mark.parametrize("method", ["draft", "layerskip", "lookup"])
def test_greedy_drafting_equals_autoregressive(method, counting_target):
    model = counting_target
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 40, (n,), generator=generator).tolist() for n in (5, 2, 9, 3)]
    prompts[2][4:7] = prompts[2][:3]  # a repeated trigram in one prompt, for lookup to find
    reference, _ = generate(model, prompts, Plan(GenerationConfig(48), HeadsSettings(heads=1)))
    drafter = drafter_for(method, model, 40)
    for gamma, decoding in ((4, {}), (3, dict(adaptive_drafts=True))):
        out, stats = generate(
            model, prompts, Plan(drafter=drafter.with_gamma(gamma)).changed(max_new_tokens=48, **decoding)
        )
        assert out == reference, decoding
        assert 0 < sum(stats.accepted) < sum(stats.drafted)  # drafts pass at some steps, not at all
        assert stats.method == method and f"method={method}" in stats.line()
    alone, _ = generate(model, prompts[1:2], Plan(GenerationConfig(48), drafter=drafter.with_gamma(2)))
    assert alone == reference[1:2]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_target_as_its_own_draft_accepts_every_draft(temperature, counting_target):
    """Drafting with the target itself proposes exactly what it verifies, whatever the step: any slip of the draft's
    cache (a position kept or dropped wrongly at a step's rollback, a ragged row misread) shows as a rejection."""
    model = counting_target
    prompts = [[3, 9, 1, 4, 4], [7], [2, 2, 2, 30, 31, 5, 6, 8, 11]]
    config = Plan(
        GenerationConfig(40, temperature, seed=2),
        drafter=draft_model_drafter(model, gamma=3),
        drafts=DraftSettings(adaptive_drafts=temperature > 0),
    )
    reference, _ = generate(model, prompts, Plan(GenerationConfig(40, temperature, seed=2)))
    out, stats = generate(model, prompts, config)
    assert stats.accepted == stats.drafted and stats.drafted[0] > 0
    assert stats.method == "draft"
    if temperature == 0:  # sampled, the drafts come from other draws than autoregressive decoding's tokens
        assert out == reference
        assert stats.draft_forwards == 3 * (stats.forwards - 1)


def test_every_proposer_names_its_own_method():
    """The statistics say who drafted: a proposer that does not say so fails, rather than reporting the heads."""

    class Unnamed(Proposer):
        pass

    with pytest.raises(AttributeError):
        getattr(Unnamed(), "method")  # noqa: B009  (the attribute access is what is tested)
    assert (HeadsProposer.method, LookupDrafter.method) == ("heads", "lookup")


class CheckedDrafter(ModelDrafter):
    """A draft model's drafter that checks every proposal (sampling at temperature 1) against the draft model's own
    distributions after the row's true sequence and the drafts before, computed by full forwards without a cache."""

    def __init__(self, draft):
        super().__init__(InferenceModel.of(draft, 1))
        self.draft, self.checked = draft, 0

    def start(self, prompts, max_len, config=None):
        super().start(prompts, max_len, config)
        self.truth = [list(p) for p in prompts]

    def advance(self, accepted, emitted):
        super().advance(accepted, emitted)
        self.truth = [t + e for t, e in zip(self.truth, emitted, strict=True)]

    def keep_rows(self, rows, index):
        super().keep_rows(rows, index)
        self.truth = [self.truth[r] for r in rows]

    def propose(self, gamma, draws):
        proposal = super().propose(gamma, draws)
        drafts, probs = proposal.tokens, proposal.probs
        for row, tokens in enumerate(self.truth):
            sequence = torch.tensor([tokens + drafts[row, :-1].tolist()])
            expected = head1_logits(self.draft, sequence)[0, len(tokens) - 1 :].softmax(dim=-1)  # (gamma, V)
            torch.testing.assert_close(probs[row], expected, atol=1e-5, rtol=0, msg=f"row {row} at {len(tokens)}")
            self.checked += 1
        return proposal


def test_draft_model_proposals_follow_the_accepted_tokens(counting_target):
    """Every proposal of a draft model that the target often rejects is the draft model's own distribution after the
    accepted tokens: its cache keeps exactly the accepted drafts it read, reads what it has not seen, drops padding."""
    draft = train_on_cycles(tiny_model(n_future=1, vocab_size=40, seed=7), steps=15)
    drafter = CheckedDrafter(draft)
    prompts = [[3, 9, 1, 4, 4], [7], [2, 2, 2, 30, 31, 5, 6, 8, 11]]
    for gamma, decoding in ((3, {}), (4, dict(adaptive_drafts=True))):
        drafter.gamma = gamma  # this one drafter counts its checks
        _, stats = generate(
            counting_target, prompts, Plan(drafter=drafter).changed(max_new_tokens=30, temperature=1.0, **decoding)
        )
        assert 0 < sum(stats.accepted) < sum(stats.drafted) and drafter.checked > 20


def triple(proposal):
    return proposal.tokens, proposal.probs, proposal.counts


def test_lookup_drafts_the_latest_continuation():
    lookup = LookupDrafter(3, 10, "cpu")
    lookup.start([[1, 2, 3, 9, 1, 2, 4, 5, 1, 2], [7, 8]], 64)
    drafts, probs, counts = triple(lookup.propose(3, None))
    assert counts == [3, 0]  # (1, 2) occurred twice: the latest was followed by 4, 5, 1; row 2's (7, 8) never before
    assert drafts[0].tolist() == [4, 5, 1] and probs is None
    lookup.advance([0, 0], [[3], [7]])  # row 1 ends in (1, 2, 3), seen at the start; row 2 in 7, seen before 8
    lookup.sampled = True  # drafts with their one-hot proposals, as when sampling
    drafts, probs, counts = triple(lookup.propose(2, None))
    assert counts == [2, 2] and drafts.tolist() == [[9, 1], [8, 7]]  # row 2: 7, 8, 7 -> 8, 7 (period 2)
    assert probs[0, 0].tolist() == [0.0] * 9 + [1.0]  # one-hot: the draft itself
    lookup.advance([0, 0], [[5], [9]])  # row 1: no earlier (2, 3, 5) or (3, 5), but 5 before 1; row 2: 9 is new
    lookup.sampled = False
    drafts, _, counts = triple(lookup.propose(2, None))
    assert counts == [2, 0] and drafts[0].tolist() == [1, 2]
    repeating = LookupDrafter(3, 10, "cpu")
    repeating.start([[6, 4, 4, 4], [5, 3, 5, 3, 5]], 64)  # the latest matches end one and two tokens before the end
    drafts, _, counts = triple(repeating.propose(5, None))
    assert counts == [5, 5] and drafts.tolist() == [[4] * 5, [3, 5, 3, 5, 3]]


def test_bad_drafter_settings_are_refused(counting_target):
    with pytest.raises(ValueError, match="some but not all"):
        layer_skip_drafter(counting_target, frozenset(range(len(counting_target.layers))))
    with pytest.raises(ValueError, match="some but not all"):
        layer_skip_drafter(counting_target, frozenset({len(counting_target.layers)}))
    with pytest.raises(ValueError, match="no draft_p_min"):
        Plan(GenerationConfig(8), heads=HeadsSettings(draft_p_min=0.5), drafter=LookupDrafter(1, 40, "cpu", gamma=2))
    with pytest.raises(ValueError, match="drafts_per_step=2 needs drafts"):
        Plan(GenerationConfig(8), drafts=DraftSettings(drafts_per_step=2))
    with pytest.raises(ValueError, match="gamma=0 must be at least 1 with a drafter"):
        Plan(GenerationConfig(8), drafter=LookupDrafter(1, 40, "cpu", gamma=0))
    with pytest.raises(ValueError, match="ngram"):
        LookupDrafter(0, 40, "cpu")
    short = draft_model_drafter(tiny_model(n_future=1, vocab_size=40, max_seq_len=16))
    with pytest.raises(ValueError, match=r"the draft model's context \(16 tokens\) is below the 2"):
        generate(counting_target, [list(range(12))], Plan(GenerationConfig(8), drafter=short.with_gamma(2)))


# -- lossless sampling: the exact joint of head 1's sampling against many sampled rows
N_SAMPLES = 40_000
PROMPT = [0, 1, 2, 3, 4, 0, 1]
"""Its last bigram occurred before, followed by 2, 3: prompt lookup drafts the target's likeliest path."""


def step_tables(steps: tuple[tuple[int, float], ...]) -> torch.Tensor:
    """Logits (1, V, V): after token a, token a + step with each step's probability, no other token."""
    tables = torch.full((1, VOCAB, VOCAB), NEVER)
    for a in range(VOCAB):
        for step, prob in steps:
            tables[0, a, (a + step) % VOCAB] = math.log(prob)
    return tables


def target_tables() -> torch.Tensor:
    """Head 1 after token a: a+1 (0.55), a+2 (0.30), a+3 (0.15)."""
    return step_tables(((1, 0.55), (2, 0.30), (3, 0.15)))


def draft_tables() -> torch.Tensor:
    """A draft that differs sharply: a+1 (0.35), a+2 (0.40), a+4 (0.25, outside the target's support); never a+3."""
    return step_tables(((1, 0.35), (2, 0.40), (4, 0.25)))


def check_drafter(
    drafter,
    gamma: int = 2,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 11,
    rows: int = N_SAMPLES,
    tables: torch.Tensor | None = None,
    **decoding,
):
    """(total variation, threshold, samples outside the support, statistics) of gamma + 2 tokens sampled with
    ``drafter`` from a target of logit ``tables`` (default :func:`target_tables`; head 1's are the target), with more
    GenerationConfig settings ``decoding`` (heads of a hybrid step, several draft sequences)."""
    length = gamma + 2  # the prompt step's token, gamma verified drafts, the token after them
    config = Plan(drafter=drafter.with_gamma(gamma)).changed(
        max_new_tokens=length, temperature=temperature, top_p=top_p, seed=seed, **decoding
    )
    tables = target_tables() if tables is None else tables
    step = [reference_probs(tables[0, a], temperature, 0, top_p) for a in range(VOCAB)]
    joint: dict[tuple[int, ...], float] = {}

    def enumerate_from(previous: int, prefix: tuple[int, ...], p: float) -> None:
        if len(prefix) == length:
            joint[prefix] = p
            return
        for token, q in enumerate(step[previous]):
            if q > 0:
                enumerate_from(token, prefix + (token,), p * q)

    enumerate_from(PROMPT[-1], (), 1.0)
    out, stats = generate(fixed_logits_model(tables), [PROMPT] * rows, config)
    samples = [tuple(row) for row in out]
    outside = sum(s not in joint for s in samples)
    return total_variation(samples, joint), tv_threshold(joint, rows), outside, stats


SAMPLING_DRAFTERS = {
    "draft": lambda: draft_model_drafter(fixed_logits_model(draft_tables())),
    "draft_T0.7_topp0.9": lambda: draft_model_drafter(fixed_logits_model(draft_tables())),
    "lookup": lambda: LookupDrafter(2, VOCAB, "cpu"),
    "draft_T0.7_topp0.9_sampled_drafts": lambda: draft_model_drafter(fixed_logits_model(draft_tables())),
    "draft_top_drafts": lambda: draft_model_drafter(fixed_logits_model(draft_tables())),
    "draft_sequences_top_drafts": lambda: draft_model_drafter(fixed_logits_model(draft_tables())),
}
SAMPLING_SETTINGS = {
    "draft": {},
    "draft_T0.7_topp0.9": dict(temperature=0.7, top_p=0.9),
    "lookup": {},
    "draft_T0.7_topp0.9_sampled_drafts": dict(temperature=0.7, top_p=0.9, draft_choice="sampled"),
    "draft_top_drafts": dict(temperature=0.7, top_p=0.9, draft_choice="top"),  # the draft model's greedy drafts
    "draft_sequences_top_drafts": dict(draft_choice="top", drafts_per_step=2),  # its 2 likeliest first tokens
}


SLOW_SAMPLING_DRAFTERS = {"draft", "draft_T0.7_topp0.9", "lookup"}
"""With the slow tests (3-6 s each) beside the top-ranked drafts' cases: the draft model's sampled drafts under
temperature and top-p run everyday, prompt lookup on a real model."""


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(case, marks=[pytest.mark.slow] if "top_drafts" in case or case in SLOW_SAMPLING_DRAFTERS else [])
        for case in SAMPLING_DRAFTERS
    ],
)
def test_drafted_sampling_has_the_autoregressive_distribution(case):
    tv, threshold, outside, stats = check_drafter(SAMPLING_DRAFTERS[case](), **SAMPLING_SETTINGS[case])
    # the drafts are accepted often enough to matter (top-ranked ones, by this target's probability of them: less)
    assert sum(stats.accepted) > (0.15 if "top_drafts" in case else 0.2) * sum(stats.drafted)
    assert outside == 0, "sampled a continuation the target gives probability 0"
    assert tv < threshold, f"total variation {tv:.4f} >= {threshold:.4f}"


def _flipped(propose):
    """A drafter's ``propose`` whose drafts are verified against another position's proposal."""

    def wrong(self, gamma, draws):
        proposal = propose(self, gamma, draws)
        return replace(proposal, probs=proposal.probs.flip(1) if proposal.probs is not None else None)

    return wrong


def _wrong_drafting():
    def uniform_lookup(propose):  # a lookup draft treated as one drawn uniformly, not as the token itself
        def wrong(self, gamma, draws):
            proposal = propose(self, gamma, draws)
            return replace(proposal, probs=torch.full_like(proposal.probs, 1 / proposal.probs.size(-1)))

        return wrong

    return {
        "draft_accepted_regardless_of_its_proposal": (
            "draft", (acceptance_module, "accept_drafts", lambda u, p, q: u < q)
        ),
        "draft_proposals_of_the_wrong_position": (
            "draft", (ModelDrafter, "propose", _flipped(ModelDrafter.propose))
        ),
        "lookup_proposal_not_one_hot": (
            "lookup", (prompt_lookup.LookupDrafter, "propose", uniform_lookup(LookupDrafter.propose))
        ),
        "lookup_no_residual": (
            "lookup", (acceptance_module, "correction_probs", lambda target, proposal, rejected: target)
        ),
    }  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("rule", _wrong_drafting().keys())
def test_each_wrong_drafting_rule_fails_the_check(rule, monkeypatch):
    case, (owner, name, wrong) = _wrong_drafting()[rule]
    monkeypatch.setattr(owner, name, wrong)
    # fewer rows than the positive checks: each control still fails by 3x to 11x (more rows only lower the threshold)
    tv, threshold, outside, _ = check_drafter(SAMPLING_DRAFTERS[case](), gamma=3, rows=15_000)
    assert outside > 0 or tv >= threshold, f"{rule}: total variation {tv:.4f} < {threshold:.4f}"


def real_model_drafter(method: str):
    """A random 4-token model with peaked head 1 and a drafter for it: a random draft model, the model without its
    first block, prompt lookup on unigrams."""
    model = tiny_model(n_future=1, vocab_size=4, seed=3)
    with torch.no_grad():
        model.heads.outputs[0].weight.mul_(60)  # peaked distributions, so that drafts disagree with the target
    if method == "draft":
        draft = tiny_model(n_future=1, vocab_size=4, seed=4)
        with torch.no_grad():
            draft.heads.outputs[0].weight.mul_(30)
        return model, draft_model_drafter(draft)
    if method == "layerskip":
        return model, layer_skip_drafter(model, frozenset({0}))
    return model, LookupDrafter(1, 4, "cpu")


@pytest.mark.slow
def test_layer_skip_with_proposals_of_the_wrong_position_fails_the_real_model_check(monkeypatch):
    monkeypatch.setattr(ModelDrafter, "propose", _flipped(ModelDrafter.propose))
    model, drafter = real_model_drafter("layerskip")
    with pytest.raises(AssertionError):
        config = Plan(GenerationConfig(max_new_tokens=4, temperature=1.0, seed=5), drafter=drafter.with_gamma(2))
        check_real_model(model, config)


@pytest.mark.parametrize(  # a draft model's case with the slow tests: everyday on the fixed tables
    "method", [pytest.param("draft", marks=pytest.mark.slow), "layerskip", "lookup"]
)
def test_drafted_sampling_lossless_on_real_models(method):
    """Attention everywhere (the target, a random draft model, the target without a block): every context changes the
    logits, so the drafters' caches and the rows' ragged acceptance all matter."""
    model, drafter = real_model_drafter(method)
    config = Plan(GenerationConfig(max_new_tokens=4, temperature=1.0, seed=5), drafter=drafter.with_gamma(2))
    stats = check_real_model(model, config)
    assert 0 < sum(stats.accepted) < sum(stats.drafted)


def test_a_plan_of_a_method_is_built_before_it_decodes(counting_target):
    """A plan holds what drafts (a method of its settings, and its gamma) until it is built for a target; generate
    decodes only a built plan, and a built plan builds to itself."""
    lookup = prompt_lookup.PromptLookup(prompt_lookup.PromptLookupSettings(prompt_lookup=2))
    spec = Plan(GenerationConfig(8), drafter=Drafting(lookup, gamma=3))
    assert not spec.built and spec.gamma == 3 and spec.step_drafts == 3
    with pytest.raises(TypeError, match="decodes a built plan"):
        generate(counting_target, [[1, 2, 3]], spec)
    target = Target(SimpleNamespace(config=counting_target.config), torch.device("cpu"))  # nothing loaded for lookup
    plan = spec.build(target)
    assert plan.built and isinstance(plan.drafter, LookupDrafter) and plan.drafter.gamma == 3
    assert plan.build(target) is plan
    outputs, stats = generate(counting_target, [[1, 2, 3]], plan)
    assert outputs == generate(counting_target, [[1, 2, 3]], plan.autoregressive())[0] and stats.method == "lookup"
