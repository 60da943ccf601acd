"""Fitting a draft tree to a model: decode held-out prompts with a wide tree that measures the likeliest candidates,
count how often each path of candidates was accepted, keep the most often accepted (:func:`mtp.decode.tree.fit_tree`).

The counts come from decoding itself (the same acceptance rule, the model's own contexts, causal heads drafting as
they do), greedy or sampled with the settings the tree will be used with: greedy trees rank candidates, sampling
trees draw them, so the best shapes differ (sampling trees are wider).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mtp.data.prompts import prompts_beyond_the_benchmarks
from mtp.decode.loop import generate
from mtp.decode.plan import Plan
from mtp.decode.stats import DecodeStats
from mtp.decode.tree import DraftTree, fit_tree, path_counts, ranked_tree
from mtp.model import MTPModel

MEASURE_WIDTH = 4
"""Candidates per node of the measuring tree."""
MEASURE_NODES = 256
"""Nodes of the measuring tree (or the fitted tree's budget, if larger): 4 candidates under every node to depth
heads - 1 is 84 nodes with 4 heads (all measured) but 21,844 with 8, a step of tens of gigabytes; 256 nodes keep the
likeliest paths of every depth (:func:`mtp.decode.tree.ranked_tree`) in a step of tens of megabytes."""


FASTEST = "fastest"
"""A node budget that asks for the size decoding fastest on this machine (:func:`fit_to_model`)."""
FASTEST_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
"""The sizes a fastest fit tries: what a node costs depends on the device (on a CPU a step costs about what its
positions do, so small trees win; on a GPU a step over 64 positions costs about what one over 4 does)."""
TIMING_PROMPTS, TIMING_TOKENS, TIMING_ROUNDS = 3, 32, 6
"""Each size's step time: a fitting prompt continued by this many tokens per round, the rounds taking the prompts in
turn and every size in each round (so that a machine's speed drifting between sizes does not pick one), the fastest
round kept."""


@dataclass
class SizeTrial:
    """One size a fastest fit tried: its expected tokens per step (fitting data) and measured step time."""

    nodes: int
    expected_tokens: float
    ms_per_step: float

    @property
    def tokens_per_ms(self) -> float:
        return self.expected_tokens / self.ms_per_step


@dataclass
class FittedTree:
    tree: DraftTree
    expected_accepted: float
    """Expected accepted drafts per step on the fitting data: the sum of the tree's path acceptance rates."""
    steps: int
    """Row-steps the counts come from."""
    acceptance: dict[tuple[int, ...], float]
    """Acceptance rate of each of the tree's paths on the fitting data."""
    trials: list[SizeTrial] = field(default_factory=list)
    """The sizes a fastest fit tried (empty for a fixed budget)."""
    chain: SizeTrial | None = None
    """A fastest fit's timing of the heads' chain as deep as the tree may be, decoded without a tree."""

    @property
    def chain_faster(self) -> bool:
        """A fastest fit found the heads' chain (no tree) faster than every tree: decode without one."""
        best = max(self.trials, key=lambda t: t.tokens_per_ms, default=None)
        return self.chain is not None and best is not None and self.chain.tokens_per_ms > best.tokens_per_ms

    def to_json(self) -> str:
        tried = {"sizes_tried": [[t.nodes, round(t.expected_tokens, 4), round(t.ms_per_step, 3)] for t in self.trials]}
        if self.chain is not None:
            tried["chain_without_a_tree"] = [round(self.chain.expected_tokens, 4), round(self.chain.ms_per_step, 3)]
        return self.tree.to_json(
            expected_tokens_per_step=round(1 + self.expected_accepted, 4),
            measured_steps=self.steps,
            acceptance=[round(self.acceptance[p], 4) for p in self.tree.paths],
            **(tried if self.trials else {}),
        )

    def summary(self) -> str:
        """'fitted a 6-node tree, expected tokens/step 2.24' (and, for a fastest fit, the sizes it timed)."""
        line = f"fitted a {self.tree.size}-node tree, expected tokens/step {1 + self.expected_accepted:.2f}"
        if self.trials:
            sizes = ", ".join(f"{t.nodes}: {t.tokens_per_ms:.3f}" for t in self.trials)
            line += f", the fastest here of expected tokens per ms by size ({sizes})"
        if self.chain is not None:
            faster = "faster than any tree: decoding without one" if self.chain_faster else "slower"
            line += f"; the heads' chain without a tree {self.chain.tokens_per_ms:.3f}, {faster}"
        return line


def fit_to_model(model: MTPModel, prompts: list[list[int]], nodes: int | str, plan: Plan) -> FittedTree:
    """The tree of at most ``nodes`` nodes (at most ``plan``'s heads - 1 deep) with the most accepted drafts when
    decoding ``prompts`` with ``plan`` (temperature, top-k, top-p, draft_p_min, seed). A measuring step too large
    for the memory available is refused before decoding (:func:`mtp.decode.memory.check_step_fits`, in
    :func:`~mtp.decode.generate`).

    ``nodes`` :data:`FASTEST`: of the best trees of each of :data:`FASTEST_SIZES` nodes, the one with the most
    expected tokens per millisecond, its step timed here with ``plan`` at batch 1 (Sequoia's hardware-aware size,
    measured rather than modelled); the heads' chain, decoded without a tree, is timed beside them, and
    :attr:`FittedTree.chain_faster` says whether it beat them all (on a CPU, where a step costs what its positions do
    and a tree step has more to do than a chain step of as many positions, it can)."""
    depth = plan.heads.heads - 1
    budget = FASTEST_SIZES[-1] if nodes == FASTEST else nodes
    measuring = ranked_tree(MEASURE_WIDTH, depth, max(MEASURE_NODES, budget))
    settings = plan.changed(tree=measuring, acceptance="exact", adaptive_drafts=False)
    _, stats = generate(model, prompts, settings)  # refuses a step too large for memory
    steps = sum(stats.accepted_nodes.values())
    counts = path_counts(measuring, stats.accepted_nodes)
    fits = [fit_tree(counts, steps, size, depth) for size in (FASTEST_SIZES if nodes == FASTEST else (nodes,))]
    fits = list({tree.size: (tree, expected) for tree, expected in fits}.values())  # a budget beyond the paths seen
    trials, chain, best = [], None, 0
    if nodes == FASTEST:  # the chain as deep as the trees, decoded as a chain (no tree machinery), timed beside them
        chain_expected = sum(counts[(0,) * d] for d in range(1, depth + 1)) / max(1, steps)
        *trials, chain = time_sizes(model, prompts, plan, [*fits, (None, chain_expected)])
        best = max(range(len(fits)), key=lambda i: trials[i].tokens_per_ms)
    tree, expected = fits[best]
    acceptance = {p: counts[p] / max(1, steps) for p in tree.paths}
    return FittedTree(tree, expected, steps, acceptance, trials, chain)


def time_sizes(
    model: MTPModel, prompts: list[list[int]], plan: Plan, fits: list[tuple[DraftTree | None, float]]
) -> list[SizeTrial]:
    """Each fitted tree's step time (ms) when decoding with ``plan`` at batch 1 (:data:`TIMING_ROUNDS`); a last
    entry without a tree is the heads' chain (timed as it is, not pooled with the trees' times)."""
    tokens = min(TIMING_TOKENS, plan.sampling.max_new_tokens)
    plans = [plan.changed(tree=tree, max_new_tokens=tokens) for tree, _ in fits]
    turns = min(TIMING_PROMPTS, len(prompts))  # the rounds take the prompts in turn

    def decode(round_: int, timed: Plan) -> DecodeStats:  # no longer than the fitting: its context was checked
        return generate(model, [prompts[round_ % turns]], timed)[1]

    times = fastest_steps(decode, plans, TIMING_ROUNDS)
    trees = len(fits) - (fits[-1][0] is None)
    times[:trees] = nondecreasing(times[:trees])  # nested trees, each doing what a smaller one does and more
    sizes = [tree.size if tree is not None else plan.heads.heads - 1 for tree, _ in fits]
    return [SizeTrial(n, 1 + expected, ms) for n, (_, expected), ms in zip(sizes, fits, times, strict=True)]


def fastest_steps(
    decode: Callable[[int, Plan], DecodeStats],
    plans: list[Plan],
    rounds: int,
    min_rounds: int | None = None,
    budget_s: float = float("inf"),
) -> list[float]:
    """Each plan's step time (ms): ``decode(round, plan)``'s stats in ``rounds`` rounds, each timing every plan in turn
    (so that a machine's speed drifting does not favour one), the fastest round kept (other work on the machine only
    adds to a step's time); rounds beyond ``min_rounds`` only while the timing has taken less than ``budget_s``."""
    times = [float("inf")] * len(plans)
    started = time.perf_counter()
    for round_ in range(rounds):
        if min_rounds is not None and round_ >= min_rounds and time.perf_counter() - started >= budget_s:
            break
        for i, plan in enumerate(plans):
            times[i] = min(times[i], decode(round_, plan).ms_per_forward)
    return times


def nondecreasing(values: list[float]) -> list[float]:
    """The closest non-decreasing sequence in least squares (isotonic regression, pool adjacent violators): a timing
    spike at one size is shared with its neighbours instead of deciding alone."""
    blocks: list[list[float]] = []  # [sum, count] of pooled runs
    for value in values:
        blocks.append([value, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [total / count for total, count in blocks for _ in range(int(count))]


def fitted_tree(loaded, plan: Plan, nodes: int | str, prompts: int = 16, prompt_tokens: int = 64) -> FittedTree:
    """A tree of at most ``nodes`` nodes (or of the fastest size: :data:`FASTEST`) fitted to a loaded checkpoint for
    decoding with ``plan`` (its temperature, top-k, top-p, heads), on held-out documents kept apart from the prompts
    that timed runs decode (:func:`fit_to_model`; uncompiled, so a fastest fit times uncompiled steps)."""
    held_out = prompts_beyond_the_benchmarks(loaded, prompts, prompt_tokens)
    settings = plan.changed(eos_id=None, compile=False, tree=None, adaptive_drafts=False)
    return fit_to_model(loaded.model, held_out, nodes, settings)
