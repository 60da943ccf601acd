"""The transformer's parts in pure PyTorch, shared by the trunk and the heads: RMSNorm, rotary positions,
grouped-query attention, SwiGLU and the pre-norm block (Llama's layout and names)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mtp.model.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm of x (..., d) in fp32, scaled by ``weight`` (d,): :class:`RMSNorm`'s computation with a weight given."""
    normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return normed.type_as(x) * weight


def rotary_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos and sin tables, each (max_seq_len, head_dim // 2)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs (x[..., :d/2], x[..., d/2:]); x is (B, n_head, T, head_dim), cos/sin broadcast to (B, 1, T, d/2)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.type_as(x)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, input_width: int | None = None) -> None:
        """``input_width``: what q, k and v read (default: the model's width; an EAGLE-3 layer reads twice that)."""
        super().__init__()
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads
        self.head_dim = config.d_model // config.n_heads
        # a bool fixed here: under FSDP2, compile treats a module's int attributes as symbolic, and SDPA refuses the
        # SymBool a comparison of them gives
        self.grouped = config.n_kv_heads != config.n_heads
        width = input_width or config.d_model
        self.wq = nn.Linear(width, config.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(width, config.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(width, config.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * self.head_dim, config.d_model, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """Causal self-attention over x (B, T, d_model)."""
        q, k, v = self.project(x, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.grouped)
        return self.output(y)

    def project(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q (B, n_heads, T, head_dim), k and v (B, n_kv_heads, T, head_dim) of x (B, T, width), q and k rotated."""
        B, T, _ = x.shape
        # heads counted from the projections' width: under tensor parallelism a process holds a share of them
        q = self.wq(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def output(self, y: Tensor) -> Tensor:
        """The attention's output (B, T, d_model) from its heads' (B, n_heads, T, head_dim)."""
        B, _, T, _ = y.shape
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    """SwiGLU."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.d_model, config.ffn_hidden, bias=False)
        self.w3 = nn.Linear(config.d_model, config.ffn_hidden, bias=False)
        self.w2 = nn.Linear(config.ffn_hidden, config.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))
