"""Turning logits into distributions and tokens: temperature, top-k, top-p, and sampling from given uniforms.

Sampling takes its uniform numbers as an argument, drawn from one generator per row, so a row's output
depends only on its own seed and never on what else is in the batch.
"""

from __future__ import annotations

import torch
from torch import Tensor


def processed_probs(logits: Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Probabilities (..., V) after temperature, top-k and top-p (nucleus) filtering; temperature > 0."""
    logits = logits.float() / temperature
    if top_k and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of strictly more likely tokens
        drop_sorted = before >= top_p  # keep the smallest prefix whose mass reaches top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample_from(probs: Tensor, uniforms: Tensor) -> Tensor:
    """Inverse-CDF sample of each distribution in probs (..., V) with uniforms (...) in [0, 1)."""
    cdf = probs.cumsum(dim=-1)
    target = uniforms.unsqueeze(-1).to(cdf.dtype) * cdf[..., -1:]
    index = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return index.clamp_(max=probs.size(-1) - 1)


class RowGenerators:
    """One random generator per batch row, seeded ``seed + row``; rows can be dropped as they finish."""

    def __init__(self, seed: int, batch_size: int, device: torch.device) -> None:
        self.generators = [torch.Generator(device=device).manual_seed(seed + row) for row in range(batch_size)]
        self.device = device

    def uniforms(self, count: int) -> Tensor:
        """(B, count) uniforms, row b from its own generator."""
        return torch.stack([torch.rand(count, generator=g, device=self.device) for g in self.generators])

    def keep_rows(self, rows: list[int]) -> None:
        self.generators = [self.generators[r] for r in rows]
