"""The target's own heads as a decoding method (self-speculative decoding): their settings are the plan's, and they
draft inside the target's step, with no drafter. Their proposers are in :mod:`mtp.decode.heads_proposer` (their
method builds one as every method builds its own, and the loop gives it the form it packs through the hook it calls on
every proposer); how a run chooses its heads' part, a count or a tree, is theirs too (here, above the loop it
measures with): how many of the target's heads draft in a run that does not say (:func:`decided_heads`). The count
with the most expected tokens per millisecond wins: its acceptance measured by a calibration decode, each count's step
timed here (:func:`fastest_heads`); a tree is read, or fitted on held-out prompts (:func:`heads_tree`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from mtp.decode.heads_proposer import HeadsProposer
from mtp.decode.loop import generate
from mtp.decode.methods.base import DecodingMethod, Target, register
from mtp.decode.plan import Plan, Proposer
from mtp.decode.settings import HeadsSettings
from mtp.decode.tree import DraftTree, read_tree
from mtp.decode.tree_fit import FASTEST, fastest_steps, fitted_tree
from mtp.errors import SettingError
from mtp.model import MTPModel

FIT_PROMPTS, FIT_PROMPT_TOKENS, FIT_NEW_TOKENS = 8, 64, 64
"""A tree fitted for a run (``tree="auto"``) is fitted on this many held-out prompts, of this many tokens, continued
by this many."""
CALIBRATION_TOKENS = 48
"""New tokens of the calibration decode that measures the heads' acceptance (all heads drafting, on the run's
prompt)."""
TIMING_CONTEXT, TIMING_TOKENS, TIMING_ROUNDS = 64, 8, 6
"""Each count of heads' step time: the prompt's last this many tokens continued by this many, in this many rounds,
each round timing every count in turn (so that a machine's speed drifting does not favour one), the fastest round
kept: other work on the machine only ever adds to a step's time, and many short rounds find its quiet moments (a
median of a few rounds keeps some of that work)."""
TIMING_MIN_ROUNDS, TIMING_BUDGET_S = 2, 1.0
"""Rounds after the first :data:`TIMING_MIN_ROUNDS` start only while the timing has taken less than this many seconds:
a large model on a CPU (hundreds of ms a step) is timed in 2 rounds instead of 6."""


@dataclass
class HeadsTrial:
    """One count of drafting heads a choice weighed: its expected tokens per step and measured step time."""

    heads: int
    expected_tokens: float
    ms_per_step: float

    @property
    def tokens_per_ms(self) -> float:
        return self.expected_tokens / self.ms_per_step if self.ms_per_step > 0 else 0.0


@dataclass
class HeadsChoice:
    """The count of drafting heads with the most expected tokens per millisecond, and every count weighed."""

    trials: list[HeadsTrial]
    """One per count weighed, fewest heads first (1: autoregressive)."""
    calibration_s: float = 0.0
    """Wall time the measurements took (outside any timed decode)."""
    measured_on: str = "the prompt"
    """What the acceptance was measured on, as the summary says it."""

    @property
    def best(self) -> HeadsTrial:
        """The trial with the most expected tokens per ms; of equals, the fewest heads (the cheaper step)."""
        return max(self.trials, key=lambda t: t.tokens_per_ms)

    @property
    def heads(self) -> int:
        return self.best.heads

    def summary(self) -> str:
        """One line: what was chosen, and each count's measured ms/step and expected tokens/step."""
        chosen = self.heads
        what = (
            "decoding autoregressively (k=1): the heads' drafts do not pay for their steps here"
            if chosen == 1
            else f"drafting with {chosen} heads (k={chosen}), the most expected tokens per ms here"
        )
        weighed = ", ".join(
            f"k={t.heads} {t.ms_per_step:.2f} ms/step {t.expected_tokens:.2f} tokens/step" for t in self.trials
        )
        cost = f"measured on {self.measured_on} in {self.calibration_s:.1f} s, outside the timed decode"
        return f"{what} ({weighed}; {cost})"


def expected_tokens(acceptance: list[float], heads: int) -> float:
    """Expected tokens per step when ``heads`` heads draft: 1 + the expected accepted drafts. ``acceptance[j]`` is
    :attr:`~mtp.decode.stats.DecodeStats.acceptance`'s: the share of steps whose draft j + 1 was accepted, which
    needs every draft before it accepted too, so it is already the product of the per-depth acceptances up to
    depth j + 1 (multiplying them again would count each depth's rejections twice)."""
    return 1.0 + sum(acceptance[: heads - 1])


def choose_heads(acceptance: list[float], ms_per_step: dict[int, float]) -> HeadsChoice:
    """Of the counts k of drafting heads ``ms_per_step`` times (k = 1: autoregressive), the one with the most expected
    tokens per millisecond, (1 + sum of ``acceptance[:k - 1]``) / ``ms_per_step[k]`` (:func:`expected_tokens`)."""
    return HeadsChoice([HeadsTrial(k, expected_tokens(acceptance, k), ms) for k, ms in sorted(ms_per_step.items())])


def allowed_counts(plan: Plan) -> list[int]:
    """The counts of drafting heads, 1 to ``plan.heads.heads``, that the rest of ``plan`` allows (int8 drafts, say,
    need drafts: not 1)."""
    counts = []
    for k in range(1, plan.heads.heads + 1):
        try:
            plan.changed(heads=k)
        except SettingError:
            continue
        counts.append(k)
    return counts


def time_heads(model: MTPModel, prompts: list[list[int]], plan: Plan, counts: list[int]) -> dict[int, float]:
    """The step time (ms) of ``plan`` with each of ``counts`` drafting heads, at ``prompts``' batch (each prompt cut
    to its last :data:`TIMING_CONTEXT` tokens): the fastest of :data:`TIMING_ROUNDS` rounds of :data:`TIMING_TOKENS`
    new tokens, each round timing every count in turn (the first round runs warm: the calibration decode ran before);
    rounds beyond :data:`TIMING_MIN_ROUNDS` only within :data:`TIMING_BUDGET_S`."""
    timing = [p[-TIMING_CONTEXT:] for p in prompts]
    plans = [plan.changed(heads=k, max_new_tokens=TIMING_TOKENS) for k in counts]
    times = fastest_steps(
        lambda _, timed: generate(model, timing, timed)[1], plans, TIMING_ROUNDS, TIMING_MIN_ROUNDS, TIMING_BUDGET_S
    )
    return dict(zip(counts, times, strict=True))


def fastest_heads(model: MTPModel, prompts: list[list[int]], plan: Plan) -> HeadsChoice:
    """How many of ``plan``'s heads should draft on this machine and model (:func:`choose_heads`, among the counts the
    rest of ``plan`` allows: :func:`allowed_counts`): their acceptance from a calibration decode of the first prompt
    with all of them (:data:`CALIBRATION_TOKENS` new tokens, ``plan``'s sampling and acceptance rule),
    each count's step time measured at ``prompts``' batch (:func:`time_heads`). Uncompiled, without an end-of-text
    stop; greedy output does not depend on the count chosen.

    The calibration decodes the run's own prompt rather than held-out documents (as a fitted tree does): the prompt is
    what the run decodes, so its acceptance is the one that pays (code drafts better than prose), and reading and
    tokenizing held-out documents costs seconds on a CPU, more than the choice is worth and more than a short decode
    takes; the run need not have its training data either.
    Its tokens are thrown away (the timed decode starts from the prompt again, its cache empty), and its cost is
    reported (:attr:`HeadsChoice.calibration_s`) rather than hidden in the decode's timing."""
    started = time.perf_counter()  # the calibration decode also warms the steps up before they are timed
    measuring = plan.changed(
        eos_id=None, compile=False, max_new_tokens=min(CALIBRATION_TOKENS, plan.sampling.max_new_tokens)
    )
    _, stats = generate(model, prompts[:1], measuring)
    ms_per_step = time_heads(model, prompts, measuring, allowed_counts(plan))
    choice = choose_heads(stats.acceptance, ms_per_step)
    choice.calibration_s = time.perf_counter() - started
    return choice


def chooses_heads(plan: Plan) -> bool:
    """Whether :func:`fastest_heads` can choose the count for ``plan``: the heads' plain chain, k - 1 drafts every
    step. A tree, a drafter beside the heads, several sequences a step, or chains sized per step (``draft_p_min``,
    ``adaptive_drafts``) shape their own drafts, and the formula's k - 1 drafts a step is not what they verify."""
    return (
        plan.heads.tree is None
        and plan.drafter is None
        and plan.drafts.drafts_per_step == 1
        and plan.heads.draft_p_min == 0
        and not plan.drafts.adaptive_drafts
    )


def heads_tree(target: Target, tree: str, nodes: int | str) -> DraftTree | None:
    """The tree of a run's ``tree``: read from its JSON file, or fitted now (``auto``) on :data:`FIT_PROMPTS`
    held-out prompts with the target's settings, at most ``nodes`` nodes or the fastest size (None: a fastest fit
    found the heads' chain faster than any tree on this machine; the fit's line to ``target.log``)."""
    loaded, heads = target.loaded, target.heads
    if tree != "auto":
        return read_tree(Path(tree), heads.heads - 1, loaded.config.vocab_size)
    chain = target.plan().changed(tree=DraftTree.chain(heads.heads - 1))  # the plan's refusals of a tree, first
    fitted = fitted_tree(loaded, chain.changed(max_new_tokens=FIT_NEW_TOKENS), nodes, FIT_PROMPTS, FIT_PROMPT_TOKENS)
    target.log(f"note: on {FIT_PROMPTS} held-out prompts, {fitted.summary()}")
    return None if fitted.chain_faster else fitted.tree


def decided_heads(
    target: Target,
    prompts: list[list[int]],
    drafter: Proposer | None = None,
    *,
    tree: str | None = None,
    tree_nodes: int | str = FASTEST,
    choose: bool = False,
    measured_on: str = "the prompt",
) -> HeadsSettings:
    """The heads' part of the plan of a run of ``prompts`` on ``target`` (beside ``drafter``, if any): with ``tree``,
    the target's heads with that tree (:func:`heads_tree`); else, where the run leaves the count to the method
    (``choose``, the target's heads the most there are) and the plan is the heads' chain (:func:`chooses_heads`), the
    count measured fastest here (:func:`fastest_heads`, its acceptance measured on the first prompt, named
    ``measured_on`` in the ``note:`` line it writes to ``target.log``); else the target's heads as asked."""
    heads = target.heads
    if tree is not None:
        return replace(heads, tree=heads_tree(target, tree, tree_nodes))
    if not choose or heads.heads == 1:
        return heads
    asked = target.plan(drafter)
    if not chooses_heads(asked):
        return heads
    choice = fastest_heads(target.loaded.model, prompts, asked)
    choice.measured_on = measured_on
    target.log(f"note: {choice.summary()}")
    return replace(heads, heads=choice.heads)


@register
class Heads(DecodingMethod):
    """The target's heads draft: heads 2..k propose, head 1 verifies (Stern et al. 2018, Gloeckle et al. 2024)."""

    name = "heads"
    settings = HeadsSettings
    selected_by = None

    def proposer_class(self) -> type[Proposer]:
        return HeadsProposer

    def proposer(self, target: Target) -> Proposer:
        """The heads' proposer of ``target``'s plan (the loop gives it the form it packs: ``join``)."""
        return HeadsProposer(target.plan())
