"""KV cache for every block of an MTP model (trunk and head blocks), preallocated, with per-row lengths.

Rows may hold different numbers of positions. A forward over S new tokens writes their keys and values
at each row's next S positions; ``rollback`` sets a row's length back (rejected drafts), and the stale
entries beyond it are masked out and overwritten by the next forward.
"""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    def __init__(
        self,
        n_blocks: int,
        batch_size: int,
        n_kv_heads: int,
        head_dim: int,
        max_len: int,
        device: torch.device | str,
        dtype: torch.dtype,
        full_span: bool = False,
    ) -> None:
        shape = (n_blocks, batch_size, n_kv_heads, max_len, head_dim)
        # full_span (for compiled steps): attention spans every preallocated position (masked), so that shapes stay
        # the same from step to step
        self.full_span = full_span
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len
        self.host_lengths = [0] * batch_size  # mirrors `lengths`, so that shapes never need a device sync
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.positions: Tensor | None = None
        self.rows: Tensor | None = None
        self.mask: Tensor | None = None
        self.span = 0
        self.chain = None  # causal heads' caches (mtp.decode.inference.ChainCache), rolled back and trimmed with this

    @property
    def max_length(self) -> int:
        return max(self.host_lengths, default=0)

    def begin(self, new: int) -> None:
        """Prepare a forward over ``new`` tokens per row after each row's held ones: where they are written and what
        each attends to (``positions`` (B, S), ``mask`` (B, 1, S, span))."""
        if self.max_length + new > self.max_len:
            raise ValueError(f"the KV cache holds {self.max_len} positions; {self.max_length + new} were asked for")
        device = self.lengths.device
        positions = self.lengths[:, None] + torch.arange(new, device=device)
        self.positions = positions
        self.rows = torch.arange(positions.size(0), device=device)[:, None]  # (B, 1)
        self.span = self.max_len if self.full_span else self.max_length + new
        keys = torch.arange(self.span, device=positions.device)
        self.mask = keys[None, None, None, :] <= positions[:, None, :, None]  # (B, 1, S, span)

    def commit(self, new: int) -> None:
        """Count the S new positions of the last forward as held."""
        self.lengths = self.lengths + new  # a new tensor: callers may hold the old lengths
        self.host_lengths = [n + new for n in self.host_lengths]
        self.positions = self.rows = self.mask = None

    def rollback(self, lengths: list[int], device_lengths: Tensor | None = None) -> None:
        """Keep only each row's first ``lengths[b]`` positions (``device_lengths``: the same, already on the device)."""
        assert all(0 <= n <= held for n, held in zip(lengths, self.host_lengths, strict=True))
        self.host_lengths = list(lengths)
        if device_lengths is None:
            device_lengths = torch.tensor(lengths, dtype=torch.long, device=self.keys.device)
        self.lengths = device_lengths
        if self.chain is not None:
            self.chain.rollback(lengths, device_lengths)

    def keep_rows(self, rows: list[int]) -> None:
        """Drop every row not in ``rows`` (finished ones), so that they stop costing compute."""
        index = torch.tensor(rows, dtype=torch.long, device=self.keys.device)
        self.keys = self.keys.index_select(1, index)
        self.values = self.values.index_select(1, index)
        self.lengths = self.lengths.index_select(0, index)
        self.host_lengths = [self.host_lengths[r] for r in rows]
        if self.chain is not None:
            self.chain.keep_rows(rows, index)
