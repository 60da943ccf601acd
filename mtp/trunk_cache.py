"""Trunk outputs of training windows kept in memory while the trunk is frozen (heads trained on a pretrained model).

With the embedding and the trunk blocks frozen (``freeze=trunk`` or ``freeze=loaded``), the trunk's output for a
window never changes, yet every epoch would run the trunk again: on a CPU, for a 135M-parameter model with four
heads, the trunk is most of a step's time. The cache keeps each window's output after its first step, under the
window's own token ids, so the epochs after the first run only the heads. It is bounded: past ``max_bytes`` new
windows are computed each time, as without it. A cached output is the very tensor the trunk computed (same dtype,
under the same autocast), so a step computes exactly what it would without the cache.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mtp.errors import UserError
from mtp.model import MTPModel


class TrunkCache:
    def __init__(self, model: MTPModel, max_bytes: int) -> None:
        self.model, self.max_bytes = model, max_bytes
        self.outputs: dict[bytes, Tensor] = {}
        self.bytes = 0
        self.hits = self.misses = 0

    @staticmethod
    def check_frozen(model: MTPModel) -> None:
        """A cache needs a trunk that does not train: one sentence with the fix otherwise."""
        trunk = [model.tok_embeddings.weight, *model.trunk_blocks.parameters()]
        if any(p.requires_grad for p in trunk):
            raise UserError(
                "trunk_cache_gb > 0 keeps the trunk's outputs, which change while the trunk trains; freeze it "
                "(init_from=... freeze=trunk or freeze=loaded) or set trunk_cache_gb=0."
            )

    def __call__(self, inputs: Tensor) -> Tensor:
        """The trunk's output (B, T, d) for token ids (B, T): kept rows where every row is kept, else computed (and
        kept while there is room). One host read of the ids per step: the rows' keys."""
        keys = [row.tobytes() for row in inputs.cpu().numpy()]
        if all(key in self.outputs for key in keys):
            self.hits += len(keys)
            return torch.stack([self.outputs[key] for key in keys])
        self.misses += len(keys)
        with torch.no_grad():
            trunk = self.model.trunk(inputs)
        for key, row in zip(keys, trunk, strict=True):
            size = row.numel() * row.element_size()
            if key not in self.outputs and self.bytes + size <= self.max_bytes:
                self.outputs[key] = row.clone()  # its own storage: the batch's tensor is not kept alive
                self.bytes += size
        return trunk
