"""Optimizer pieces in plain PyTorch: settings, AdamW parameter groups and the warmup + cosine schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import nn

from mtp.errors import UserError


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Learning-rate multiplier: linear warmup to 1, then cosine down to min_lr_ratio at total_steps."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices (projections, embeddings, unembeddings), none on norms and biases."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


@dataclass
class OptimConfig:
    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    eps: float = 1e-8
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    """Cosine decays the learning rate to lr * min_lr_ratio at the last step."""
    fused: bool | str = "auto"
    """AdamW's fused kernel: true, false, or auto (on CUDA, unless fp16 loss scaling and gradient clipping are both on:
    a fused step unscales fp16 gradients itself, after clipping would have read them)."""

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)
        if self.lr <= 0:
            raise UserError(f"optim.lr={self.lr} must be positive.")
        if self.warmup_steps < 0:
            raise UserError(f"optim.warmup_steps={self.warmup_steps} must be 0 or more.")
        if not 0 <= self.min_lr_ratio <= 1:
            raise UserError(f"optim.min_lr_ratio={self.min_lr_ratio} must lie in [0, 1].")
        if self.fused not in (True, False, "auto"):
            raise UserError(f"optim.fused={self.fused!r} must be true, false or auto.")

    def use_fused(self, cuda: bool, loss_scaling: bool, clipping: bool) -> bool:
        """Whether AdamW runs its fused kernel; refuses fused with fp16 loss scaling and gradient clipping."""
        if self.fused == "auto":
            return cuda and not (loss_scaling and clipping)
        if self.fused and loss_scaling and clipping:
            raise UserError(
                "optim.fused=true cannot clip fp16 gradients (its step unscales them after clipping would read them); "
                "set optim.fused=auto, trainer.precision=bf16-mixed or trainer.gradient_clip_val=0."
            )
        return bool(self.fused)
