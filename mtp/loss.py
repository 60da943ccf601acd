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

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from mtp.model import IGNORE, MTPModel


@dataclass
class LossOutput:
    total: Tensor
    """Weighted sum of per-head losses, scalar; differentiable in training."""
    per_head: Tensor
    """Unweighted mean cross-entropy of each head, (n_future,), detached; nan for a head not computed."""
    heads: list[int]
    """The heads computed (1-based): in training, those with a gradient to give (:func:`trained_heads`)."""


def split_window(window: Tensor, n_future: int) -> tuple[Tensor, Tensor]:
    """Inputs (B, T) and targets (n_future, B, T) from a window (B, T + n_future); targets[k-1] is shifted by k."""
    seq_len = window.size(1) - n_future
    if seq_len < 1:
        raise ValueError(f"a window of {window.size(1)} tokens is not longer than n_future={n_future}")
    inputs = window[:, :seq_len]
    targets = torch.stack([window[:, k : k + seq_len] for k in range(1, n_future + 1)])
    return inputs, targets


def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy in fp32 over the positions whose target is not IGNORE (0 if none is); logits (..., V),
    targets (...)."""
    if logits.element_size() < 4:  # bf16/fp16 logits: softmax in fp32
        logits = logits.float()
    flat = targets.reshape(-1)
    total = F.cross_entropy(logits.reshape(-1, logits.size(-1)), flat, ignore_index=IGNORE, reduction="sum")
    return total / (flat != IGNORE).sum().clamp(min=1)


def trained_heads(model: MTPModel, states: list[Tensor]) -> list[int]:
    """The heads (1-based) whose loss has a gradient to give: under autograd, those whose state or unembedding needs
    one. A head 1 frozen with the trunk (heads trained on a pretrained model) has none, and its loss would cost an
    unembedding of every position for a constant; outside autograd (validation), every head."""
    every = list(range(1, len(states) + 1))
    if not torch.is_grad_enabled():
        return every
    needed = [k for k in every if states[k - 1].requires_grad or model.unembedding(k).weight.requires_grad]
    return needed or every


def head_logits(model: MTPModel, states: list[Tensor], targets: Tensor) -> Iterator[tuple[int, Tensor, Tensor]]:
    """Head k's logits (B, T, V or K) and targets as indices into them (B, T; IGNORE for a token a reduced draft
    vocabulary lacks), for k = 1..n in turn, from :func:`window_states`' output.

    Each head's logits are computed only when asked for: a caller that drops them before the next (validation)
    keeps one head's alive at a time. The sequential loss does not come through here: it unembeds inside its
    autograd Function, in chunks of positions, computing the gradients as it goes.
    """
    for k, state in enumerate(states, start=1):
        yield k, model.head_logits(k, state), model.head_targets(k, targets[k - 1])


def _per_head(losses: Tensor, heads: list[int], n: int) -> Tensor:
    per_head = losses.new_full((n,), float("nan"))
    per_head[torch.tensor(heads, device=losses.device) - 1] = losses
    return per_head


def naive_loss(model: MTPModel, states: list[Tensor], targets: Tensor, weights: list[float]) -> LossOutput:
    """Every head's logits at once, through plain autograd."""
    heads = trained_heads(model, states)
    losses = torch.stack(
        [cross_entropy(model.head_logits(k, states[k - 1]), model.head_targets(k, targets[k - 1])) for k in heads]
    )
    total = (losses * losses.new_tensor([weights[k - 1] for k in heads])).sum()
    return LossOutput(total, _per_head(losses.detach(), heads, len(states)), heads)


def sequential_loss(
    model: MTPModel, states: list[Tensor], targets: Tensor, weights: list[float], chunk: int = 0
) -> LossOutput:
    """The same loss as :func:`naive_loss`, with at most one head's (or one chunk's) logits alive at a time."""
    heads = trained_heads(model, states)
    # the distinct matrices the heads score with: one per unembedding module and vocabulary (the rows of a reduced
    # draft vocabulary are gathered once, by ordinary autograd, which carries their gradient back to the module's)
    position: dict[tuple[int, bool], int] = {}
    scored, which = [], []
    for k in heads:
        key = (id(model.unembedding(k)), model.head_vocab(k) is not None)  # modules, not parameters: FSDP swaps those
        if key not in position:
            position[key] = len(scored)
            scored.append(model.head_weight(k))
        which.append(position[key])
    head_targets = torch.stack([model.head_targets(k, targets[k - 1]) for k in heads])
    head_states = [states[k - 1] for k in heads]
    settings = (head_targets, [weights[k - 1] for k in heads], which, chunk, len(heads))
    total, losses = _HeadsCrossEntropy.apply(*settings, *head_states, *scored)
    return LossOutput(total, _per_head(losses, heads, len(states)), heads)


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
            counted = (targets[k] != IGNORE).sum().clamp(min=1)  # a tensor: no device sync
            scale = weights[k] / counted
            for start in range(0, T, step):
                piece = state[:, start : start + step]  # (B, c, d)
                piece_targets = targets[k][:, start : start + step, None]  # (B, c, 1)
                valid = piece_targets != IGNORE  # tokens outside a reduced draft vocabulary count for nothing
                piece_targets = piece_targets.clamp(min=0)
                logits = F.linear(piece, weight)  # (B, c, V), in the autocast dtype if one is active
                compute_dtype = logits.dtype
                logits = logits.float()
                log_norm = logits.logsumexp(dim=-1, keepdim=True)  # (B, c, 1)
                loss_sum += ((log_norm - logits.gather(-1, piece_targets)) * valid).sum()
                # d(scale * CE)/d logits = scale * (softmax - one_hot(target)), built in place of the logits
                grad_logits = logits.sub_(log_norm).exp_()
                grad_logits.scatter_add_(-1, piece_targets, torch.full_like(log_norm, -1.0)).mul_(valid * scale)
                grad_logits = grad_logits.to(compute_dtype)
                if grad_states[k] is not None:
                    grad_states[k][:, start : start + step] = grad_logits @ weight
                if grad_weights[index] is not None:
                    grad_weights[index] += torch.einsum("bcv,bcd->vd", grad_logits, piece)
                del logits, grad_logits
            losses.append(loss_sum / counted)
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


def window_states(
    model: MTPModel, window: Tensor, trunk: Callable[[Tensor], Tensor] | None = None
) -> tuple[list[Tensor], Tensor]:
    """Every head's normed state (n x (B, T, d)) over a window's inputs, and the targets (n, B, T).

    Causal heads condition on the true tokens before the one they predict: head k at t on token t + k - 1.
    ``trunk(inputs)``: the trunk's output from elsewhere (:class:`mtp.trunk_cache.TrunkCache`); default: the model's.
    """
    inputs, targets = split_window(window, model.config.n_future)
    return model.head_states(inputs, following=targets[:-1], trunk=trunk(inputs) if trunk else None), targets


def mtp_loss(
    model: MTPModel, window: Tensor, mode: str | None = None, trunk: Callable[[Tensor], Tensor] | None = None
) -> LossOutput:
    """Training loss of a token window (B, seq_len + n_future) in the given mode (default: the model config's); the
    trunk's output from ``trunk(inputs)`` if given (see :func:`window_states`)."""
    config = model.config
    states, targets = window_states(model, window, trunk)
    mode = mode or config.loss
    if mode == "naive" or not torch.is_grad_enabled():
        return naive_loss(model, states, targets, config.weights)
    return sequential_loss(model, states, targets, config.weights, config.loss_chunk)
