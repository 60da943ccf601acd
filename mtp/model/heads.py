"""The head types as modules: what each adds to the shared trunk, one class per type.

A model holds one of these as ``model.heads``. Each owns its parameters (heads 2..n and every head's
unembedding), their initialisation, how the heads' hidden states follow from the trunk (:meth:`Heads.states`)
and what the decoder packs from it (:meth:`Heads.block`, :meth:`Heads.causal_input`, :meth:`Heads.residual_layers`).
Head 1's block, where it has one, is the last of the model's ``layers`` (the layout of Meta's multi-token
checkpoints), so the trunk and head 1 read the same under every type.

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

The names here are the type names :data:`mtp.config.HEAD_TYPES` lists; nothing outside the config and this
module compares them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mtp.config import ModelConfig
from mtp.model.blocks import Block, RMSNorm

Reads = Callable[[int, Tensor, Tensor], Tensor]
"""What a causal depth reads in training: ``reads(k, state, true)`` -> token ids (B, T) (see :meth:`Heads.states`)."""


class Heads(nn.Module):
    """Heads 2..n of one type and every head's unembedding (``outputs``: one shared, or one per head)."""

    conditions_on_tokens: ClassVar[bool] = False
    """Head k's state depends on the tokens before the one it predicts (causal): training feeds the true ones,
    decoding its own drafts."""
    own_unembeddings: ClassVar[bool] = False
    """One unembedding per head (``outputs[k-1]``) rather than one shared by all (``outputs[0]``)."""
    not_a_llama: ClassVar[str] = ""
    """Why head k >= 2's path is not a Llama (the trunk, at most one block, the norm, an unembedding); empty when it
    is one (what Hugging Face export and import can carry as a plain model)."""

    outputs: nn.ModuleList

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_future, self.share_depth = config.n_future, config.share_depth

    def unembedding(self, k: int) -> nn.Linear:
        """Head k's unembedding (1-based), over the whole vocabulary."""
        return self.outputs[k - 1 if self.own_unembeddings else 0]

    def block(self, k: int) -> Block | None:
        """Head k's transformer block (k >= 2), if heads of this type have one."""
        return None

    def blocks(self) -> list[Block]:
        """Every transformer block of heads 2..n, each once (what sharding and checkpointing wrap)."""
        return []

    def causal_input(self, k: int) -> CausalInput:
        raise TypeError(f"{type(self).__name__} read no earlier depth")

    def residual_layers(self, k: int) -> list[nn.Linear]:
        """The residual layers x + SiLU(W x) head k (k >= 2) applies to the normed trunk output (medusa)."""
        return []

    def per_depth_parameters(self) -> int:
        """Parameters heads 2..n multiply by at each depth besides their blocks and unembeddings (training FLOPs)."""
        return 0

    def reset_parameters(self) -> None:
        """Initialisation the head type prescribes, after the model's generic one."""

    def grow(self, head1: Block | None, loaded: set[str]) -> None:
        """Start the parameters not in ``loaded`` (names within this module) from head 1's: blocks from head 1's
        block ``head1``, unembeddings from head 1's (a model grown from one with fewer heads,
        :mod:`mtp.pretrained.init_from`)."""
        names = {id(module): name for name, module in self.named_modules()}
        with torch.no_grad():
            for block in self.blocks():
                if head1 is not None and not any(name.startswith(names[id(block)] + ".") for name in loaded):
                    block.load_state_dict(head1.state_dict())
            for i, output in enumerate(self.outputs):
                if f"outputs.{i}.weight" not in loaded:
                    output.weight.copy_(self.outputs[0].weight)

    def states(
        self, z: Tensor, head1: Tensor, norm: nn.Module, rotary: tuple[Tensor, Tensor], embed: nn.Embedding,
        following: Tensor | None, reads: Reads | None = None,
    ) -> list[Tensor]:  # fmt: skip
        """Each head's hidden state after the shared ``norm`` (what its unembedding reads), n_future x (B, T, d).

        ``z``: the trunk output (B, T, d); ``head1``: head 1's hidden state (its block's output, or ``z`` for types
        without one); ``rotary``: (cos, sin) for T positions; ``embed``: the token embedding; ``following``
        (n - 1, B, T): following[j-1][b, t] is token t + j (causal heads only); ``reads(k, state, true)``: the tokens
        depth k reads instead of the true ones ``true`` (B, T), given depth k-1's normed state (causal heads only;
        None: the true ones)."""
        raise NotImplementedError


def unembeddings(config: ModelConfig, count: int) -> nn.ModuleList:
    """``count`` unembeddings (d -> V). Each type registers its modules in the order of the earlier layout (blocks,
    unembeddings, then the rest), so that an optimizer state saved then resumes now (its order is the parameters')."""
    return nn.ModuleList(nn.Linear(config.d_model, config.vocab_size, bias=False) for _ in range(count))


class ParallelHeads(Heads):
    """transformer: head k (k >= 2) is a block of its own on the trunk output; one unembedding shared by all."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.head_blocks))
        self.outputs = unembeddings(config, 1)

    def block(self, k: int) -> Block:
        return self.layers[k - 2]

    def blocks(self) -> list[Block]:
        return list(self.layers)

    def states(self, z, head1, norm, rotary, embed, following, reads=None) -> list[Tensor]:
        return [norm(head1)] + [norm(self.block(k)(z, *rotary)) for k in range(2, self.n_future + 1)]


class CausalInput(nn.Module):
    """What depth k's block reads: W_k [RMSNorm(Emb(t)); RMSNorm(h_{k-1})], embedding first (DeepSeek-V3's eh_proj)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.enorm = RMSNorm(config.d_model, config.norm_eps)
        self.hnorm = RMSNorm(config.d_model, config.norm_eps)
        self.eh_proj = nn.Linear(2 * config.d_model, config.d_model, bias=False)

    def forward(self, embedded: Tensor, hidden: Tensor) -> Tensor:
        return self.eh_proj(torch.cat([self.enorm(embedded), self.hnorm(hidden)], dim=-1))


class CausalHeads(Heads):
    """causal: DeepSeek-V3's MTP depths, each on the previous depth's hidden state and the token before its target;
    one unembedding shared by all. With ``share_depth`` one depth (input and block) serves every k."""

    conditions_on_tokens = True
    not_a_llama = "reads the previous depth's state and the tokens before"

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.head_blocks))
        self.outputs = unembeddings(config, 1)
        self.inputs = nn.ModuleList(CausalInput(config) for _ in range(config.head_blocks))

    def block(self, k: int) -> Block:
        """Depth k's block (k >= 2); with ``share_depth`` the one shared block, whatever k."""
        return self.layers[0 if self.share_depth else k - 2]

    def blocks(self) -> list[Block]:
        return list(self.layers)

    def causal_input(self, k: int) -> CausalInput:
        return self.inputs[0 if self.share_depth else k - 2]

    def per_depth_parameters(self) -> int:
        per_module = sum(p.numel() for p in self.inputs.parameters())
        return per_module * (self.n_future - 1) if self.share_depth else per_module

    def states(self, z, head1, norm, rotary, embed, following, reads=None) -> list[Tensor]:
        if self.n_future > 1 and following is None:
            raise ValueError("causal heads need the following tokens (n_future - 1, B, T) to condition on")
        hidden, states = head1, [norm(head1)]
        for k in range(2, self.n_future + 1):  # depth k reads depth k-1's hidden state and the embedding of t+k-1
            tokens = following[k - 2] if reads is None else reads(k, states[-1], following[k - 2])
            hidden = self.block(k)(self.causal_input(k)(embed(tokens), hidden), *rotary)
            states.append(norm(hidden))
        return states


class LinearHeads(Heads):
    """linear: every block is trunk; head k is its own unembedding of the trunk output."""

    own_unembeddings = True

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.outputs = unembeddings(config, config.n_future)

    def states(self, z, head1, norm, rotary, embed, following, reads=None) -> list[Tensor]:
        return [norm(z)] * self.n_future  # every head reads the trunk output: normalize it once


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


class MedusaHeads(Heads):
    """medusa: head k (k >= 2) is residual blocks on the normed trunk output, then its own unembedding."""

    own_unembeddings = True
    not_a_llama = "reads residual MLPs"

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.outputs = unembeddings(config, config.n_future)
        self.residuals = nn.ModuleList(MedusaHead(config) for _ in range(config.n_future - 1))

    def residual_layers(self, k: int) -> list[nn.Linear]:
        return list(self.residuals[k - 2].layers)

    def per_depth_parameters(self) -> int:
        return sum(p.numel() for p in self.residuals.parameters())

    def reset_parameters(self) -> None:
        with torch.no_grad():
            for head in self.residuals:
                for layer in head.layers:
                    layer.weight.zero_()
            for output in self.outputs[1:]:
                output.weight.copy_(self.outputs[0].weight)

    def states(self, z, head1, norm, rotary, embed, following, reads=None) -> list[Tensor]:
        normed = norm(z)
        return [normed] + [head(normed) for head in self.residuals]


HEADS: dict[str, Callable[[ModelConfig], Heads]] = {
    "transformer": ParallelHeads,
    "linear": LinearHeads,
    "causal": CausalHeads,
    "medusa": MedusaHeads,
}
"""The module of each type :data:`mtp.config.HEAD_TYPES` names."""

LEGACY_NAMES = {"extra_heads.": "heads.layers.", "extra_inputs.": "heads.inputs.", "medusa_heads.": "heads.residuals."}
LEGACY_NAMES["outputs."] = "heads.outputs."
"""Checkpoints written before the head types were modules (up to 58142ae) kept heads 2..n at the model's top level:
old prefix -> new prefix (:func:`current_names`)."""


def current_names(state: dict[str, Tensor], prefix: str = "") -> dict[str, Tensor]:
    """``state`` (a model state dict, its keys under ``prefix``) with names of the earlier layout renamed to today's;
    others unchanged. The load-time key adapter: :class:`mtp.model.MTPModel` applies it to whatever it loads."""
    renamed = {}
    for name, tensor in state.items():
        for old, new in LEGACY_NAMES.items():
            if name.startswith(prefix + old):
                name = prefix + new + name[len(prefix + old) :]
                break
        renamed[name] = tensor
    return renamed


def legacy_name(name: str) -> str:
    """The earlier layout's name of a parameter (the inverse of :func:`current_names`; others unchanged)."""
    for old, new in LEGACY_NAMES.items():
        if name.startswith(new):
            return old + name[len(new) :]
    return name
