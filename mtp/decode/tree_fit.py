"""Fitting a draft tree to a model: decode held-out prompts with a wide tree that measures the likeliest candidates,
count how often each path of candidates was accepted, keep the most often accepted (:func:`mtp.decode.tree.fit_tree`).

The counts come from decoding itself (the same acceptance rule, the model's own contexts, causal heads drafting as
they do), greedy or sampled with the settings the tree will be used with: greedy trees rank candidates, sampling
trees draw them, so the best shapes differ (sampling trees are wider).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from mtp.data.prompts import prompts_beyond_the_benchmarks
from mtp.decode import GenerationConfig, generate
from mtp.decode.tree import DraftTree, fit_tree, path_counts, ranked_tree
from mtp.model import MTPModel

MEASURE_WIDTH = 4
"""Candidates per node of the measuring tree."""
MEASURE_NODES = 256
"""Nodes of the measuring tree (or the fitted tree's budget, if larger): 4 candidates under every node to depth
heads - 1 is 84 nodes with 4 heads (all measured) but 21,844 with 8, a step of tens of gigabytes; 256 nodes keep the
likeliest paths of every depth (:func:`mtp.decode.tree.ranked_tree`) in a small step (51 MB measured with the byte8
checkpoint at the fitting's 8 rows)."""


@dataclass
class FittedTree:
    tree: DraftTree
    expected_accepted: float
    """Expected accepted drafts per step on the fitting data: the sum of the tree's path acceptance rates."""
    steps: int
    """Row-steps the counts come from."""
    acceptance: dict[tuple[int, ...], float]
    """Acceptance rate of each of the tree's paths on the fitting data."""

    def to_json(self) -> str:
        return self.tree.to_json(
            expected_tokens_per_step=round(1 + self.expected_accepted, 4),
            measured_steps=self.steps,
            acceptance=[round(self.acceptance[p], 4) for p in self.tree.paths],
        )


def fit_to_model(model: MTPModel, prompts: list[list[int]], nodes: int, config: GenerationConfig) -> FittedTree:
    """The tree of at most ``nodes`` nodes (at most ``config.heads - 1`` deep) with the most accepted drafts when
    decoding ``prompts`` with ``config`` (temperature, top-k, top-p, draft_p_min, seed). A measuring step too large
    for the memory available is refused before decoding (:func:`mtp.decode.memory.check_step_fits`, in
    :func:`~mtp.decode.generate`)."""
    depth = config.heads - 1
    measuring = ranked_tree(MEASURE_WIDTH, depth, max(MEASURE_NODES, nodes))
    settings = replace(config, tree=measuring, acceptance="exact", adaptive_drafts=False)
    _, stats = generate(model, prompts, settings)  # refuses a step too large for memory
    steps = sum(stats.accepted_nodes.values())
    counts = path_counts(measuring, stats.accepted_nodes)
    tree, expected = fit_tree(counts, steps, nodes, depth)
    return FittedTree(tree, expected, steps, {p: counts[p] / max(1, steps) for p in tree.paths})


def fitted_tree(loaded, config: GenerationConfig, nodes: int, prompts: int = 16, prompt_tokens: int = 64):
    """A tree of at most ``nodes`` nodes fitted to a loaded checkpoint for decoding with ``config`` (its temperature,
    top-k, top-p, heads), on held-out documents the benchmarks do not prompt with (:func:`fit_to_model`)."""
    held_out = prompts_beyond_the_benchmarks(loaded, prompts, prompt_tokens)
    settings = replace(config, eos_id=None, compile=False, tree=None, adaptive_drafts=False)
    return fit_to_model(loaded.model, held_out, nodes, settings)
