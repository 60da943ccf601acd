"""The target's own heads as a decoding method (self-speculative decoding): their chain, and their other ways of
drafting as the method's variants, each a benchmark row beside the chain at the largest k: a tree of their
candidates, typical acceptance on it, adaptive chains, SpecTr's several sequences. A variant is a function of
:class:`HeadsBench` returning its rows, kept by name in :attr:`Heads.variants` (:meth:`Heads.add_variant`: a test file
may add one).

Where a run does not say how many heads draft, :func:`heads_plan` decides the heads' part of its plan: a tree (read, or
fitted on held-out prompts), or the count of heads whose steps, timed here, give the most expected tokens per second
(:func:`fastest_heads`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import ClassVar

from mtp.decode.loop import generate
from mtp.decode.methods.base import BenchRow, DecodingMethod, Sweep, Target, register, to_stderr
from mtp.decode.settings import Drafted, HeadsSettings
from mtp.decode.tree import DraftTree, read_tree
from mtp.decode.tree_fit import FASTEST, fastest_steps, fitted_tree
from mtp.errors import SettingError
from mtp.model import MTPModel

CHAIN = "chain"
"""The heads' chain: the label of their rows at every k (k = 1: autoregressive decoding, every speed-up's baseline)."""
TREE = "tree"
BenchTree = tuple[str, DraftTree | None, DraftTree]
"""A tree the benchmark decodes: its rows' label, the tree the rows verify (None: the fastest fit is the chain,
decoded without one) and the tree proper (typical acceptance runs on it)."""


@dataclass
class HeadsBench:
    """What a variant of the heads' drafting builds its rows from, in one mode of a benchmark."""

    target: Target
    """The target, its plan the heads' chain at the largest k in this mode."""
    mode: str
    """greedy or sampling."""
    settings: HeadsSettings
    """The heads' settings asked for (the adaptive variant's ``draft_p_min``)."""
    sweep: Sweep

    @property
    def chain(self) -> Drafted:
        return replace(self.target.config, gamma=0)

    @cached_property
    def trees(self) -> list[BenchTree]:
        """The trees the variants decode (read or fitted once a mode, when a variant asks): the sweep's file, or with
        auto one fitted per node budget."""
        sweep, loaded, chain = self.sweep, self.target.loaded, self.chain
        if sweep.tree != "auto":
            tree = read_tree(Path(sweep.tree), chain.heads - 1, loaded.config.vocab_size)
            return [(TREE, tree, tree)]
        trees = []
        for nodes in sweep.tree_nodes:
            fitted = fitted_tree(loaded, chain, nodes)
            self.target.log(f"{self.mode}: {fitted.summary()}")
            if fitted.chain_faster:  # the fastest "tree" here is the heads' chain, decoded without a tree
                trees.append((f"{FASTEST} {TREE}: the chain", None, fitted.tree))
            else:
                trees.append((f"{FASTEST} {TREE}" if nodes == FASTEST else TREE, fitted.tree, fitted.tree))
        return trees


Variant = Callable[[HeadsBench], list[BenchRow]]
"""A way the heads draft other than their plain chain: its rows in one mode."""


def tree_rows(bench: HeadsBench) -> list[BenchRow]:
    """A tree of the heads' candidates per step (one row per tree)."""
    return [BenchRow(label, replace(bench.chain, tree=tree), None) for label, tree, _ in bench.trees]


def typical_rows(bench: HeadsBench) -> list[BenchRow]:
    """Medusa's typical acceptance on the first tree proper (lossy, so sampling only)."""
    if bench.mode != "sampling":
        return []
    return [BenchRow("typical", replace(bench.chain, tree=bench.trees[0][2], acceptance="typical"), None)]


def adaptive_rows(bench: HeadsBench) -> list[BenchRow]:
    """Chains cut by the heads' confidence (draft_p_min) and sized by the last step (+2 / -1 drafts)."""
    plan = replace(bench.chain, draft_p_min=bench.settings.draft_p_min, adaptive_drafts=True)
    return [BenchRow("adaptive", plan, None)]


def spectr_rows(bench: HeadsBench) -> list[BenchRow]:
    """k sequences of the heads a step under SpecTr's rule (greedy: the k likeliest first drafts), one row per k."""
    chain = bench.chain
    return [
        BenchRow("spectr", replace(chain, drafts_per_step=k, acceptance="spectr"), None) for k in bench.sweep.sequences
    ]


@register
class Heads(DecodingMethod):
    """The target's heads draft: heads 2..k propose, head 1 verifies (Stern et al. 2018, Gloeckle et al. 2024)."""

    name = "heads"
    settings = HeadsSettings
    selected_by = None
    variants: ClassVar[dict[str, Variant]] = {
        TREE: tree_rows,
        "typical": typical_rows,
        "adaptive": adaptive_rows,
        "spectr": spectr_rows,
    }
    """Its variants by name (each a --methods entry and its rows' label), in the order their rows come."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return (CHAIN, *cls.variants)

    @classmethod
    def add_variant(cls, name: str, rows: Variant) -> None:
        """Add a variant (a second one of the same name is refused)."""
        if name in cls.variants and cls.variants[name] is not rows:
            raise ValueError(f"a variant of the heads' drafting named {name!r} is there already")
        cls.variants[name] = rows

    @classmethod
    def remove_variant(cls, name: str) -> None:
        """Forget a variant (a test's own, once it is done)."""
        cls.variants.pop(name, None)

    def proposer(self, target: Target):
        raise TypeError("the heads draft inside the target's step; generate() needs no drafter for them")

    def rows(self, target: Target, mode: str, labels: list[str], sweep: Sweep) -> list[BenchRow]:
        """The rows of the variants among ``labels`` (the chain's rows, one per k, the benchmark makes itself)."""
        bench = HeadsBench(target, mode, self.options, sweep)
        return [row for name, variant in self.variants.items() if name in labels for row in variant(bench)]


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


def allowed_counts(config: Drafted) -> list[int]:
    """The counts of drafting heads, 1 to ``config.heads``, that the rest of ``config`` allows (int8 drafts, say, need
    drafts: not 1)."""
    counts = []
    for k in range(1, config.heads + 1):
        try:
            replace(config, heads=k)
        except SettingError:
            continue
        counts.append(k)
    return counts


def time_heads(model: MTPModel, prompts: list[list[int]], config: Drafted, counts: list[int]) -> dict[int, float]:
    """The step time (ms) of ``config`` with each of ``counts`` drafting heads, at ``prompts``' batch (each prompt cut
    to its last :data:`TIMING_CONTEXT` tokens): the fastest of :data:`TIMING_ROUNDS` rounds of :data:`TIMING_TOKENS`
    new tokens, each round timing every count in turn (the first round runs warm: the calibration decode ran before);
    rounds beyond :data:`TIMING_MIN_ROUNDS` only within :data:`TIMING_BUDGET_S`."""
    timing = [p[-TIMING_CONTEXT:] for p in prompts]
    plans = [replace(config, heads=k, max_new_tokens=TIMING_TOKENS) for k in counts]
    times = fastest_steps(
        lambda _, plan: generate(model, timing, plan)[1], plans, TIMING_ROUNDS, TIMING_MIN_ROUNDS, TIMING_BUDGET_S
    )
    return dict(zip(counts, times, strict=True))


def fastest_heads(model: MTPModel, prompts: list[list[int]], config: Drafted) -> HeadsChoice:
    """How many of ``config.heads`` heads should draft on this machine and model (:func:`choose_heads`, among the
    counts the rest of ``config`` allows: :func:`allowed_counts`): their acceptance from a calibration decode of the
    first prompt with all of them (:data:`CALIBRATION_TOKENS` new tokens, ``config``'s sampling and acceptance rule),
    each count's step time measured at ``prompts``' batch (:func:`time_heads`). Uncompiled, without an end-of-text
    stop; greedy output does not depend on the count chosen.

    The calibration decodes the run's own prompt rather than held-out documents (as a fitted tree does): the prompt is
    what the run decodes, so its acceptance is the one that pays (code drafts better than prose), and reading and
    tokenizing held-out documents costs seconds on a CPU, more than the choice is worth and more than a short decode
    takes; the run need not have its training data either.
    Its tokens are thrown away (the timed decode starts from the prompt again, its cache empty), and its cost is
    reported (:attr:`HeadsChoice.calibration_s`) rather than hidden in the decode's timing."""
    started = time.perf_counter()  # the calibration decode also warms the steps up before they are timed
    measuring = replace(
        config, eos_id=None, compile=False, max_new_tokens=min(CALIBRATION_TOKENS, config.max_new_tokens)
    )
    _, stats = generate(model, prompts[:1], measuring)
    ms_per_step = time_heads(model, prompts, measuring, allowed_counts(config))
    choice = choose_heads(stats.acceptance, ms_per_step)
    choice.calibration_s = time.perf_counter() - started
    return choice


def chooses_heads(config: Drafted) -> bool:
    """Whether :func:`fastest_heads` can choose the count for ``config``: the heads' plain chain, k - 1 drafts every
    step. A tree, a drafter beside the heads, several sequences a step, or chains sized per step (``draft_p_min``,
    ``adaptive_drafts``) shape their own drafts, and the formula's k - 1 drafts a step is not what they verify."""
    return (
        config.tree is None
        and config.gamma == 0
        and config.drafts_per_step == 1
        and config.draft_p_min == 0
        and not config.adaptive_drafts
    )


def heads_tree(loaded, config: Drafted, tree: str, nodes: int | str, log: Callable[[str], None] = to_stderr):
    """The tree of a run's ``tree``: read from its JSON file, or fitted now (``auto``) on :data:`FIT_PROMPTS`
    held-out prompts with ``config``'s settings, at most ``nodes`` nodes or the fastest size (None: a fastest fit
    found the heads' chain faster than any tree on this machine)."""
    if tree != "auto":
        return read_tree(Path(tree), config.heads - 1, loaded.config.vocab_size)
    replace(config, tree=DraftTree.chain(config.heads - 1))  # the settings' refusals of a tree, before fitting one
    fitting = replace(config, max_new_tokens=FIT_NEW_TOKENS)
    fitted = fitted_tree(loaded, fitting, nodes, FIT_PROMPTS, FIT_PROMPT_TOKENS)
    log(f"note: on {FIT_PROMPTS} held-out prompts, {fitted.summary()}")
    return None if fitted.chain_faster else fitted.tree


def heads_plan(
    loaded,
    config: Drafted,
    prompts: list[list[int]],
    *,
    tree: str | None = None,
    tree_nodes: int | str = FASTEST,
    choose: bool = False,
    measured_on: str = "the prompt",
    log: Callable[[str], None] = to_stderr,
) -> Drafted:
    """``config`` with the heads' part of the plan decided for a run of ``prompts`` on ``loaded``: with ``tree``, the
    tree (:func:`heads_tree`); else, where the run leaves the count to the method (``choose``, ``config.heads`` the
    most there are) and the plan is the heads' chain (:func:`chooses_heads`), the count measured fastest here
    (:func:`fastest_heads`, its acceptance measured on the first prompt, named ``measured_on`` in the line), said on a
    ``note:`` line through ``log``."""
    if tree is not None:
        return replace(config, tree=heads_tree(loaded, config, tree, tree_nodes, log))
    if not choose or config.heads == 1 or not chooses_heads(config):
        return config
    choice = fastest_heads(loaded.model, prompts, config)
    choice.measured_on = measured_on
    log(f"note: {choice.summary()}")
    return replace(config, heads=choice.heads)
