"""Scale from outside the model: tensor parallelism, activation checkpointing, per-block torch.compile, FSDP2.

The order is torchtitan's (``parallelize_llama``): tensor parallelism first (it changes what the blocks compute with),
then checkpointing, which wraps what compile traces (so the compiled graph recomputes activations itself), and
sharding last (so its hooks run around the compiled blocks, outside the graph). Everything is applied in place to a
plain :class:`MTPModel` and keeps parameter names as they are: checkpoints written from a parallelized model load into
a plain one, and the model file knows none of this.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from mtp.errors import UserError
from mtp.model import MTPModel
from mtp.model.config import ModelConfig

# Methods other than forward through which training and evaluation call the model; FSDP2 must treat them as
# forward passes (gather the root's parameters: embeddings, shared norm, unembeddings).
FORWARD_METHODS = ("head_states",)
TP_SETTING = "trainer.strategy.tensor_parallel_size"


def parallelize(
    model: MTPModel,
    *,
    activation_checkpointing: bool = False,
    compile: bool = False,
    mesh: Any = None,
    mp_policy: Any = None,
    tp_mesh: Any = None,
) -> MTPModel:
    """Apply the requested techniques to ``model`` in place, in the fixed order, and return it.

    ``tp_mesh``: a 1-D DeviceMesh to split the model over with tensor parallelism (None: none); ``mesh``: a 1-D
    DeviceMesh to shard over with FSDP2 (None: no sharding); ``mp_policy``: FSDP2's MixedPrecisionPolicy for the
    sharded model.
    """
    if tp_mesh is not None:
        apply_tp(model, tp_mesh)
    if activation_checkpointing:
        apply_activation_checkpointing(model)
    if compile:
        apply_compile(model)
    if mesh is not None:
        apply_fsdp(model, mesh, mp_policy)
    return model


def check_tensor_parallel(config: ModelConfig, tp: int, heads_class: type) -> None:
    """A UserError of one sentence unless ``config``'s model splits over ``tp`` processes: its attention heads (query
    and key-value), feed-forward width and vocabulary divisible by ``tp``, heads of a type that splits, no reduced
    draft vocabulary."""
    if tp <= 1:
        return
    if heads_class.not_split:
        raise UserError(
            f"model.head_type={config.head_type} heads {heads_class.not_split}, which {TP_SETTING}={tp} does not "
            "split; train them on one process or with trainer=fsdp."
        )
    if config.draft_vocab:
        raise UserError(
            f"model.draft_vocab={config.draft_vocab} picks draft tokens across the whole vocabulary, which {TP_SETTING}"
            f"={tp} splits; set model.draft_vocab=0 or train without tensor parallelism."
        )
    sizes = {
        "model.n_heads": config.n_heads,
        "model.n_kv_heads": config.n_kv_heads,
        "model.vocab_size": config.vocab_size,
        "the feed-forward width (from model.d_model)": config.ffn_hidden,
    }
    for name, size in sizes.items():
        if size % tp:
            raise UserError(
                f"{name}={size} is not divisible by {TP_SETTING}={tp}, so the processes cannot split it evenly; use a "
                f"tensor-parallel size that divides it."
            )


def check_tensor_parallel_loss(detach_heads: bool, tp: int) -> None:
    """A UserError of one sentence for a loss setting tensor parallelism does not compute: detached heads (their
    inputs read the shared norm's weight outside its module, which the split wraps)."""
    if tp > 1 and detach_heads:
        raise UserError(
            f"loss.detach_heads=true is not computed under {TP_SETTING}={tp}; fine-tune on one process or with "
            "trainer=fsdp, or drop loss.detach_heads."
        )


def apply_tp(model: MTPModel, mesh: Any) -> None:
    """Megatron-style tensor parallelism over a 1-D mesh (torchtitan's ``apply_tp``, without sequence parallelism).

    Every block's attention splits by heads (q, k and v by columns, the output projection by rows) and its SwiGLU by
    hidden units (w1 and w3 by columns, w2 by rows): one all-reduce after each. The input embedding and every
    unembedding split by vocabulary (rows); the loss scores each process's rows (:mod:`mtp.training.vocab_parallel`).
    Every other parameter (the norms, causal heads' input projections, Medusa's residual layers) stays whole on each
    process, as a replicated DTensor, so that gradient clipping and FSDP2 see DTensors on one mesh throughout.
    Activations between the parts are plain tensors, the same on every process of the group.
    """
    from torch.distributed.tensor import Replicate, Shard, distribute_module  # distributed: only when splitting
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    split = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(),
    }
    for block in model.blocks():
        parallelize_module(block, mesh, split)
    parallelize_module(model.tok_embeddings, mesh, RowwiseParallel(input_layouts=Replicate()))
    for output in model.heads.outputs:  # the loss reads the weight, never calls the module: only its rows matter
        parallelize_module(output, mesh, ColwiseParallel(output_layouts=Shard(-1)))
    done = {id(p) for p in model.parameters() if _is_dtensor(p)}
    for module in model.modules():
        own = [p for p in module.parameters(recurse=False) if id(p) not in done]
        if own:
            distribute_module(module, mesh, input_fn=_replicated_inputs, output_fn=_local_outputs)
            done |= {id(p) for p in own}


def data_parallel_size(trainer: Any) -> int:
    """The processes that read different batches: every process, less the tensor-parallel groups' (whose processes
    read the same batch); Lightning's distributed sampler settings say it."""
    kwargs = getattr(trainer.strategy, "distributed_sampler_kwargs", None)
    return kwargs["num_replicas"] if kwargs else trainer.world_size


def _replicated_inputs(module: nn.Module, inputs: tuple, mesh: Any) -> tuple:
    from torch.distributed.tensor import DTensor, Replicate  # distributed: only when splitting

    return tuple(
        DTensor.from_local(x, mesh, [Replicate()], run_check=False) if isinstance(x, torch.Tensor) else x
        for x in inputs
    )


def _local_outputs(module: nn.Module, output: Any, mesh: Any) -> Any:
    return output.to_local() if _is_dtensor(output) else output


def _is_dtensor(x: Any) -> bool:
    try:
        from torch.distributed.tensor import DTensor  # distributed: not every torch build has it
    except ImportError:
        return False
    return isinstance(x, DTensor)


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
    """Whether no single process holds the whole of ``module`` (FSDP2 shards it, or tensor parallelism splits it)."""
    from torch.distributed.fsdp import FSDPModule  # distributed: not every torch build has it

    return isinstance(module, FSDPModule) or any(_is_dtensor(p) for p in module.parameters())
