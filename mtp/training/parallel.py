"""Scale from outside the model: activation checkpointing, then per-block torch.compile, then FSDP2 sharding.

The order is torchtitan's (``parallelize``): checkpointing wraps what compile traces (so the compiled graph
recomputes activations itself), and sharding comes last (so its hooks run around the compiled blocks,
outside the graph). Everything is applied in place to a plain :class:`MTPModel` and keeps parameter names
as they are: checkpoints written from a parallelized model load into a plain one, and the model file knows
none of this.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from mtp.model import MTPModel

# Methods other than forward through which training and evaluation call the model; FSDP2 must treat them as
# forward passes (gather the root's parameters: embeddings, shared norm, unembeddings).
FORWARD_METHODS = ("head_states",)


def parallelize(
    model: MTPModel,
    *,
    activation_checkpointing: bool = False,
    compile: bool = False,
    mesh: Any = None,
    mp_policy: Any = None,
) -> MTPModel:
    """Apply the requested techniques to ``model`` in place, in the fixed order, and return it.

    ``mesh``: a 1-D DeviceMesh to shard over with FSDP2 (None: no sharding); ``mp_policy``: FSDP2's
    MixedPrecisionPolicy for the sharded model.
    """
    if activation_checkpointing:
        apply_activation_checkpointing(model)
    if compile:
        apply_compile(model)
    if mesh is not None:
        apply_fsdp(model, mesh, mp_policy)
    return model


def apply_activation_checkpointing(model: MTPModel) -> None:
    """Every block (trunk and heads) keeps only its input and recomputes the rest in the backward."""
    for block in model.blocks():
        block.forward = _checkpointed(block.forward)


def _checkpointed(forward: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    # A function that calls checkpoint, rather than checkpoint itself, so that torch.compile has a frame to
    # trace and records the recomputation in its graph.
    def checkpointed_forward(*args, **kwargs):
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return checkpointed_forward


def apply_compile(model: MTPModel) -> None:
    """Compile each block on its own (blocks share one graph: identical structure, parameters as inputs).

    ``nn.Module.compile`` works in place, so parameter names stay free of ``_orig_mod`` prefixes.
    """
    for block in model.blocks():
        block.compile(fullgraph=True)


def apply_fsdp(model: MTPModel, mesh: Any, mp_policy: Any = None) -> None:
    """FSDP2: each block is its own unit, the root holds the embeddings, the shared norm and the unembeddings.

    The root keeps its parameters gathered from forward to backward (FSDP2's default for the root), so the
    loss can read the unembeddings after ``head_states`` returns.
    """
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method  # distributed: only when sharding

    settings = {"mesh": mesh} if mp_policy is None else {"mesh": mesh, "mp_policy": mp_policy}
    for block in model.blocks():
        fully_shard(block, **settings)
    fully_shard(model, **settings)
    for name in FORWARD_METHODS:
        register_fsdp_forward_method(model, name)


def is_sharded(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule  # distributed: not every torch build has it

    return isinstance(module, FSDPModule)
