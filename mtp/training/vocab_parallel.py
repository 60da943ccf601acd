"""An unembedding split by vocabulary across the processes of a tensor-parallel group, as the loss sees it.

Under tensor parallelism (``trainer=tp``, :func:`mtp.training.parallel.apply_tp`) every unembedding's weight is a
DTensor sharded by rows: process r of the group holds rows ``[r V / tp, (r + 1) V / tp)``. The loss never gathers a
``[tokens, V]`` logits tensor: each process scores its shard of the vocabulary and the few numbers a cross-entropy
needs across shards are all-reduced (Megatron's vocab-parallel cross-entropy; torch's ``loss_parallel`` computes the
same for a plain cross-entropy, but not inside the sequential loss's one-head-at-a-time Function, which computes its
gradients in the forward):

- the log-sum-exp over the vocabulary: each shard's own, then theirs (the largest all-reduced by max, then the sum of
  the others' exponentials below it by sum);
- the logit of each target: found in the one shard that holds it, zero elsewhere, all-reduced by sum;
- a state's gradient: each shard's ``grad_logits @ W_shard`` is a partial sum over the vocabulary, all-reduced by
  sum; a weight's gradient is its shard's own.

On one process (a plain weight: :attr:`VocabPart.group` None) every reduction is the identity and each function is
the single-process computation itself, with the same operations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # a torch build without distributed support: every weight is whole
    DTensor = None


@dataclass
class VocabPart:
    """This process's rows of an unembedding: ``weight`` (V / tp, d) holding vocabulary ids ``[offset, offset +
    rows)``; ``group`` the tensor-parallel process group (None: the whole vocabulary, one process)."""

    weight: Tensor
    offset: int = 0
    group: Any = None

    @property
    def rows(self) -> int:
        return self.weight.size(0)


def is_split(weight: Tensor) -> bool:
    """Whether ``weight`` is a DTensor (split across processes)."""
    return DTensor is not None and isinstance(weight, DTensor)


def vocab_part(weight: Tensor) -> VocabPart:
    """This process's part of an unembedding weight (V, d): a DTensor sharded by rows over a 1-D tensor-parallel mesh
    gives its local rows (a differentiable view: autograd carries their gradient back into the DTensor); a replicated
    DTensor or a plain tensor is the whole vocabulary."""
    if not is_split(weight):
        return VocabPart(weight)
    mesh, placements = weight.device_mesh, weight.placements
    sharded = [dim for dim, placement in enumerate(placements) if placement.is_shard(0)]
    local = weight.to_local()
    if not sharded:
        return VocabPart(local)
    assert len(sharded) == 1 and mesh.ndim == 1, "the loss expects an unembedding split by rows over one mesh dim"
    return VocabPart(local, mesh.get_local_rank() * local.size(0), mesh.get_group())


def whole(weight: Tensor) -> Tensor:
    """The whole weight on every process (a split one gathered: for validation and decoding, which read one head's
    logits at a time as on one process)."""
    return weight.full_tensor() if is_split(weight) else weight


def all_reduce(tensor: Tensor, group: Any, op: Any = None) -> Tensor:
    """``tensor`` reduced in place across ``group`` (sum by default); the identity without a group."""
    if group is not None:
        dist.all_reduce(tensor, op=op or dist.ReduceOp.SUM, group=group)
    return tensor


def logsumexp(logits: Tensor, group: Any) -> Tensor:
    """The log-sum-exp over the whole vocabulary of logits (..., rows) split across ``group``: (..., 1). Each shard's
    own log-sum-exp, then theirs (only (..., 1) tensors cross the group, and no temporary the size of the logits is
    made beyond what one shard's log-sum-exp makes)."""
    local = logits.logsumexp(dim=-1, keepdim=True)
    if group is None:
        return local
    top = local.clone()
    all_reduce(top, group, dist.ReduceOp.MAX)
    total = (local - top).exp()
    return top + all_reduce(total, group).log()


def in_part(ids: Tensor, part: VocabPart) -> tuple[Tensor, Tensor]:
    """(whether each vocabulary id is one of ``part``'s rows, its index among them: 0 where it is not)."""
    local = ids - part.offset
    inside = (local >= 0) & (local < part.rows)
    return inside, torch.where(inside, local, torch.zeros_like(local))


def target_logits(logits: Tensor, targets: Tensor, part: VocabPart) -> Tensor:
    """The logit of each target (..., 1) of logits (..., rows) over ``part``'s rows; ``targets`` (..., 1) are
    vocabulary ids (not IGNORE)."""
    if part.group is None:
        return logits.gather(-1, targets)
    inside, local = in_part(targets, part)
    return all_reduce(logits.gather(-1, local) * inside, part.group)


def scatter_add(grad: Tensor, ids: Tensor, values: Tensor, part: VocabPart) -> Tensor:
    """``grad`` (..., rows) with ``values`` (..., K) added at vocabulary ids ``ids`` (..., K), those of ``part``'s rows
    (others fall outside this process's shard and are added by the process that holds them)."""
    if part.group is None:
        return grad.scatter_add_(-1, ids, values)
    inside, local = in_part(ids, part)
    return grad.scatter_add_(-1, local, values * inside)


def gather(values: Tensor, ids: Tensor, part: VocabPart) -> Tensor:
    """``values`` (..., rows) at vocabulary ids ``ids`` (..., K): each id's value from the shard holding it."""
    if part.group is None:
        return values.gather(-1, ids)
    inside, local = in_part(ids, part)
    return all_reduce(values.gather(-1, local) * inside, part.group)


def top_k(logits: Tensor, k: int, part: VocabPart) -> tuple[Tensor, Tensor]:
    """The ``k`` largest logits (..., k) over the whole vocabulary and their vocabulary ids: each shard's top k, then
    the top k of every shard's candidates (gathered: k per shard, never the vocabulary)."""
    k = min(k, logits.size(-1))
    values, index = logits.topk(k, dim=-1)
    if part.group is None:
        return values, index
    index = index + part.offset
    size = dist.get_world_size(part.group)
    all_values = [torch.empty_like(values) for _ in range(size)]
    all_index = [torch.empty_like(index) for _ in range(size)]
    dist.all_gather(all_values, values.contiguous(), group=part.group)
    dist.all_gather(all_index, index.contiguous(), group=part.group)
    values, choice = torch.cat(all_values, dim=-1).topk(k, dim=-1)
    return values, torch.cat(all_index, dim=-1).gather(-1, choice)
