"""Multi-token targets and the two loss implementations.

Head k at position t predicts token t+k. A window of ``seq_len + n_future`` tokens gives every head
``seq_len`` targets. The total loss is the weighted sum of the heads' mean cross-entropies.

- ``naive``: every head's logits stay alive until one backward: peak memory O(n*V + d) per token.
- ``sequential``: the trunk runs once; on its detached output each head in turn runs forward and
  backward alone, so only one head's logits exist at a time: peak O(V + d). A custom autograd Function
  does that work in its forward and returns the stored gradients in its backward, so a training step
  is still one ``loss.backward()`` (what Lightning's automatic optimization, gradient accumulation,
  clipping, mixed precision and DDP expect).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

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


def naive_loss(model: MTPModel, z: Tensor, targets: Tensor, weights: list[float]) -> LossOutput:
    losses = torch.stack(
        [
            cross_entropy(model.head_logits(k, model.head_hidden(k, z)), targets[k - 1])
            for k in range(1, len(weights) + 1)
        ]
    )
    total = (losses * losses.new_tensor(weights)).sum()
    return LossOutput(total, losses.detach())


def head_loss_and_grads(
    model: MTPModel, k: int, z: Tensor, targets: Tensor, weight: float, params: list[Tensor], chunk: int
) -> tuple[Tensor, Tensor, list[Tensor | None]]:
    """Head k's mean loss, and d(weight * loss)/dz and /dparams, computed without keeping its logits.

    z is the detached trunk output (B, T, d) with requires_grad. With chunk > 0 the unembedding and
    loss run over ``chunk`` positions at a time, so at most (B, chunk, V) logits exist at once.
    """
    if chunk <= 0:
        loss = cross_entropy(model.head_logits(k, model.head_hidden(k, z)), targets)
        grads = torch.autograd.grad(weight * loss, [z, *params], allow_unused=True)
        return loss.detach(), grads[0], list(grads[1:])

    # The head's block runs once over the whole sequence (attention needs it); only the norm, the
    # unembedding and the loss are chunked, into a gradient for the block's output.
    hidden = model.head_hidden(k, z)
    detached_hidden = hidden.detach().requires_grad_()
    out_params = list(model.norm.parameters()) + list(model.unembedding(k).parameters())
    grad_hidden = torch.zeros_like(detached_hidden)
    grad_out: list[Tensor | None] = [None] * len(out_params)
    loss_sum = 0.0
    for start in range(0, z.size(1), chunk):
        piece = detached_hidden[:, start : start + chunk]  # (B, chunk, d)
        piece_targets = targets[:, start : start + chunk]
        piece_loss = cross_entropy(model.head_logits(k, piece), piece_targets) * piece_targets.numel()  # summed
        g_piece, *g_params = torch.autograd.grad(
            piece_loss * (weight / targets.numel()), [piece, *out_params], allow_unused=True
        )
        grad_hidden[:, start : start + chunk] += g_piece
        grad_out = [_add(a, b) for a, b in zip(grad_out, g_params, strict=True)]
        loss_sum = loss_sum + piece_loss.detach()
    block_params = [p for p in params if not any(p is q for q in out_params)]
    grad_z, *grad_block = torch.autograd.grad(hidden, [z, *block_params], grad_hidden, allow_unused=True)
    by_id = {id(p): g for p, g in zip(block_params, grad_block, strict=True)}
    by_id.update({id(p): g for p, g in zip(out_params, grad_out, strict=True)})
    return loss_sum / targets.numel(), grad_z, [by_id.get(id(p)) for p in params]


def _add(acc: Tensor | None, g: Tensor | None) -> Tensor | None:
    if g is None:
        return acc
    return g if acc is None else acc.add_(g)  # autograd.grad's results are fresh tensors we own


class _SequentialHeads(torch.autograd.Function):
    """Forward: every head's loss and gradients, one head at a time. Backward: hand back the stored gradients."""

    @staticmethod
    def forward(ctx, z: Tensor, targets: Tensor, model: MTPModel, weights: list[float], chunk: int, *params: Tensor):
        index = {id(p): i for i, p in enumerate(params)}
        grad_params: list[Tensor | None] = [None] * len(params)
        grad_z = torch.zeros_like(z)
        losses = []
        with torch.enable_grad():
            z_leaf = z.detach().requires_grad_()
            for k, weight in enumerate(weights, start=1):
                head_params = model.head_parameters(k)
                loss, g_z, g_head = head_loss_and_grads(model, k, z_leaf, targets[k - 1], weight, head_params, chunk)
                grad_z += g_z
                for p, g in zip(head_params, g_head, strict=True):
                    grad_params[index[id(p)]] = _add(grad_params[index[id(p)]], g)
                losses.append(loss)
        per_head = torch.stack(losses)
        total = (per_head * per_head.new_tensor(weights)).sum()
        # Gradients are plain attributes, not saved tensors: backward hands them to autograd and drops its own
        # reference, so AccumulateGrad can adopt them without a copy (a training step runs backward once).
        ctx.stored_grads = [grad_z, *grad_params]
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
        return (grads[0], None, None, None, None, *grads[1:])


def sequential_loss(model: MTPModel, z: Tensor, targets: Tensor, weights: list[float], chunk: int = 0) -> LossOutput:
    params = _unique([p for k in range(1, len(weights) + 1) for p in model.head_parameters(k) if p.requires_grad])
    total, per_head = _SequentialHeads.apply(z, targets, model, weights, chunk, *params)
    return LossOutput(total, per_head)


def _unique(params: list[Tensor]) -> list[Tensor]:
    seen: set[int] = set()
    return [p for p in params if not (id(p) in seen or seen.add(id(p)))]


def mtp_loss(model: MTPModel, window: Tensor, mode: str | None = None) -> LossOutput:
    """Training loss of a token window (B, seq_len + n_future) in the given mode (default: the model config's)."""
    config = model.config
    inputs, targets = split_window(window, config.n_future)
    z = model.trunk(inputs)
    mode = mode or config.loss
    if mode == "naive" or not torch.is_grad_enabled():
        return naive_loss(model, z, targets, config.weights)
    return sequential_loss(model, z, targets, config.weights, config.loss_chunk)
