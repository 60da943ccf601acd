"""Online updates of the draft heads while decoding a stream of prompts (Online Speculative Decoding, Liu et al. 2023).

After each prompt is decoded, the positions where a draft head disagrees with the token decoding emitted there (where
its draft is rejected whenever verified: head k at position t drafts token t + k) are kept with the sequence; every
``online`` prompts the heads take ``online_steps`` AdamW steps on those positions, learning head 1's distribution
there (its top ``online_top_k`` tokens: the distillation target of ``loss.head_loss=distill``,
:class:`mtp.training.loss.Teacher`). Only heads 2..n train: the trunk, head 1's block, the shared norm and head 1's
unembedding (shared with the draft heads by transformer and causal heads) stay as they are, so the decoded output is
exactly what head 1 decodes before and after any update (greedy: autoregressive decoding's tokens; sampling: its
distribution).

    online = OnlineHeads(model, OnlineSettings(online=8))
    for prompt in prompts:
        output, stats = generate(model, [prompt], Plan(config, HeadsSettings(heads=4)))
        online.observe(prompt, output[0])  # may update the heads
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch
from torch import Tensor

from mtp.errors import SettingError
from mtp.model import MTPModel
from mtp.training.loss import Teacher, distill_loss


@dataclass(frozen=True)
class OnlineSettings:
    online: int = 8
    """Update the draft heads after every this many prompts decoded."""
    online_steps: int = 4
    """AdamW steps per update, each over every kept sequence."""
    online_lr: float = 3e-4
    """The updates' learning rate."""
    online_top_k: int = 10
    """Head 1's most probable tokens its distribution is cut to, the heads' target."""
    online_keep: int = 32
    """The latest sequences kept to learn from (older ones are dropped)."""

    def __post_init__(self) -> None:
        for name in ("online", "online_steps", "online_top_k", "online_keep"):
            if getattr(self, name) < 1:
                raise SettingError(f"{{{name}}} must be at least 1.", **{name: getattr(self, name)})
        if not self.online_lr > 0:
            raise SettingError("{online_lr} must be positive (3e-4 is the default).", online_lr=self.online_lr)


@dataclass
class Observed:
    """A decoded sequence and where its drafts were rejected."""

    tokens: Tensor
    """(L,) prompt and completion."""
    rejected: Tensor
    """(n - 1, L) bool: rejected[k-2, t] when head k's draft at t differs from token t + k (the completion's)."""
    trunk: Tensor
    """(1, L, d) the trunk's output (frozen: kept, so that an update runs only head 1's block and the heads)."""


class OnlineHeads:
    """The draft heads of ``model`` updated from the prompts it decodes (see the module's docstring)."""

    def __init__(self, model: MTPModel, settings: OnlineSettings) -> None:
        if model.config.n_future < 2:
            raise SettingError("{online:name} updates draft heads, and this model has only head 1.", online=0)
        self.model, self.settings = model, settings
        self.parameters = draft_head_parameters(model)
        for p in self.parameters:  # a checkpoint loaded for decoding holds its weights without gradients
            p.requires_grad_(True)
        self.optimizer = torch.optim.AdamW(self.parameters, lr=settings.online_lr, weight_decay=0.0)
        self.kept: deque[Observed] = deque(maxlen=settings.online_keep)
        self.seen = self.updates = 0

    def observe(self, prompt: list[int], completion: list[int]) -> bool:
        """Keep where the heads' drafts on ``completion`` (decoded after ``prompt``) were rejected; every ``online``
        prompts, update the heads. Returns whether they were updated."""
        self.seen += 1
        if completion:
            self.kept.append(self.rejections(prompt, completion))
        if self.seen % self.settings.online != 0 or not self.kept:
            return False
        self.update()
        return True

    @torch.no_grad()
    def rejections(self, prompt: list[int], completion: list[int]) -> Observed:
        """Where each head's argmax at a position differs from the token decoding emitted k positions later, over
        the positions whose drafted token lies in the completion."""
        model, n = self.model, self.model.config.n_future
        device = next(model.parameters()).device
        tokens = torch.tensor(prompt + completion, device=device)
        inputs, following = self.window(tokens)
        trunk = model.trunk_features(inputs[None])
        states = model.head_states(inputs[None], following[:, None], trunk)
        L = tokens.numel()
        rejected = torch.zeros(n - 1, L, dtype=torch.bool, device=device)
        first = len(prompt)  # the first emitted token's position
        for k in range(2, n + 1):
            drafts = model.head_tokens(k, model.head_logits(k, states[k - 1][0]).argmax(-1))  # (L,): for t + k
            t = torch.arange(max(0, first - k), L - k, device=device)  # drafted token t + k in the completion
            rejected[k - 2, t] = drafts[t] != tokens[t + k]
        return Observed(tokens, rejected, trunk)

    def window(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """The inputs (L,) and, for causal heads, the tokens each depth reads (n - 1, L): token t + j, 0 past the end
        (read only at positions with nothing to learn)."""
        n, L = self.model.config.n_future, tokens.numel()
        following = torch.zeros(n - 1, L, dtype=tokens.dtype, device=tokens.device)
        for j in range(1, n):
            following[j - 1, : max(0, L - j)] = tokens[j:]
        return tokens, following

    def update(self) -> None:
        """``online_steps`` AdamW steps on the kept rejections, the heads' parameters alone."""
        model, s = self.model, self.settings
        for _ in range(s.online_steps):
            self.optimizer.zero_grad(set_to_none=True)
            for observed in self.kept:
                if not observed.rejected.any():  # every draft passed: nothing to learn from this one
                    continue
                loss = self.loss(observed) / len(self.kept)
                grads = torch.autograd.grad(loss, self.parameters, allow_unused=True)
                for p, g in zip(self.parameters, grads, strict=True):
                    if g is not None:
                        p.grad = g if p.grad is None else p.grad + g
            self.optimizer.step()
        model.weights_changed()  # decoding packs the updated heads afresh
        self.updates += 1
        model.zero_grad(set_to_none=True)

    def loss(self, observed: Observed) -> Tensor:
        """Head 1's distribution learnt by each head k at the positions where its draft was rejected."""
        model, n = self.model, self.model.config.n_future
        inputs, following = self.window(observed.tokens)
        with torch.enable_grad():
            states = model.head_states(inputs[None], following[:, None], observed.trunk)
            teacher = Teacher.of_head1(model, states[0].detach(), self.settings.online_top_k, 1.0)
            total = states[0].new_zeros((), dtype=torch.float32)
            for k in range(2, n + 1):
                moved = teacher.for_head(k)
                where = observed.rejected[k - 2][None]  # (1, L)
                kept = Teacher(moved.tokens, moved.probs * where[..., None], moved.entropy * where, 1.0)
                if where.any():
                    total = total + distill_loss(model.head_logits(k, states[k - 1]), kept)
        return total


def draft_head_parameters(model: MTPModel) -> list[torch.nn.Parameter]:
    """The parameters of heads 2..n alone: what heads hold but head 1's unembedding (shared by transformer and causal
    heads), so that updating them leaves head 1's output as it was."""
    head1 = model.unembedding(1).weight
    return [p for p in model.heads.parameters() if p is not head1]
