"""Captured decoding steps: each step shape recorded once as a CUDA graph and replayed.

On a GPU a decoding step of a small model is bound by launches, not arithmetic: SmolLM2-135M's step is 30 blocks of
about 15 kernels each, launched one by one from Python. A CUDA graph records a step's kernels once and replays them
with one launch (what gpt-fast and vLLM do over a static KV cache). A graph replays fixed addresses and shapes, so:

- the step's inputs (tokens, the cache's slots, rotary positions and attention mask, the positions read) are copied
  into buffers the graph owns, and its outputs are the same tensors at every replay (read them before the next one);
- the KV cache is written in place, so a graph belongs to one cache storage: :meth:`mtp.decode.inference.
  InferenceModel.new_cache` hands out the same storage again for the same batch size and rounded length, and rows
  that finish are compacted into its first rows (:meth:`KVCache.keep_rows`), so that the graphs of one ``generate``
  call serve the next, at every batch size it shrank through;
- a graph is captured per shape: the step's width (1 + drafts, or a tree's nodes), the rows left in the batch and
  the attention span, which grows in buckets (:data:`mtp.decode.inference.SPAN_MULTIPLE`).

Capture runs the step once on a side stream (its cache writes are the step's own, and a step is idempotent: it writes
the same keys and values at the same slots), records it, then replays it; the time it takes is counted apart
(:attr:`StepGraphs.capture_s`). The acceptance rule, the drafts' choice and the cache's bookkeeping stay eager: a
few small kernels. Nothing inside a captured step may wait for the host; CUDA refuses the capture if it does.

``CAPTURES`` maps a device type to how it captures; only CUDA captures. Tests register :class:`Rerun` for the CPU,
which replays by running the step again on the owned inputs and copying into the owned outputs: the same contract
(inputs read only from the owned buffers, outputs overwritten at each replay), so the plumbing is tested without a
GPU.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import Tensor

from mtp.decode.cache import KVCache

Step = Callable[..., tuple[Tensor, ...]]
"""``step(cache, *tensors)`` -> output tensors: a pure function of its inputs and the cache's tensors."""

CACHE_INPUTS = ("positions", "rotary", "rows", "mask")
"""The cache's per-step tensors a step reads (set by :meth:`KVCache.begin`), copied in before each replay."""


class Recording(Protocol):
    outputs: tuple[Tensor, ...]

    def replay(self) -> None: ...


class CudaRecording:
    """A step recorded as a CUDA graph (one warm-up run on a side stream first, as PyTorch's docs ask)."""

    def __init__(self, step: Callable[[], tuple[Tensor, ...]]) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = step()

    def replay(self) -> None:
        self.graph.replay()


class Rerun:
    """A stand-in that replays by running the step again and copying its results into the first run's outputs."""

    def __init__(self, step: Callable[[], tuple[Tensor, ...]]) -> None:
        self.step = step
        self.outputs = tuple(t.clone() for t in step())

    def replay(self) -> None:
        for owned, fresh in zip(self.outputs, self.step(), strict=True):
            owned.copy_(fresh)


CAPTURES: dict[str, Callable[[Callable[[], tuple[Tensor, ...]]], Recording]] = {"cuda": CudaRecording}
"""How each device type records a step."""


KEPT_STORAGES = 4
"""Cache storages a form keeps for reuse (batch size x rounded length x dtype), the least recently used dropped."""


def captures_on(device: torch.device) -> bool:
    return device.type in CAPTURES


class _Graph:
    """One captured step: the cache view and tensors it reads, and its recording."""

    def __init__(self, step: Step, cache: KVCache, tensors: Sequence[Tensor | None], record) -> None:
        self.view = copy.copy(cache)  # the same keys and values; per-step tensors of its own
        for name in CACHE_INPUTS:
            setattr(self.view, name, getattr(cache, name).clone())
        self.inputs = [t.clone() if t is not None else None for t in tensors]
        self.recording = record(lambda: tuple(step(self.view, *self.inputs)))

    def __call__(self, cache: KVCache, tensors: Sequence[Tensor | None]) -> tuple[Tensor, ...]:
        for name in CACHE_INPUTS:
            getattr(self.view, name).copy_(getattr(cache, name))
        for owned, tensor in zip(self.inputs, tensors, strict=True):
            if owned is not None:
                owned.copy_(tensor)
        self.recording.replay()
        return self.recording.outputs


class StepGraphs:
    """The captured steps of one inference form, by name and shape; ``capture_s``: the seconds spent capturing."""

    def __init__(self, device: torch.device) -> None:
        if not captures_on(device):
            raise ValueError(f"steps are captured on {', '.join(CAPTURES)} devices, not {device.type}")
        self.record = CAPTURES[device.type]
        self.graphs: dict[tuple, _Graph] = {}
        self.storage: dict[tuple, tuple[Tensor, Tensor]] = {}  # cache shape -> keys and values, reused by new caches
        self.captures, self.capture_s = 0, 0.0
        self.decoding = False  # a generate call is replaying these graphs (claim, release)

    def claim(self) -> None:
        """Mark a ``generate`` call as decoding with these graphs: a second one at the same time (another thread)
        would write the same cache storage, so it is refused."""
        if self.decoding:
            raise RuntimeError(
                "this model is already decoding with cuda_graphs in another generate call, and captured steps replay "
                "on one cache storage per shape; decode one call at a time, or without cuda_graphs"
            )
        self.decoding = True

    def release(self) -> None:
        self.decoding = False

    def cache_storage(
        self, shape: tuple[int, ...], device: torch.device | str, dtype: torch.dtype
    ) -> tuple[Tensor, Tensor]:
        """Keys and values of this shape, the same tensors for every cache of it, so that its graphs replay on them
        (the last :data:`KEPT_STORAGES` shapes met are kept; the graphs of others go with them)."""
        key = (shape, device, dtype)
        if key not in self.storage:
            while len(self.storage) >= KEPT_STORAGES:
                del self.storage[next(iter(self.storage))]
            self.storage[key] = (
                torch.zeros(shape, device=device, dtype=dtype),
                torch.zeros(shape, device=device, dtype=dtype),
            )
        self.storage[key] = self.storage.pop(key)  # the most recent last
        return self.storage[key]

    def run(self, name: str, step: Step, cache: KVCache, *tensors: Tensor | None) -> tuple[Tensor, ...]:
        """``step(cache, *tensors)``, captured the first time this name, cache storage and shapes are met."""
        shapes = tuple(None if t is None else (tuple(t.shape), t.dtype) for t in tensors)
        cached = tuple((tuple(getattr(cache, n).shape), getattr(cache, n).dtype) for n in CACHE_INPUTS)
        key = (name, cache.keys.data_ptr(), shapes, cached)  # the mask's shape holds the attention span
        graph = self.graphs.get(key)
        if graph is None:
            self.forget(keep=cache)
            start = time.perf_counter()
            graph = self.graphs[key] = _Graph(step, cache, tensors, self.record)
            self.captures, self.capture_s = self.captures + 1, self.capture_s + time.perf_counter() - start
        return graph(cache, tensors)

    def forget(self, keep: KVCache) -> None:
        """Drop the graphs of cache storages that are neither ``keep``'s nor kept for reuse (one evicted from
        :attr:`storage`, or a cache made without it: its graphs would keep it alive)."""
        kept = {keep.keys.data_ptr()} | {keys.data_ptr() for keys, _ in self.storage.values()}
        self.graphs = {key: graph for key, graph in self.graphs.items() if key[1] in kept}
