"""Multi-token targets and the two loss implementations (and what heads 2..n learn: the corpus or head 1).

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

Under ``loss.head_loss=distill`` (or ``ce+distill``) heads 2..n learn head 1's distribution cut to its top K
(:class:`Teacher`, computed without a gradient, one chunk at a time) instead of (or beside) the corpus token; the
same Function computes that term's gradient T (softmax(logits / T) - teacher) piece by piece, so the peak stays
O(V + n d) per token, plus K indices and probabilities per position and head.

Head blocks keep their activations until the backward, as every block of a next-token model does; since
mtpN has as many blocks as mtp1, that costs no more than mtp1. What n heads add is n hidden states of
width d per token, never n vocabulary-sized logits.

Under tensor parallelism (``trainer=tp``) each unembedding is split by vocabulary across the tensor-parallel group:
the Function scores this process's rows and all-reduces the log-sum-exps, target logits and state gradients across
the group (:mod:`mtp.training.vocab_parallel`), so the peak per process is O(V / tp + n d) per token. Validation and
the naive form read the whole weight (gathered), one head's logits at a time, as on one process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from mtp.model.transformer import IGNORE, MTPModel
from mtp.training.loss_config import LossConfig
from mtp.training.vocab_parallel import (
    VocabPart,
    all_reduce,
    gather,
    is_split,
    logsumexp,
    scatter_add,
    target_logits,
    top_k,
    vocab_part,
    whole,
)


@dataclass
class LossOutput:
    total: Tensor
    """Weighted sum of per-head losses, scalar; differentiable in training."""
    per_head: Tensor
    """Unweighted mean cross-entropy of each head, (n_future,), detached; nan for a head not computed."""
    heads: list[int]
    """The heads computed (1-based): in training, those with a gradient to give (:func:`trained_heads`)."""
    head1_future: Tensor | None = None
    """Under ``loss.head1_targets``: head 1's unweighted mean cross-entropy against tokens t+2..t+k, (k - 1,),
    detached (its next-token one is ``per_head[0]``); None otherwise."""


@dataclass
class Head1Targets:
    """Head 1 scored against tokens after the next too (:attr:`LossConfig.head1_targets`): the targets and their
    weights, relative to head 1's."""

    targets: Tensor
    """(k - 1, B, T): token t + j at position t for j = 2..k; IGNORE where it lies past the window."""
    weights: list[float]
    """k weights: the next token's term, then those of tokens t+2..t+k (:meth:`LossConfig.head1_weights_at`)."""

    @classmethod
    def of_window(cls, window: Tensor, seq_len: int, weights: list[float]) -> Head1Targets:
        """Head 1's targets after the next in a window (B, seq_len + n_future) of ``len(weights)`` targets."""
        targets = window.new_full((len(weights) - 1, window.size(0), seq_len), IGNORE)
        for j in range(2, len(weights) + 1):
            span = min(seq_len, window.size(1) - j)  # positions whose token t + j lies in the window
            if span > 0:
                targets[j - 2, :, :span] = window[:, j : j + span]
        return cls(targets, list(weights))


def split_window(window: Tensor, n_future: int) -> tuple[Tensor, Tensor]:
    """Inputs (B, T) and targets (n_future, B, T) from a window (B, T + n_future); targets[k-1] is shifted by k."""
    seq_len = window.size(1) - n_future
    if seq_len < 1:
        raise ValueError(f"a window of {window.size(1)} tokens is not longer than n_future={n_future}")
    inputs = window[:, :seq_len]
    targets = torch.stack([window[:, k : k + seq_len] for k in range(1, n_future + 1)])
    return inputs, targets


def answer_targets(window: Tensor, targets: Tensor, marker: int, end: int) -> Tensor:
    """``targets`` (n, B, T) of ``window`` (B, T + n) with IGNORE wherever the target is not in an answer: a token is in
    one when a ``marker`` token came after the last ``end`` token before it (the end token closing an answer is in it).
    A window that opens inside an answer scores that answer's rest for nothing: where it began is not in the window."""
    position = torch.arange(window.size(1), device=window.device).expand_as(window)
    last_marker = torch.where(window == marker, position, -1).cummax(dim=1).values
    last_end = torch.where(window == end, position, -1).cummax(dim=1).values
    inside = last_marker > last_end  # (B, T + n): the token after position j is in an answer
    seq_len = targets.size(2)
    keep = torch.stack([inside[:, k - 1 : k - 1 + seq_len] for k in range(1, targets.size(0) + 1)])
    return targets.masked_fill(~keep, IGNORE)


def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy in fp32 over the positions whose target is not IGNORE (0 if none is); logits (..., V),
    targets (...)."""
    if logits.element_size() < 4:  # bf16/fp16 logits: softmax in fp32
        logits = logits.float()
    flat = targets.reshape(-1)
    total = F.cross_entropy(logits.reshape(-1, logits.size(-1)), flat, ignore_index=IGNORE, reduction="sum")
    return total / (flat != IGNORE).sum().clamp(min=1)


@dataclass
class Teacher:
    """Head 1's distribution at every position, cut to its ``top_k`` most probable tokens and renormalised (HASS's
    top-K distillation target): what heads 2..n learn under ``loss.head_loss=distill``. Computed without a gradient
    (the teacher is a constant of the step) and one chunk of positions at a time, so that no (B, T, V) tensor stays.
    The tokens are indices into a draft head's logits (the reduced draft vocabulary's order when there is one: the
    teacher is head 1's distribution over the tokens a draft head scores)."""

    tokens: Tensor
    """(B, T, K) the tokens, as indices into a draft head's logits."""
    probs: Tensor
    """(B, T, K) their probabilities at the distillation temperature, summing to 1 at each position (fp32)."""
    entropy: Tensor
    """(B, T) the entropy of ``probs`` (subtracted, so that the loss reads as a KL divergence, 0 at a perfect head)."""
    temperature: float

    @classmethod
    @torch.no_grad()
    def of_head1(cls, model: MTPModel, state: Tensor, top_k_count: int, temperature: float, chunk: int = 0) -> Teacher:
        """The teacher from head 1's normed state (B, T, d): its ``top_k_count`` most probable tokens."""
        vocab = model.head_vocab(2) if model.config.n_future > 1 else None
        weight = model.unembedding(1).weight
        weight = weight if vocab is None else weight[vocab]  # head 1's scores of the tokens a draft head scores
        part = vocab_part(weight)  # this process's rows, under tensor parallelism
        positions = state.size(1)
        step = chunk if chunk > 0 else positions
        tokens, probs = [], []
        for start in range(0, positions, step):
            logits = F.linear(state[:, start : start + step], part.weight).float() / temperature
            top, index = top_k(logits, top_k_count, part)
            tokens.append(index)
            probs.append(top.softmax(dim=-1))  # softmax over the top K: the top K's probabilities, renormalised
            del logits
        probs = torch.cat(probs, dim=1)
        entropy = -(probs * probs.clamp(min=1e-30).log()).sum(dim=-1)
        return cls(torch.cat(tokens, dim=1), probs, entropy, temperature)

    def for_head(self, k: int) -> Teacher:
        """What head k at position t learns: head 1's distribution at position t + k - 1 (where head 1 predicts the
        token head k drafts); the last k - 1 positions, whose head-1 position lies past the window, get none (their
        ``probs`` are zero, so they count for nothing)."""
        shift = k - 1
        if shift == 0:
            return self
        T = self.tokens.size(1)

        def moved(x: Tensor) -> Tensor:
            out = torch.zeros_like(x)
            if shift < T:
                out[:, : T - shift] = x[:, shift:]
            return out

        return Teacher(moved(self.tokens), moved(self.probs), moved(self.entropy), self.temperature)

    @property
    def valid(self) -> Tensor:
        """(B, T) the positions with a teacher."""
        return self.probs.sum(dim=-1) > 0


def distill_loss(logits: Tensor, teacher: Teacher) -> Tensor:
    """Mean over the positions with a teacher of T^2 KL(teacher || softmax(logits / T)), the teacher's support its
    top K; logits (B, T, V or K) head k's, ``teacher`` already moved to head k (:meth:`Teacher.for_head`)."""
    t = teacher.temperature
    log_q = (logits.float() / t).log_softmax(dim=-1)
    cross = -(teacher.probs * log_q.gather(-1, teacher.tokens)).sum(dim=-1)  # (B, T)
    valid = teacher.valid
    return t * t * ((cross - teacher.entropy) * valid).sum() / valid.sum().clamp(min=1)


def head_teachers(
    model: MTPModel, states: list[Tensor], heads: list[int], settings: LossConfig, chunk: int = 0
) -> dict[int, Teacher]:
    """Head k's teacher for every head k >= 2 among ``heads`` that distils (``settings.head_loss``); empty under
    'ce'."""
    distilled = [k for k in heads if k > 1] if settings.head_loss != "ce" else []
    if not distilled:
        return {}
    teacher = Teacher.of_head1(model, states[0], settings.distill_top_k, settings.distill_temperature, chunk)
    return {k: teacher.for_head(k) for k in distilled}


def uses_ce(settings: LossConfig, k: int) -> bool:
    """Whether head k's loss has the corpus token's cross-entropy (head 1 always; heads 2..n unless 'distill')."""
    return k == 1 or settings.head_loss != "distill"


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
        yield k, unembed(model, k, state), model.head_targets(k, targets[k - 1])


def unembed(model: MTPModel, k: int, state: Tensor, detach_heads: bool = False) -> Tensor:
    """Head k's logits (..., V or K) of its normed state: :meth:`MTPModel.head_logits`, with the whole weight on every
    process where tensor parallelism split it (gathered); through no gradient to head 1's unembedding where head k
    shares it and ``detach_heads`` (:attr:`LossConfig.detach_heads`)."""
    weight = model.head_weight(k)
    detached = detached_unembedding(model, k, detach_heads)
    if is_split(weight):
        return F.linear(state, whole(weight).detach() if detached else whole(weight))
    return F.linear(state, weight.detach()) if detached else model.head_logits(k, state)


def detached_unembedding(model: MTPModel, k: int, detach_heads: bool) -> bool:
    """Whether head k's loss reaches its unembedding through no gradient: under ``detach_heads``, a head k >= 2 that
    scores with head 1's unembedding (shared by transformer and causal heads; medusa, linear and EAGLE-3 drafts train
    their own)."""
    return detach_heads and k > 1 and model.unembedding(k) is model.unembedding(1)


def _per_head(losses: Tensor, heads: list[int], n: int) -> Tensor:
    per_head = losses.new_full((n,), float("nan"))
    per_head[torch.tensor(heads, device=losses.device) - 1] = losses
    return per_head


class Scoring(NamedTuple):
    """How a window's heads are scored: each head's weight, the loss settings (what heads 2..n learn from), and head
    1's targets after the next (None: none)."""

    weights: list[float]
    settings: LossConfig
    head1: Head1Targets | None


def naive_loss(model: MTPModel, states: list[Tensor], targets: Tensor, scoring: Scoring) -> LossOutput:
    """Every head's logits at once, through plain autograd (what heads 2..n learn from: ``settings``; head 1's targets
    after the next: ``head1``)."""
    weights, settings, head1 = scoring
    heads = trained_heads(model, states)
    teachers = head_teachers(model, states, heads, settings)
    losses, future, total = [], None, 0.0
    for k in heads:
        logits = unembed(model, k, states[k - 1], settings.detach_heads)
        loss = cross_entropy(logits, model.head_targets(k, targets[k - 1])) if uses_ce(settings, k) else 0.0
        losses.append(loss + distill_loss(logits, teachers[k]) if k in teachers else loss)
        if k == 1 and head1 is not None:
            future = torch.stack([cross_entropy(logits, model.head_targets(1, t)) for t in head1.targets])
            total = weights[0] * (future * future.new_tensor(head1.weights[1:])).sum()
    losses = torch.stack(losses)
    scaled = [weights[k - 1] * (head1.weights[0] if k == 1 and head1 is not None else 1.0) for k in heads]
    total = total + (losses * losses.new_tensor(scaled)).sum()
    future = future.detach() if future is not None else None
    return LossOutput(total, _per_head(losses.detach(), heads, len(states)), heads, future)


def sequential_loss(model: MTPModel, states: list[Tensor], targets: Tensor, scoring: Scoring) -> LossOutput:
    """The same loss as :func:`naive_loss`, with at most one head's (or one chunk's: ``settings.loss_chunk``
    positions) logits alive at a time; head 1's targets after the next (``head1``) are scored on its logits in the
    same pass."""
    weights, settings, head1 = scoring
    chunk = settings.loss_chunk
    heads = trained_heads(model, states)
    # the distinct matrices the heads score with: one per unembedding module and vocabulary (the rows of a reduced
    # draft vocabulary are gathered once, by ordinary autograd, which carries their gradient back to the module's)
    position: dict[tuple[int, bool, bool], int] = {}
    scored, which = [], []
    for k in heads:
        detached = detached_unembedding(model, k, settings.detach_heads)
        key = (id(model.unembedding(k)), model.head_vocab(k) is not None, detached)  # modules: FSDP swaps parameters
        if key not in position:
            position[key] = len(scored)
            weight = model.head_weight(k)
            scored.append(vocab_part(weight.detach() if detached else weight))  # this process's rows, under TP
        which.append(position[key])
    head_targets = torch.stack([model.head_targets(k, targets[k - 1]) for k in heads])
    head_states = [states[k - 1] for k in heads]
    teachers = head_teachers(model, states, heads, settings, chunk)
    terms = [(uses_ce(settings, k), teachers.get(k)) for k in heads]
    shards = [(part.offset, part.group) for part in scored]
    future = None
    if head1 is not None and 1 in heads:
        future = (heads.index(1), model.head_targets(1, head1.targets), head1.weights)
    settings = (head_targets, [weights[k - 1] for k in heads], which, chunk, len(heads), terms, shards, future)
    total, losses, future_losses = _HeadsCrossEntropy.apply(*settings, *head_states, *[p.weight for p in scored])
    future_losses = future_losses if future is not None else None
    return LossOutput(total, _per_head(losses, heads, len(states)), heads, future_losses)


class _HeadsCrossEntropy(torch.autograd.Function):
    """sum_k weight_k * CE(state_k @ W_k^T, targets_k), computing its gradients piece by piece in the forward.

    Inputs after the settings: the n head states (B, T, d) and the distinct unembedding weights (V, d), or this
    process's rows of each (V / tp, d) where ``shards`` gives their (first vocabulary id, tensor-parallel group);
    ``which[k]`` picks head k+1's weight; ``terms[k]`` is (whether its loss has the cross-entropy term, its
    :class:`Teacher` or None), the distillation term adding T^2 KL(teacher || softmax(logits / T)). ``future``: None,
    or (the index of head 1 among the states, its targets after the next (m, B, T), the k = m + 1 weights of its
    terms relative to its own), which adds sum_j w_j CE(logits_1, targets_j) on the same logits. Ops run under
    the caller's autocast, like the autograd graph they replace: the matmuls in the autocast dtype, the softmax in
    fp32; the weight gradients accumulate in the weights' dtype over heads and chunks.
    """

    @staticmethod
    def forward(ctx, targets, weights, which, chunk, n_heads, terms, shards, future, *tensors):
        states, unembeddings = tensors[:n_heads], tensors[n_heads:]
        parts = [VocabPart(weight, *shard) for weight, shard in zip(unembeddings, shards, strict=True)]
        needs_grad = ctx.needs_input_grad[8:]
        total = states[0].new_zeros((), dtype=torch.float32)
        future_losses = states[0].new_zeros((0,), dtype=torch.float32)
        grad_states = [torch.empty_like(s) if needs_grad[k] else None for k, s in enumerate(states)]
        grad_weights = [torch.zeros_like(w) if needs_grad[n_heads + i] else None for i, w in enumerate(unembeddings)]
        losses = []
        for k, state in enumerate(states):
            weight, index = unembeddings[which[k]], which[k]
            part = parts[index]
            ce, teacher = terms[k]  # the cross-entropy term or not; the distillation term's teacher or None
            T = state.size(1)
            step = chunk if chunk > 0 else T
            loss_sum = state.new_zeros((), dtype=torch.float32)
            counted = (targets[k] != IGNORE).sum().clamp(min=1)  # a tensor: no device sync
            relative = future[2][0] if future is not None and future[0] == k else 1.0
            scale = weights[k] * relative / counted
            extra = None  # head 1's targets after the next: (m, B, T), their counts (m,) and gradient scales (m,)
            if future is not None and future[0] == k:
                extra_targets = future[1]
                extra_counted = (extra_targets != IGNORE).sum(dim=(1, 2)).clamp(min=1)
                extra_scale = weights[k] * extra_counted.new_tensor(future[2][1:], dtype=torch.float32) / extra_counted
                extra = (extra_targets.permute(1, 2, 0), extra_counted, extra_scale)  # targets as (B, T, m)
                extra_sums = extra_scale.new_zeros(extra_targets.size(0))
            if teacher is not None:
                distill_sum = state.new_zeros((), dtype=torch.float32)
                distill_counted = teacher.valid.sum().clamp(min=1)
                t = teacher.temperature
                # d(T^2 KL)/d logits = T (softmax(logits / T) - teacher)
                distill_scale = weights[k] * t / distill_counted
            for start in range(0, T, step):
                piece = state[:, start : start + step]  # (B, c, d)
                logits = F.linear(piece, weight)  # (B, c, V), in the autocast dtype if one is active
                compute_dtype = logits.dtype
                logits = logits.float()
                grad_logits = None
                if teacher is not None:
                    span = slice(start, start + step)
                    tokens, probs, entropy = teacher.tokens[:, span], teacher.probs[:, span], teacher.entropy[:, span]
                    scaled = logits / t
                    log_q = scaled.log_softmax(dim=-1) if part.group is None else scaled - logsumexp(scaled, part.group)
                    taught = probs.sum(dim=-1, keepdim=True) > 0  # (B, c, 1): the last k - 1 positions have no teacher
                    cross = -(probs * gather(log_q, tokens, part)).sum(dim=-1, keepdim=True)
                    distill_sum += ((cross - entropy[..., None]) * taught).sum()
                    grad_logits = scatter_add(log_q.exp_(), tokens, -probs, part).mul_(taught * distill_scale)
                    del scaled
                    del log_q
                if ce:
                    piece_targets = targets[k][:, start : start + step, None]  # (B, c, 1)
                    valid = piece_targets != IGNORE  # tokens outside a reduced draft vocabulary count for nothing
                    piece_targets = piece_targets.clamp(min=0)
                    log_norm = logsumexp(logits, part.group)  # (B, c, 1)
                    loss_sum += ((log_norm - target_logits(logits, piece_targets, part)) * valid).sum()
                    if extra is not None:  # the same logits' log-probabilities of tokens t+2..t+k
                        later = extra[0][:, start : start + step]  # (B, c, m)
                        later_valid = later != IGNORE
                        later = later.clamp(min=0)
                        extra_sums += ((log_norm - target_logits(logits, later, part)) * later_valid).sum(dim=(0, 1))
                    # d(scale * CE)/d logits = scale * (softmax - one_hot(target)), built in place of the logits
                    grad_ce = logits.sub_(log_norm).exp_()
                    if extra is None:
                        scatter_add(grad_ce, piece_targets, torch.full_like(log_norm, -1.0), part).mul_(valid * scale)
                    else:  # sum_j scale_j (softmax - one_hot(target_j)) over the next token and the later ones
                        shares = torch.cat([valid * scale, later_valid * extra[2]], dim=-1)  # (B, c, 1 + m)
                        grad_ce.mul_(shares.sum(dim=-1, keepdim=True))
                        scatter_add(grad_ce, torch.cat([piece_targets, later], dim=-1), -shares, part)
                    grad_logits = grad_ce if grad_logits is None else grad_logits.add_(grad_ce)
                    del grad_ce
                grad_logits = grad_logits.to(compute_dtype)
                if grad_states[k] is not None:
                    grad_states[k][:, start : start + step] = grad_logits @ weight
                if grad_weights[index] is not None:
                    grad_weights[index] += torch.einsum("bcv,bcd->vd", grad_logits, piece)
                del logits, grad_logits
            if grad_states[k] is not None:  # each process's part of the vocabulary gave a part of the sum
                all_reduce(grad_states[k], part.group)
            loss = loss_sum / counted if ce else loss_sum
            losses.append(loss + t * t * distill_sum / distill_counted if teacher is not None else loss)
            total = total + weights[k] * relative * losses[-1]
            if extra is not None:
                future_losses = extra_sums / extra[1]
                total = total + (extra_sums * extra[2]).sum()  # sum_j weights[k] w_j CE_j
        per_head = torch.stack(losses)
        # Plain attributes, not saved tensors: backward hands them to autograd and drops its own reference, so
        # AccumulateGrad can adopt them without a copy (a training step runs backward once).
        ctx.stored_grads = [*grad_states, *grad_weights]
        ctx.mark_non_differentiable(per_head, future_losses)
        return total, per_head, future_losses

    @staticmethod
    def backward(ctx, grad_total: Tensor, _grad_per_head: Tensor, _grad_future: Tensor):
        assert hasattr(ctx, "stored_grads"), "the sequential loss supports one backward per forward"
        grads = ctx.stored_grads
        del ctx.stored_grads
        for g in grads:
            if g is not None:
                g.mul_(grad_total.to(g.dtype))  # the loss scale: 1, 1/accumulation, or AMP's scale
        return (None, None, None, None, None, None, None, None, *grads)


def window_states(
    model: MTPModel,
    window: Tensor,
    trunk: Callable[[Tensor], Tensor] | None = None,
    draft_rate: float = 0.0,
    detach_heads: bool = False,
) -> tuple[list[Tensor], Tensor]:
    """Every head's normed state (n x (B, T, d)) over a window's inputs, and the targets (n, B, T).

    Causal heads condition on the tokens before the one they predict, head k at t on token t + k - 1: the true ones,
    or at a ``draft_rate`` fraction of positions the earlier depth's drafts (training's choice,
    :attr:`mtp.training.loss.LossConfig.draft_rate`). ``trunk(inputs)``: the trunk's output from elsewhere
    (:class:`mtp.training.trunk_cache.TrunkCache`); default: the model's. ``detach_heads``: heads 2..n's states
    through no gradient to what head 1 also reads (:attr:`LossConfig.detach_heads`).
    """
    inputs, targets = split_window(window, model.config.n_future)
    trunk_output = trunk(inputs) if trunk else None
    return model.head_states(inputs, targets[:-1], trunk_output, draft_rate, detach_heads), targets


def mtp_loss(
    model: MTPModel,
    window: Tensor,
    settings: LossConfig | None = None,
    trunk: Callable[[Tensor], Tensor] | None = None,
    weights: list[float] | None = None,
    answers: tuple[int, int] | None = None,
    head1_weights: list[float] | None = None,
) -> LossOutput:
    """Training loss of a token window (B, seq_len + n_future) under ``settings`` (default: :class:`LossConfig`'s
    defaults; outside autograd always the naive form); the trunk's output from ``trunk(inputs)`` if given (see
    :func:`window_states`); the head weights ``weights`` (default: the settings' ``loss_weights``; training passes
    its schedule's, :meth:`mtp.training.loss.LossConfig.weights_at`); with ``answers`` (the token ids of
    ``settings.answers_after`` and of end-of-text), only answers' tokens are scored (:func:`answer_targets`). Under
    ``settings.head1_targets`` head 1 is also scored against the tokens after the next, weighted ``head1_weights``
    (default: the run's start, :meth:`LossConfig.head1_weights_at`)."""
    settings = settings or LossConfig()
    states, targets = window_states(model, window, trunk, settings.draft_rate, settings.detach_heads)
    if answers is not None:
        targets = answer_targets(window, targets, *answers)
    weights = settings.weights(model.config.n_future) if weights is None else weights
    head1 = None
    if settings.head1_targets is not None:
        head1_weights = settings.head1_weights_at(0.0) if head1_weights is None else head1_weights
        head1 = Head1Targets.of_window(window, targets.size(2), head1_weights)
    if settings.mode == "naive" or not torch.is_grad_enabled():
        return naive_loss(model, states, targets, Scoring(weights, settings, head1))
    return sequential_loss(model, states, targets, Scoring(weights, settings, head1))
