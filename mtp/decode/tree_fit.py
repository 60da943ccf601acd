"""Fitting a draft tree to a model: decode held-out prompts with a wide tree that measures every candidate, count how
often each path of candidates was accepted, keep the most often accepted (:func:`mtp.decode.tree.fit_tree`).

The counts come from decoding itself (the same acceptance rule, the model's own contexts, causal heads drafting as
they do), greedy or sampled with the settings the tree will be used with: greedy trees rank candidates, sampling
trees draw them, so the best shapes differ (sampling trees are wider).
"""

from __future__ import annotations

from dataclasses import dataclass

from mtp.decode import GenerationConfig, generate
from mtp.decode.tree import DraftTree, fit_tree, full_tree, path_counts
from mtp.model import MTPModel

MEASURE_WIDTH = 4
"""Candidates per node of the measuring tree."""


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
    decoding ``prompts`` with ``config`` (temperature, top-k, top-p, draft_p_min, seed)."""
    depth = config.heads - 1
    measuring = full_tree(MEASURE_WIDTH, depth)
    settings = {**config.__dict__, "tree": measuring, "acceptance": "exact", "adaptive_drafts": False}
    _, stats = generate(model, prompts, GenerationConfig(**settings))
    steps = sum(stats.accepted_nodes.values())
    counts = path_counts(measuring, stats.accepted_nodes)
    tree, expected = fit_tree(counts, steps, nodes, depth)
    return FittedTree(tree, expected, steps, {p: counts[p] / max(1, steps) for p in tree.paths})
