"""Whether one decoding step fits in memory, told before decoding starts rather than found out by the machine.

A step's memory grows with (positions in the step) x (positions it attends to): a draft tree of N nodes puts 1 + N
positions in every step, each attending to the whole context, so a tree of 4 candidates under every node of an
8-head model (21,844 nodes) needs tens of gigabytes per step, whatever the model's size. :func:`step_bytes` estimates
a step's peak from the shapes :func:`mtp.decode.packed.block_step` and :class:`mtp.decode.cache.KVCache` build;
:func:`check_step_fits` refuses, in one sentence, a step estimated above half of the memory the device has free.

The estimate is an upper bound where attention is concerned: it counts the scores (B, n_heads, S, span) as the math
attention kernel materializes them (PyTorch's fallback where no fused kernel takes the inputs), while a fused kernel
holds only the mask, so a step it runs can peak at a fraction of this estimate.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from mtp.errors import UserError
from mtp.model.config import ModelConfig
from mtp.model.heads import HEADS

FRACTION_OF_AVAILABLE = 0.5
"""A step may use at most this fraction of the memory available when decoding starts: the estimate leaves out the
weights' working copies, the allocator's slack and what other processes take meanwhile."""

SCORE_BYTES = 4
"""Attention scores and logits are float32 (softmax upcasts), whatever the weights' dtype."""


@dataclass(frozen=True)
class StepMemory:
    """Estimated peak bytes of one decoding step, by part."""

    attention: int
    """Attention scores (B, n_heads, S, span) of one block (blocks run one after another), float32."""
    masks: int
    """The step's boolean mask (B, 1, S, span) and the float copy attention makes of it; a tree's own (N+1, N+1)."""
    logits: int
    """Head 1's logits after every position of the step (B, S, V), float32."""
    cache: int
    """Keys and values of every block (n_layers, 2, B, max_len, n_kv_heads, head_dim); causal heads' hidden states."""
    activations: int
    """One block's hidden states over the step (residual, q/k/v, the feed-forward's gate, up and product)."""

    @property
    def total(self) -> int:
        return self.attention + self.masks + self.logits + self.cache + self.activations


def step_bytes(
    config: ModelConfig,
    batch_size: int,
    max_len: int,
    step_positions: int,
    tree_nodes: int = 0,
    dtype: torch.dtype = torch.float32,
    logit_positions: int | None = None,
) -> StepMemory:
    """The peak memory of one decoding step of ``step_positions`` positions per row (1 + a tree's nodes, 1 + a chain's
    drafts, or a prompt's length) over ``batch_size`` rows, with a KV cache of ``max_len`` positions per row
    (:meth:`mtp.decode.plan.Plan.cache_length`) in ``dtype``. Attention spans the whole cache (as a
    compiled step's does; an eager step's spans the held positions and the step's, at most as many). Head 1's logits
    are counted at ``logit_positions`` per row (default: every position; a prompt's step reads only its last)."""
    B, S, span = batch_size, step_positions, max(max_len, step_positions)
    element = torch.empty((), dtype=dtype).element_size()
    head_dim = config.d_model // config.n_heads
    pairs = B * S * span  # (row, position, attended position)
    cache = config.n_layers * 2 * B * max_len * config.n_kv_heads * head_dim * element
    if HEADS[config.head_type].conditions_on_tokens:  # each depth's hidden states, read by the next (ChainCache)
        cache += (config.n_future - 1) * B * max_len * config.d_model * element
    widths = config.d_model + (config.n_heads + 2 * config.n_kv_heads) * head_dim + 3 * config.ffn_hidden
    return StepMemory(
        attention=pairs * config.n_heads * SCORE_BYTES,
        masks=pairs * (1 + SCORE_BYTES) + (tree_nodes + 1) ** 2,
        logits=B * (S if logit_positions is None else logit_positions) * config.vocab_size * SCORE_BYTES,
        cache=cache,
        activations=B * S * widths * element,
    )


def check_step_fits(
    model_config: ModelConfig,
    batch_size: int,
    max_len: int,
    step_positions: int,
    tree_nodes: int,
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
    logit_positions: int | None = None,
) -> None:
    """Raise a one-sentence :class:`UserError` when a decoding step (:func:`step_bytes`; ``tree_nodes`` 0 for a chain
    or a prompt) needs more than :data:`FRACTION_OF_AVAILABLE` of the memory ``device`` has available now. Nothing
    is checked where the available memory cannot be read."""
    device = torch.device(device)
    available = available_bytes(device)
    if available is None:
        return
    need = step_bytes(model_config, batch_size, max_len, step_positions, tree_nodes, dtype, logit_positions)
    if need.total <= FRACTION_OF_AVAILABLE * available:
        return
    step = f"over the {tree_nodes:,}-node draft tree" if tree_nodes else f"over {step_positions:,} positions per row"
    read = logit_positions or step_positions
    parts = {
        f"attention over {step_positions:,} positions": need.attention + need.masks,
        f"logits of {read:,} position{'s' if read > 1 else ''}": need.logits,
        f"a KV cache of {max_len:,} positions per row": need.cache,
        f"hidden states of {step_positions:,} positions": need.activations,
    }
    largest = max(parts, key=parts.__getitem__)
    where = "this machine has available" if device.type == "cpu" else f"{device} has free"
    fix = (
        "use a tree of fewer nodes or a smaller batch"
        if tree_nodes
        else "use shorter prompts, fewer drafts or a smaller batch"
    )
    raise UserError(
        f"a decoding step {step} at batch {batch_size} needs about {_gigabytes(need.total)} ({largest}), more than "
        f"half of the {_gigabytes(available)} {where}; {fix}."
    )


def available_bytes(device: torch.device) -> int | None:
    """Memory free for a new allocation on ``device``: CUDA's free memory; on CPU, MemAvailable (/proc/meminfo, else
    the free physical pages), less where a cgroup limit leaves less. None where it cannot be read (other devices)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    if device.type != "cpu":
        return None
    available = _meminfo_available()
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):  # not a POSIX system
            return None
    left = _cgroup_left()
    return min(available, left) if left is not None else available


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_left() -> int | None:
    """Bytes a memory cgroup (v2, else v1) lets this process's group allocate beyond what it uses; None: no limit."""
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            cap = Path(limit).read_text().strip()
            if cap == "max" or int(cap) >= 2**60:  # v1 writes "no limit" as a huge number
                return None
            return max(0, int(cap) - int(Path(usage).read_text().strip()))
        except (OSError, ValueError):
            continue
    return None


def _gigabytes(n: int) -> str:
    """Bytes as GB (10^9): whole above 10, one decimal below."""
    gb = n / 1e9
    return f"{gb:,.0f} GB" if gb >= 10 else f"{gb:.1f} GB"


def return_freed_memory() -> None:
    """Hand the C allocator's freed memory back to the system (glibc's ``malloc_trim``; nothing elsewhere). A tensor of
    a few megabytes, such as one block's matrix, is allocated from the allocator's heap, and freeing it keeps its pages
    resident for the process's later allocations: after dropping a copy of a model's weights, the process would stay
    as large as with it. What Python still references is not touched."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim(0)
