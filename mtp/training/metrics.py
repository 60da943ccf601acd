"""Metrics that torchmetrics does not ship."""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric


def accepted_prefix_lengths(predictions: Tensor) -> Tensor:
    """Tokens one greedy self-speculative step would emit at each position, from teacher-forced argmaxes.

    predictions: (n, B, T) argmax of every head; predictions[k-1][b, t] is head k's guess for token t+k.
    Head k's draft at t is accepted when it equals head 1's argmax at t+k-1 (the verifier's choice for
    the same token) and every earlier draft was accepted. Returns (B, T - n + 1): 1 + accepted drafts.
    """
    n, _, T = predictions.shape
    span = T - n + 1
    if n == 1:
        return torch.ones_like(predictions[0])
    agree = torch.stack(
        [predictions[k - 1, :, :span] == predictions[0, :, k - 1 : k - 1 + span] for k in range(2, n + 1)]
    )
    return 1 + agree.long().cumprod(dim=0).sum(dim=0)


class ExpectedTokensPerForward(Metric):
    """Mean tokens per forward of greedy self-speculative decoding with all heads, estimated on teacher-forced data.

    An estimate: in real decoding each step starts at the position the previous one reached and the
    context is the model's own output, not the reference text.
    """

    higher_is_better = True
    full_state_update = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("tokens", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("positions", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, predictions: Tensor) -> None:
        lengths = accepted_prefix_lengths(predictions)
        self.tokens += lengths.sum()
        self.positions += lengths.numel()

    def compute(self) -> Tensor:
        return (self.tokens / self.positions).float()


class AcceptanceByPosition(Metric):
    """Chained acceptance of each draft position, estimated like :class:`ExpectedTokensPerForward`: the rate at
    which draft j (head j + 1's) is accepted among the positions where drafts 1..j-1 all were. A vector (n_drafts,)."""

    full_state_update = False

    def __init__(self, n_drafts: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.n_drafts = n_drafts
        self.add_state("reached", default=torch.zeros(n_drafts, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("accepted", default=torch.zeros(n_drafts, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, predictions: Tensor) -> None:
        if self.n_drafts == 0:
            return
        lengths = accepted_prefix_lengths(predictions).flatten() - 1  # accepted drafts per position
        drafts = torch.arange(self.n_drafts, device=lengths.device)
        self.reached += (lengths[:, None] >= drafts).sum(dim=0)  # drafts before j all accepted
        self.accepted += (lengths[:, None] > drafts).sum(dim=0)

    def compute(self) -> Tensor:
        return (self.accepted / self.reached.clamp(min=1)).float()
