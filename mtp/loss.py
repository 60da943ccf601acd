"""Multi-token targets and the two loss implementations.

Head k at position t predicts token t+k. A window of ``seq_len + n_future`` tokens gives every head
``seq_len`` targets. The total loss is the weighted sum of the heads' mean cross-entropies.

- ``naive``: every head's logits stay alive until the backward: peak memory O(n*V + d) per token.
- ``sequential``: the heads' unembeddings and cross-entropies run one head (and, with ``loss_chunk``,
  one chunk of positions) at a time inside a custom autograd Function, which computes each piece's
  loss together with its gradients and frees the logits before the next: peak O(V + d) per token.
  Its backward only scales the stored gradients by the incoming one (the loss scale: 1, 1/accumulation
  or AMP's). Everything before the unembedding (trunk, head blocks, shared norm) is the ordinary autograd
  graph, so FSDP2, DDP, torch.compile and activation checkpointing see plain modules, a training step is
  one ``loss.backward()``, and every parameter receives its gradient once, into ``.grad``.

Every head type fits this form, causal heads too: depth k's state depends on depth k-1's through ordinary autograd,
so the backward from the deepest depth carries the gradient of h_{k-1} down to the trunk, and what stays alive
between forward and backward is n hidden states of width d and the blocks' activations, never more than one
head's logits: peak O(V + n d) per token.

Head blocks keep their activations until the backward, as every block of a next-token model does; since
mtpN has as many blocks as mtp1, that costs no more than mtp1. What n heads add is n hidden states of
width d per token, never n vocabulary-sized logits.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from mtp.model import MTPModel


@dataclass
class LossOutput:
    total: Tensor
    """Weighted sum of per-head losses, scalar; differentiable in training."""
    per_head: Tensor
    """Unweighted mean cross-entropy of each head, (n_future,), detached."""


def split_window(window: Tensor, n_future: int) -> tuple[Tensor, Tensor]:
    """Inputs (B, T) and targets (n_future, B, T) from a window (B, T + n_future); targets[k-1] is shifted by k."""
    seq_len = window.size(1) - n_future
    assert seq_len >= 1, "window must be longer than n_future"
    inputs = window[:, :seq_len]
    targets = torch.stack([window[:, k : k + seq_len] for k in range(1, n_future + 1)])
    return inputs, targets


def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy in fp32 over all positions; logits (..., V), targets (...)."""
    if logits.element_size() < 4:  # bf16/fp16 logits: softmax in fp32
        logits = logits.float()
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def head_logits(model: MTPModel, states: list[Tensor], targets: Tensor) -> Iterator[tuple[int, Tensor, Tensor]]:
    """Head k's logits (B, T, V) and targets (B, T), for k = 1..n in turn, from :func:`window_states`' output.

    Each head's logits are computed only when asked for: a caller that drops them before the next (validation)
    keeps one head's alive at a time. The sequential loss does not come through here: it unembeds inside its
    autograd Function, in chunks of positions, computing the gradients as it goes.
    """
    for k, state in enumerate(states, start=1):
        yield k, model.unembedding(k)(state), targets[k - 1]


def naive_loss(model: MTPModel, states: list[Tensor], targets: Tensor, weights: list[float]) -> LossOutput:
    """Every head's logits at once, through plain autograd."""
    losses = torch.stack([cross_entropy(logits, target) for _, logits, target in head_logits(model, states, targets)])
    total = (losses * losses.new_tensor(weights)).sum()
    return LossOutput(total, losses.detach())


def sequential_loss(
    model: MTPModel, states: list[Tensor], targets: Tensor, weights: list[float], chunk: int = 0
) -> LossOutput:
    """The same loss as :func:`naive_loss`, with at most one head's (or one chunk's) logits alive at a time."""
    position = {id(module): i for i, module in enumerate(model.outputs)}  # modules, not parameters: FSDP swaps those
    which = [position[id(model.unembedding(k))] for k in range(1, len(states) + 1)]
    unembeddings = [module.weight for module in model.outputs]
    total, per_head = _HeadsCrossEntropy.apply(targets, weights, which, chunk, len(states), *states, *unembeddings)
    return LossOutput(total, per_head)


class _HeadsCrossEntropy(torch.autograd.Function):
    """sum_k weight_k * CE(state_k @ W_k^T, targets_k), computing its gradients piece by piece in the forward.

    Inputs after the settings: the n head states (B, T, d) and the distinct unembedding weights (V, d);
    ``which[k]`` picks head k+1's weight. Ops run under the caller's autocast, like the autograd graph they
    replace: the matmuls in the autocast dtype, the softmax in fp32; the weight gradients accumulate in the
    weights' dtype over heads and chunks.
    """

    @staticmethod
    def forward(ctx, targets, weights, which, chunk, n_heads, *tensors):
        states, unembeddings = tensors[:n_heads], tensors[n_heads:]
        needs_grad = ctx.needs_input_grad[5:]
        grad_states = [torch.empty_like(s) if needs_grad[k] else None for k, s in enumerate(states)]
        grad_weights = [torch.zeros_like(w) if needs_grad[n_heads + i] else None for i, w in enumerate(unembeddings)]
        losses = []
        for k, state in enumerate(states):
            weight, index = unembeddings[which[k]], which[k]
            T = state.size(1)
            step = chunk if chunk > 0 else T
            loss_sum = state.new_zeros((), dtype=torch.float32)
            scale = weights[k] / targets[k].numel()
            for start in range(0, T, step):
                piece = state[:, start : start + step]  # (B, c, d)
                piece_targets = targets[k][:, start : start + step, None]  # (B, c, 1)
                logits = F.linear(piece, weight)  # (B, c, V), in the autocast dtype if one is active
                compute_dtype = logits.dtype
                logits = logits.float()
                log_norm = logits.logsumexp(dim=-1, keepdim=True)  # (B, c, 1)
                loss_sum += (log_norm - logits.gather(-1, piece_targets)).sum()
                # d(scale * CE)/d logits = scale * (softmax - one_hot(target)), built in place of the logits
                grad_logits = logits.sub_(log_norm).exp_()
                grad_logits.scatter_add_(-1, piece_targets, torch.full_like(log_norm, -1.0)).mul_(scale)
                grad_logits = grad_logits.to(compute_dtype)
                if grad_states[k] is not None:
                    grad_states[k][:, start : start + step] = grad_logits @ weight
                if grad_weights[index] is not None:
                    grad_weights[index] += torch.einsum("bcv,bcd->vd", grad_logits, piece)
                del logits, grad_logits
            losses.append(loss_sum / targets[k].numel())
        per_head = torch.stack(losses)
        total = (per_head * per_head.new_tensor(weights)).sum()
        # Plain attributes, not saved tensors: backward hands them to autograd and drops its own reference, so
        # AccumulateGrad can adopt them without a copy (a training step runs backward once).
        ctx.stored_grads = [*grad_states, *grad_weights]
        ctx.mark_non_differentiable(per_head)
        return total, per_head

    @staticmethod
    def backward(ctx, grad_total: Tensor, _grad_per_head: Tensor):
        assert hasattr(ctx, "stored_grads"), "the sequential loss supports one backward per forward"
        grads = ctx.stored_grads
        del ctx.stored_grads
        for g in grads:
            if g is not None:
                g.mul_(grad_total.to(g.dtype))  # the loss scale: 1, 1/accumulation, or AMP's scale
        return (None, None, None, None, None, *grads)


def window_states(model: MTPModel, window: Tensor) -> tuple[list[Tensor], Tensor]:
    """Every head's normed state (n x (B, T, d)) over a window's inputs, and the targets (n, B, T).

    Causal heads condition on the true tokens before the one they predict: head k at t on token t + k - 1.
    """
    inputs, targets = split_window(window, model.config.n_future)
    return model.head_states(inputs, following=targets[:-1]), targets


def mtp_loss(model: MTPModel, window: Tensor, mode: str | None = None) -> LossOutput:
    """Training loss of a token window (B, seq_len + n_future) in the given mode (default: the model config's)."""
    config = model.config
    states, targets = window_states(model, window)
    mode = mode or config.loss
    if mode == "naive" or not torch.is_grad_enabled():
        return naive_loss(model, states, targets, config.weights)
    return sequential_loss(model, states, targets, config.weights, config.loss_chunk)
