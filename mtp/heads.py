"""The head table: what each head type adds to the shared trunk, in one place.

Every head type answers the same questions (:class:`HeadType`): how many of the ``n_layers`` blocks sit in
``layers`` (the trunk, plus head 1's block where head 1 has one), which modules heads 2..n add, which
unembedding each head reads, and how the heads' hidden states follow from the trunk. The model, the loss, the
metrics and the decoder read this table; nothing else looks at ``head_type``.

=============  =====================================================================================================
transformer    Gloeckle et al.: head k (k >= 2) is its own block on the trunk output, heads in parallel. Head 1 is
               the last block of ``layers``. One shared norm and unembedding.
linear         every block is trunk; head k is its own unembedding of the trunk output ("replicated unembeddings").
causal         DeepSeek-V3's MTP modules: depth k (k >= 2) sees depth k-1's hidden state and the embedding of the
               token before the one it predicts, h_k = Block_k(W_k [RMSNorm(Emb(t_{i+k-1})); RMSNorm(h_{k-1})]);
               depth 1 is head 1's block. ``share_depth``: one module applied at every depth (and beyond n).
medusa         Cai et al.: every block is trunk; head k (k >= 2) is ``medusa_layers`` residual blocks
               x + SiLU(W x) (W zero-initialised) on the normed trunk output, then its own unembedding,
               initialised from head 1's.
=============  =====================================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:
    from mtp.config import ModelConfig
    from mtp.model import MTPModel


class CausalInput(nn.Module):
    """What depth k's block reads: W_k [RMSNorm(Emb(t)); RMSNorm(h_{k-1})], embedding first (DeepSeek-V3's eh_proj)."""

    def __init__(self, config: ModelConfig) -> None:
        from mtp.model import RMSNorm

        super().__init__()
        self.enorm = RMSNorm(config.d_model, config.norm_eps)
        self.hnorm = RMSNorm(config.d_model, config.norm_eps)
        self.eh_proj = nn.Linear(2 * config.d_model, config.d_model, bias=False)

    def forward(self, embedded: Tensor, hidden: Tensor) -> Tensor:
        return self.eh_proj(torch.cat([self.enorm(embedded), self.hnorm(hidden)], dim=-1))


class MedusaHead(nn.Module):
    """Residual blocks x + SiLU(W x), W zero-initialised (so a new head starts as head 1's copy)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Linear(config.d_model, config.d_model, bias=False) for _ in range(config.medusa_layers)
        )

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = x + F.silu(layer(x))
        return x


@dataclass(frozen=True)
class HeadType:
    name: str
    head1_block: bool
    """Whether head 1 has a block of its own (the last of ``layers``); else every block of ``layers`` is trunk."""
    blocks_per_head: bool
    """Whether heads 2..n each have a transformer block (``extra_heads``), counted in ``n_layers``."""
    own_unembeddings: bool
    """One unembedding per head (``outputs[k-1]``) rather than one shared by all."""
    conditions_on_tokens: bool = False
    """Head k's state depends on the tokens before the one it predicts (causal): training feeds the true ones,
    decoding its own drafts."""

    def extra_blocks(self, n_future: int, share_depth: bool) -> int:
        """Blocks of heads 2..n (``extra_heads``)."""
        if not self.blocks_per_head or n_future == 1:
            return 0
        return 1 if share_depth else n_future - 1

    def n_extra_blocks(self, config: ModelConfig) -> int:
        return self.extra_blocks(config.n_future, config.share_depth)

    def n_layer_blocks(self, config: ModelConfig) -> int:
        """Blocks in ``layers``: every block but the heads' own (``n_layers`` counts them all)."""
        return config.n_layers - self.n_extra_blocks(config)

    def build(self, model: MTPModel) -> None:
        """Add the modules of heads 2..n to ``model`` (``extra_heads`` always exists, maybe empty)."""
        from mtp.model import Block

        config = model.config
        model.extra_heads = nn.ModuleList(Block(config) for _ in range(self.n_extra_blocks(config)))
        n_unembeddings = config.n_future if self.own_unembeddings else 1
        model.outputs = nn.ModuleList(
            nn.Linear(config.d_model, config.vocab_size, bias=False) for _ in range(n_unembeddings)
        )
        if self.name == "causal":
            model.extra_inputs = nn.ModuleList(CausalInput(config) for _ in range(self.n_extra_blocks(config)))
        if self.name == "medusa":
            model.medusa_heads = nn.ModuleList(MedusaHead(config) for _ in range(config.n_future - 1))

    def reset_parameters(self, model: MTPModel) -> None:
        """Initialisation the head type prescribes, after the model's generic one."""
        if self.name == "medusa":
            with torch.no_grad():
                for head in model.medusa_heads:
                    for layer in head.layers:
                        layer.weight.zero_()
                for output in model.outputs[1:]:
                    output.weight.copy_(model.outputs[0].weight)

    def unembedding(self, model: MTPModel, k: int) -> nn.Linear:
        return model.outputs[k - 1] if self.own_unembeddings else model.outputs[0]

    def extra_block(self, model: MTPModel, k: int) -> nn.Module:
        """Head k's block (k >= 2); with ``share_depth`` the one shared block, whatever k."""
        return model.extra_heads[0 if model.config.share_depth else k - 2]

    def extra_input(self, model: MTPModel, k: int) -> CausalInput:
        return model.extra_inputs[0 if model.config.share_depth else k - 2]

    def states(self, model: MTPModel, z: Tensor, following: Tensor | None) -> list[Tensor]:
        """Each head's hidden state after the shared norm (what its unembedding reads), from the trunk output z
        (B, T, d); ``following`` (n - 1, B, T): following[j-1][b, t] is token t + j (causal heads only)."""
        n, norm = model.config.n_future, model.norm
        cos, sin = model.rotary(z.size(1))
        if self.name == "linear":  # every head reads the trunk output: normalize it once
            return [norm(z)] * n
        if self.name == "medusa":
            normed = norm(z)
            return [normed] + [head(normed) for head in model.medusa_heads]
        hidden = model.layers[-1](z, cos, sin)  # head 1
        states = [norm(hidden)]
        if self.name == "transformer":
            return states + [norm(self.extra_block(model, k)(z, cos, sin)) for k in range(2, n + 1)]
        if n > 1 and following is None:
            raise ValueError("causal heads need the following tokens (n_future - 1, B, T) to condition on")
        for k in range(2, n + 1):  # causal: depth k reads depth k-1's hidden state and the embedding of token t+k-1
            embedded = model.tok_embeddings(following[k - 2])
            hidden = self.extra_block(model, k)(self.extra_input(model, k)(embedded, hidden), cos, sin)
            states.append(norm(hidden))
        return states


HEAD_TYPES = {
    "transformer": HeadType("transformer", head1_block=True, blocks_per_head=True, own_unembeddings=False),
    "linear": HeadType("linear", head1_block=False, blocks_per_head=False, own_unembeddings=True),
    "causal": HeadType(
        "causal", head1_block=True, blocks_per_head=True, own_unembeddings=False, conditions_on_tokens=True
    ),
    "medusa": HeadType("medusa", head1_block=False, blocks_per_head=False, own_unembeddings=True),
}


def head_type(config: ModelConfig) -> HeadType:
    return HEAD_TYPES[config.head_type]
