"""Turning logits into distributions and tokens: temperature, top-k, top-p, and sampling from given uniforms.

Sampling takes its uniform numbers as an argument, drawn from one generator per row, so a row's output
depends only on its own seed and never on what else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


def processed_probs(logits: Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Probabilities (..., V) after temperature, top-k and top-p (nucleus) filtering; temperature > 0.

    Top-p keeps the smallest set of most likely tokens whose mass reaches ``top_p``, and every token as likely as the
    least likely of them (a tie at the nucleus' edge is kept whole rather than cut in whatever order a sort leaves
    it), found from the sorted probabilities alone (:func:`nucleus_floor`), not their order."""
    logits = logits.float() / temperature
    if top_k and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        probs = probs.masked_fill(probs < nucleus_floor(probs, top_p), 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def nucleus_floor(probs: Tensor, top_p: float) -> Tensor:
    """The probability (..., 1) of the least likely token of each distribution's nucleus (probs (..., V)): the
    smallest prefix of the most likely tokens whose mass reaches ``top_p``. Sorting the vocabulary is avoided on CPU
    (:func:`nucleus_candidates`); a GPU sorts fast."""
    ordered = nucleus_candidates(probs, top_p) if probs.device.type == "cpu" else probs.sort(dim=-1, descending=True)[0]
    before = ordered.cumsum(dim=-1) - ordered  # mass of the tokens ahead of each
    kept = (before < top_p).sum(dim=-1, keepdim=True)  # at least 1: nothing is ahead of the first
    return ordered.gather(-1, kept - 1)


def nucleus_candidates(probs: Tensor, top_p: float) -> Tensor:
    """The m largest probabilities of each distribution (..., V), in decreasing order, for an m that holds every
    nucleus: a token of probability at most (1 - top_p) / V is never in one (were the nucleus' least likely token p,
    the tokens after it would weigh at most (V - 1) p and those before it less than top_p, so V p > 1 - top_p), so m
    is the most tokens above that in any row. Selected and sorted by NumPy (a partition, then a sort of m): PyTorch's
    CPU sort and top-k over a vocabulary are much slower, most of a sampling step."""
    V = probs.size(-1)
    m = max(1, int((probs > (1 - top_p) / V).sum(dim=-1).max()))
    values = probs.detach().reshape(-1, V).contiguous().numpy()
    if m < V:
        values = np.partition(values, V - m, axis=-1)[:, V - m :]
    ordered = -np.sort(-values, axis=-1)  # decreasing: negated twice rather than a reversed view (slow to sum)
    return torch.from_numpy(ordered).reshape(*probs.shape[:-1], -1)


def top_tokens(logits: Tensor) -> Tensor:
    """The most likely token of each distribution in logits (..., V): ``logits.argmax(dim=-1)``, the first of equal
    maxima. On CPU NumPy finds it: PyTorch's CPU argmax over a vocabulary is several times slower."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
        return torch.from_numpy(np.asarray(np.argmax(logits.detach().numpy(), axis=-1)))
    return logits.argmax(dim=-1)


def sample_from(probs: Tensor, uniforms: Tensor) -> Tensor:
    """Inverse-CDF sample of each distribution in probs (..., V) with uniforms (...) in [0, 1)."""
    return sample_many(probs, uniforms.unsqueeze(-1)).squeeze(-1)


def sample_many(probs: Tensor, uniforms: Tensor) -> Tensor:
    """Independent inverse-CDF samples (..., M) of each distribution in probs (..., V), one per uniform (..., M)."""
    cdf = probs.cumsum(dim=-1)
    index = torch.searchsorted(cdf, uniforms.to(cdf.dtype) * cdf[..., -1:], right=True)
    return index.clamp_(max=probs.size(-1) - 1)


def sample_distinct(probs: Tensor, uniforms: Tensor) -> Tensor:
    """Samples (..., M) of each distribution in probs (..., V) without replacement, one per uniform (..., M): the j-th
    is the inverse-CDF sample of probs without the j - 1 tokens drawn before it (its uniform scaled to the mass left,
    then moved past each drawn token's stretch of the CDF, in the order they lie there). Where probs has fewer than M
    tokens of positive probability, the samples after they run out are drawn tokens or tokens of probability 0: a rule
    that reads them gives such a candidate no proposal mass (:func:`mtp.decode.acceptance.without_drawn`)."""
    cdf = probs.cumsum(dim=-1)
    total = cdf[..., -1]
    drawn: list[Tensor] = []
    for j in range(uniforms.size(-1)):
        point = uniforms[..., j].to(cdf.dtype)
        if drawn:
            taken = torch.stack(drawn, dim=-1)  # (..., j)
            mass = probs.gather(-1, taken)
            start = cdf.gather(-1, taken) - mass  # where each drawn token's stretch of the CDF begins
            start, order = start.sort(dim=-1)
            mass = mass.gather(-1, order)
            point = point * (total - mass.sum(dim=-1)).clamp(min=0)
            for i in range(j):  # past each drawn stretch at or before the point, in order
                point = point + mass[..., i] * (point >= start[..., i])
        else:
            point = point * total
        drawn.append(torch.searchsorted(cdf, point[..., None], right=True)[..., 0].clamp_(max=probs.size(-1) - 1))
    return torch.stack(drawn, dim=-1)


class RowUniforms:
    """Uniform numbers for sampling: row b's come from its own generator, seeded ``seed + row``, drawn up front.

    A step of every row takes the next ``per_step`` numbers of that row's stream, as one indexing operation
    (no loop over rows); rows can be dropped as they finish. A row's numbers depend only on its seed and the
    sizes, never on what else is in the batch.
    """

    def __init__(self, seed: int, batch_size: int, steps: int, per_step: int, device: torch.device) -> None:
        generators = [torch.Generator().manual_seed(seed + row) for row in range(batch_size)]
        self.table = torch.stack([torch.rand(steps, per_step, generator=g) for g in generators]).to(device)
        self.step = 0

    def next(self, count: int) -> Tensor:
        """(B, count) uniforms for this step, count <= per_step; advances every row by one step."""
        draws = self.table[:, self.step, :count]
        self.step += 1
        return draws

    def keep_rows(self, rows: Tensor) -> None:
        self.table = self.table.index_select(0, rows)


@dataclass(frozen=True)
class Draws:
    """The uniforms a proposer declares it draws per step when sampling, by use (its own; the acceptance rule declares
    its tests): :class:`RandomLayout` places them in a step's row of :class:`RowUniforms`."""

    heads_chain: int = 0
    """The heads' chain drafts: one per draft head."""
    drafter: int = 0
    """A drafter's drafts: one per draft of its chain, or per node of the tree its step verifies."""
    heads_tree: int = 0
    """The heads' tree nodes: one per node of the tree they draft."""

    def __add__(self, other: Draws) -> Draws:
        """Two proposers' draws in one step (a hybrid's: a drafter's and the heads')."""
        return Draws(
            self.heads_chain + other.heads_chain, self.drafter + other.drafter, self.heads_tree + other.heads_tree
        )


@dataclass(frozen=True)
class RandomLayout:
    """Which of a step's uniform numbers (one row of :class:`RowUniforms` per step) is used for what, in this order:
    the acceptance tests (the rule's, :meth:`~mtp.decode.acceptance.Rule.tests_per_step`), the token after the
    accepted drafts, the heads' chain drafts, a drafter's drafts, then the heads' tree nodes (the proposer's,
    :meth:`~mtp.decode.plan.Proposer.draws`)."""

    tests: int
    chain_drafts: int
    tree_nodes: int
    drafter_drafts: int = 0

    @classmethod
    def of(cls, tests: int, draws: Draws) -> RandomLayout:
        """The layout of a step whose rule makes ``tests`` acceptance tests and whose proposer declares ``draws``."""
        return cls(tests, draws.heads_chain, draws.heads_tree, draws.drafter)

    @property
    def per_step(self) -> int:
        return self.tests + 1 + self.chain_drafts + self.drafter_drafts + self.tree_nodes

    def acceptance(self, draws: Tensor, first: int, count: int = 1) -> Tensor:
        """(B, count) uniforms of acceptance tests first .. first + count - 1."""
        return draws[:, first : first + count]

    def next_token(self, draws: Tensor) -> Tensor:
        """(B,) the uniform that samples the token after the accepted drafts."""
        return draws[:, self.tests]

    def drafts(self, draws: Tensor, first: int = 0, count: int | None = None) -> Tensor:
        """(B, count) uniforms that sample the heads' chain drafts first .. first + count - 1 (all from ``first`` by
        default)."""
        start = self.tests + 1 + first
        return draws[:, start : start + (self.chain_drafts - first if count is None else count)]

    def drafter(self, draws: Tensor) -> Tensor:
        """(B, drafter_drafts) uniforms of a drafter's drafts: its chain's, or one per node of its tree."""
        start = self.tests + 1 + self.chain_drafts
        return draws[:, start : start + self.drafter_drafts]

    def nodes(self, draws: Tensor, first: int, last: int) -> Tensor:
        """(B, last - first) uniforms that sample the heads' tree nodes first + 1 .. last (node indices, the root being
        0)."""
        start = self.tests + 1 + self.chain_drafts + self.drafter_drafts
        return draws[:, start + first : start + last]
