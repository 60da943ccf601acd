"""KV cache for every block of an MTP model (trunk and head blocks), preallocated, with per-row lengths.

Rows may hold different numbers of positions. A forward over S new tokens writes their keys and values
at each row's next S positions; ``rollback`` sets a row's length back (rejected drafts), and the stale
entries beyond it are masked out and overwritten by the next forward. A forward over a draft tree
(:class:`mtp.decode.tree.DraftTree`) writes its nodes at the next S slots too, but each node sits at position
(held + depth) and sees only its ancestors; ``keep_path`` then moves the accepted path's entries to the slots
that follow the held ones, where a sequence would have put them. Causal heads keep a cache per depth beside it
(:class:`ChainCache`), rolled back and trimmed with it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

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
        span_multiple: int = 1,
        storage: Callable[[tuple[int, ...], torch.device | str, torch.dtype], tuple[Tensor, Tensor]] | None = None,
    ) -> None:
        shape = (n_blocks, batch_size, n_kv_heads, max_len, head_dim)
        # full_span (for compiled steps): attention spans every preallocated position (masked), so that shapes stay
        # the same from step to step; span_multiple: the span rounded up to a multiple of it (masked beyond the held
        # positions), so that an eager step's shapes repeat, and a kernel planned per shape (cuDNN's attention on
        # recent GPUs) is planned once per bucket rather than once per step; storage(shape, device, dtype): keys and
        # values of this shape to hold them (an earlier cache's, whose captured steps replay on them:
        # mtp.decode.graphs), else new ones
        self.full_span, self.span_multiple = full_span, span_multiple
        # a given storage stays this cache's: rows that leave are compacted into its first rows (keep_rows), so that
        # the keys and values of each batch size sit at the same addresses from one call to the next
        self.storage = storage(shape, device, dtype) if storage is not None else None
        if self.storage is None:
            self.keys = torch.zeros(shape, device=device, dtype=dtype)
            self.values = torch.zeros(shape, device=device, dtype=dtype)
        else:
            self.keys, self.values = self.storage
        self.max_len = max_len
        self.host_lengths = [0] * batch_size  # mirrors `lengths`, so that shapes never need a device sync
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.positions: Tensor | None = None  # (B, S) slots the step writes
        self.rotary: Tensor | None = None  # (B, S) the positions they hold (rotary angles): the slots, or held + depth
        self.rows: Tensor | None = None
        self.mask: Tensor | None = None
        self.span = 0
        self.chain: ChainCache | None = None  # causal heads' caches, rolled back and trimmed with this one

    @property
    def max_length(self) -> int:
        return max(self.host_lengths, default=0)

    def begin(self, new: int, tree: dict[str, Tensor] | None = None) -> None:
        """Prepare a forward over ``new`` tokens per row after each row's held ones: where they are written and what
        each attends to (``positions`` (B, S), ``rotary`` (B, S), ``mask`` (B, 1, S, span)). With ``tree`` (a draft
        tree's :meth:`~mtp.decode.tree.DraftTree.tensors`, cut to the first S nodes), token i is a tree node: it
        sits at held + depth and attends to the held positions and its ancestors in the step."""
        if self.max_length + new > self.max_len:
            raise ValueError(f"the KV cache holds {self.max_len} positions; {self.max_length + new} were asked for")
        device = self.lengths.device
        positions = self.lengths[:, None] + torch.arange(new, device=device)
        self.positions = positions
        self.rows = torch.arange(positions.size(0), device=device)[:, None]  # (B, 1)
        needed, multiple = self.max_length + new, self.span_multiple
        self.span = self.max_len if self.full_span else min(self.max_len, -(-needed // multiple) * multiple)
        keys = torch.arange(self.span, device=positions.device)
        if tree is None:
            self.rotary = positions
            self.mask = keys[None, None, None, :] <= positions[:, None, :, None]  # (B, 1, S, span)
            return
        self.rotary = self.lengths[:, None] + tree["depth"][:new]
        step = keys[None, :] - self.lengths[:, None]  # (B, span): a key's index in the step (< 0: held)
        attends = tree["attends"][:new, :new]  # (S, S)
        in_tree = attends[:, step.clamp(0, new - 1)].transpose(0, 1)  # (B, S, span)
        self.mask = ((step < 0)[:, None, :] | ((step < new)[:, None, :] & in_tree))[:, None]

    def keep_path(self, path: Tensor, slots: slice) -> None:
        """After a tree step (before ``commit``): move the keys and values of each row's path through the tree, node
        indices ``path`` (B, P) in the step, to the step's first P slots (in ``slots`` of the blocks)."""
        rows = torch.arange(path.size(0), device=path.device)[:, None]
        source = self.lengths[:, None] + path
        target = self.lengths[:, None] + torch.arange(path.size(1), device=path.device)
        for tensor in (self.keys, self.values):
            held = tensor[slots]
            held[:, rows, :, target] = held[:, rows, :, source]

    def commit(self, new: int) -> None:
        """Count the S new positions of the last forward as held."""
        self.lengths = self.lengths + new  # a new tensor: callers may hold the old lengths
        self.host_lengths = [n + new for n in self.host_lengths]
        self.positions = self.rotary = self.rows = self.mask = None

    def rollback(self, lengths: list[int], device_lengths: Tensor | None = None) -> None:
        """Keep only each row's first ``lengths[b]`` positions (``device_lengths``: the same, already on the device)."""
        if len(lengths) != len(self.host_lengths) or not all(
            0 <= n <= held for n, held in zip(lengths, self.host_lengths, strict=True)
        ):
            raise ValueError(f"rollback to lengths {lengths}: each must be between 0 and the {self.host_lengths} held")
        self.host_lengths = list(lengths)
        if device_lengths is None:
            device_lengths = torch.tensor(lengths, dtype=torch.long, device=self.keys.device)
        self.lengths = device_lengths
        if self.chain is not None:
            self.chain.rollback(lengths, device_lengths)

    def repeated(self, times: int) -> KVCache:
        """A copy of this cache with every row repeated ``times`` times (row b's copies at b * times ..): branches
        that continue the same context apart (a drafter's independent sequences). Causal chains are not copied."""
        assert self.chain is None, "causal heads' chains are not branched"
        branched = copy.copy(self)
        branched.storage = None
        branched.keys = self.keys.repeat_interleave(times, dim=1)
        branched.values = self.values.repeat_interleave(times, dim=1)
        branched.lengths = self.lengths.repeat_interleave(times)
        branched.host_lengths = [n for n in self.host_lengths for _ in range(times)]
        branched.positions = branched.rotary = branched.rows = branched.mask = None
        return branched

    def keep_rows(self, rows: list[int]) -> None:
        """Drop every row not in ``rows`` (finished ones), so that they stop costing compute."""
        index = torch.tensor(rows, dtype=torch.long, device=self.keys.device)
        if self.storage is not None:  # into the storage's first rows
            kept = self.keys.index_select(1, index), self.values.index_select(1, index)
            self.keys, self.values = (
                whole[:, : len(rows)].copy_(part) for whole, part in zip(self.storage, kept, strict=True)
            )
        else:
            self.keys = self.keys.index_select(1, index)
            self.values = self.values.index_select(1, index)
        self.lengths = self.lengths.index_select(0, index)
        self.host_lengths = [self.host_lengths[r] for r in rows]
        if self.chain is not None:
            self.chain.keep_rows(rows, index)


class ChainCache:
    """Causal depths' caches (one each, depth k's final entries lagging the trunk's by k - 2 positions) and the hidden
    states the next depth reads (heads - 1, B, max_len, d): head 1's, then depths 2..heads-1's."""

    def __init__(self, caches: list[KVCache], hidden: Tensor) -> None:
        self.caches, self.hidden = caches, hidden

    def rollback(self, lengths: list[int], device_lengths: Tensor) -> None:
        """The trunk keeps ``lengths``: depth k keeps the positions whose tokens are all known, lengths - k + 2."""
        for k, cache in enumerate(self.caches, start=2):
            cache.rollback([max(0, n - k + 2) for n in lengths], (device_lengths - k + 2).clamp(min=0))

    def keep_rows(self, rows: list[int], index: Tensor) -> None:
        for cache in self.caches:
            cache.keep_rows(rows)
        self.hidden = self.hidden.index_select(1, index)
