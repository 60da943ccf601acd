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
    ) -> None:
        shape = (n_blocks, batch_size, n_kv_heads, max_len, head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len
        self.host_lengths = [0] * batch_size  # mirrors `lengths`, so that shapes never need a device sync
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.positions: Tensor | None = None
        self.rows: Tensor | None = None
        self.mask: Tensor | None = None
        self.span = 0

    @classmethod
    def for_model(cls, model, batch_size: int, max_len: int) -> KVCache:
        config = model.config
        parameter = next(model.parameters())
        return cls(
            len(model.blocks()),
            batch_size,
            config.n_kv_heads,
            config.d_model // config.n_heads,
            max_len,
            parameter.device,
            parameter.dtype,
        )

    @property
    def batch_size(self) -> int:
        return len(self.host_lengths)

    @property
    def max_length(self) -> int:
        return max(self.host_lengths, default=0)

    def begin(self, positions: Tensor) -> None:
        """Prepare a forward over new tokens at ``positions`` (B, S): where they are written, what each attends to."""
        new = positions.size(1)
        if self.max_length + new > self.max_len:
            raise ValueError(f"the KV cache holds {self.max_len} positions; {self.max_length + new} were asked for")
        self.positions = positions
        self.rows = torch.arange(positions.size(0), device=positions.device)[:, None]  # (B, 1)
        self.span = self.max_length + new
        keys = torch.arange(self.span, device=positions.device)
        self.mask = keys[None, None, None, :] <= positions[:, None, :, None]  # (B, 1, S, span)

    def layer(self, index: int) -> LayerCache:
        return LayerCache(self, index)

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

    def keep_rows(self, rows: list[int]) -> None:
        """Drop every row not in ``rows`` (finished ones), so that they stop costing compute."""
        index = torch.tensor(rows, dtype=torch.long, device=self.keys.device)
        self.keys = self.keys.index_select(1, index)
        self.values = self.values.index_select(1, index)
        self.lengths = self.lengths.index_select(0, index)
        self.host_lengths = [self.host_lengths[r] for r in rows]


class LayerCache:
    """One block's view of the cache during a forward."""

    def __init__(self, cache: KVCache, index: int) -> None:
        self.cache, self.index = cache, index

    @property
    def mask(self) -> Tensor:
        return self.cache.mask

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write new keys/values (B, n_kv_heads, S, head_dim); return all held ones (B, n_kv_heads, span, head_dim)."""
        cache = self.cache
        keys, values = cache.keys[self.index], cache.values[self.index]
        keys[cache.rows, :, cache.positions] = k.transpose(1, 2).to(keys.dtype)  # (B, S, n_kv_heads, head_dim)
        values[cache.rows, :, cache.positions] = v.transpose(1, 2).to(values.dtype)
        return keys[:, :, : cache.span], values[:, :, : cache.span]
