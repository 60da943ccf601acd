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
eagle3         EAGLE-3 (Li et al. 2025): every block is trunk; the inputs of three trunk layers are fused by one
               linear layer ``fc`` (3d -> d), and ONE decoder layer whose attention reads [RMSNorm(Emb(t_{i+1}));
               RMSNorm(state)] drafts head 2 from the fused state, then every later head from its own output state
               (recursively, as many drafts as asked), through its own norm and unembedding. Trained with the
               training-time test: the layer unrolled on its own states, each step attending to the first step's
               keys before it and to its own earlier steps' at its position, as decoding's cache holds them.
=============  =====================================================================================================

The names here are the type names :data:`mtp.model.config.HEAD_TYPES` lists; nothing outside the config and this
module compares them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mtp.model.blocks import Attention, Block, FeedForward, RMSNorm
from mtp.model.config import ModelConfig

Reads = Callable[[int, Tensor, Tensor], Tensor]
"""What a causal depth reads in training: ``reads(k, state, true)`` -> token ids (B, T) (see :class:`HeadInputs`)."""


@dataclass
class HeadInputs:
    """What heads 2..n read over a window of T positions (:meth:`Heads.states`)."""

    trunk: Tensor
    """(B, T, d) the trunk output."""
    head1: Tensor
    """(B, T, d) head 1's hidden state: its block's output, or the trunk output for types without one."""
    features: Tensor | None
    """(B, T, F d) the inputs of the trunk layers the type reads (:attr:`mtp.model.config.ModelConfig.feature_layers`),
    concatenated; None for types that read none."""
    norm: Callable[[Tensor], Tensor]
    """The shared final norm (its module, or the same computation through no gradient to its weight)."""
    embed: Callable[[Tensor], Tensor]
    """The token embedding: token ids (B, T) -> (B, T, d)."""
    rope: tuple[Tensor, Tensor]
    """The model's rotary tables (cos, sin), (max_seq_len, head_dim / 2) each."""
    following: Tensor | None
    """(n - 1, B, T): following[j-1][b, t] is token t + j (heads that read tokens: causal, eagle3)."""
    reads: Reads | None = None
    """``reads(k, state, true)``: the tokens head k reads instead of the true ones ``true`` (B, T), given head k-1's
    normed state (None: the true ones)."""

    def rotary(self, offset: int = 0) -> tuple[Tensor, Tensor]:
        """(cos, sin) of positions offset..offset+T-1."""
        T = self.trunk.size(1)
        return self.rope[0][offset : offset + T], self.rope[1][offset : offset + T]


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
    not_split: ClassVar[str] = ""
    """Why heads of this type cannot be split by tensor parallelism (``trainer=tp``); empty when their blocks split as
    the trunk's do and every other part of theirs stays whole on each process."""

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

    def states(self, x: HeadInputs) -> list[Tensor]:
        """Each head's hidden state after its final norm (what its unembedding reads), n_future x (B, T, d)."""
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

    def states(self, x: HeadInputs) -> list[Tensor]:
        rotary = x.rotary()
        return [x.norm(x.head1)] + [x.norm(self.block(k)(x.trunk, *rotary)) for k in range(2, self.n_future + 1)]


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
        self.zero_first_token = config.causal_first_token == "zero"

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

    def states(self, x: HeadInputs) -> list[Tensor]:
        following, reads, rotary = x.following, x.reads, x.rotary()
        if self.n_future > 1 and following is None:
            raise ValueError("causal heads need the following tokens (n_future - 1, B, T) to condition on")
        hidden, states = x.head1, [x.norm(x.head1)]
        for k in range(2, self.n_future + 1):  # depth k reads depth k-1's hidden state and the embedding of t+k-1
            tokens = following[k - 2] if reads is None else reads(k, states[-1], following[k - 2])
            embedded = x.embed(tokens)  # (B, T, d)
            if self.zero_first_token:  # position 0 reads no token (vLLM's MiMo layer masks it)
                first = torch.arange(embedded.size(1), device=embedded.device)[:, None] == 0  # (T, 1)
                embedded = embedded.masked_fill(first, 0.0)
            hidden = self.block(k)(self.causal_input(k)(embedded, hidden), *rotary)
            states.append(x.norm(hidden))
        return states


class LinearHeads(Heads):
    """linear: every block is trunk; head k is its own unembedding of the trunk output."""

    own_unembeddings = True

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.outputs = unembeddings(config, config.n_future)

    def states(self, x: HeadInputs) -> list[Tensor]:
        return [x.norm(x.trunk)] * self.n_future  # every head reads the trunk output: normalize it once


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

    def states(self, x: HeadInputs) -> list[Tensor]:
        normed = x.norm(x.trunk)
        return [normed] + [head(normed) for head in self.residuals]


class SplitNorm(nn.Module):
    """[RMSNorm(e); RMSNorm(h)]: the token's embedding and the state normed apart, side by side (EAGLE-3's
    input_layernorm and hidden_norm). ``weight`` is both weights as one vector (2d), what a packed q/k/v folds in."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embedding_norm = RMSNorm(config.d_model, config.norm_eps)
        self.state_norm = RMSNorm(config.d_model, config.norm_eps)

    @property
    def weight(self) -> Tensor:
        return torch.cat([self.embedding_norm.weight, self.state_norm.weight])

    def forward(self, embedded: Tensor, state: Tensor) -> Tensor:
        return torch.cat([self.embedding_norm(embedded), self.state_norm(state)], dim=-1)


class Eagle3Layer(nn.Module):
    """EAGLE-3's draft layer: a Llama block whose attention reads [RMSNorm(embedding); RMSNorm(state)] (2d wide) while
    its residual stream is the state: h = state + Attention(...), out = h + SwiGLU(RMSNorm(h)). Named as
    :class:`~mtp.model.blocks.Block` is, so that what packs a block packs it (its ``attention_norm`` is split)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = SplitNorm(config)
        self.attention = Attention(config, input_width=2 * config.d_model)
        self.ffn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(
        self, embedded: Tensor, state: Tensor, cos: Tensor, sin: Tensor, earlier: tuple[Tensor, ...] = ()
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The layer at T positions of one unrolled step: its output state (B, T, d), and its keys and values
        (B, n_kv_heads, T, head_dim) for the steps after. ``embedded``: the embeddings of the tokens read (B, T, d);
        ``state``: the states read (B, T, d); cos/sin: the step's positions' rotary tables (T, head_dim / 2).

        ``earlier`` (keys, values of step 0, then of steps 1..j-1, flat): empty, the first step attends causally to
        its own positions; given, step j at position i attends to step 0's keys at positions <= i and to the keys of
        steps 1..j (its own included) at position i only: what the draft's cache holds when decoding drafts its
        (j+1)-th token from position i (the accepted positions' entries, then its own chain's)."""
        attention = self.attention
        q, k, v = attention.project(self.attention_norm(embedded, state), cos, sin)
        if not earlier:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=attention.grouped)
        else:
            steps = len(earlier) // 2 + 1  # step 0's, the steps' between, this one's
            keys = torch.cat([*earlier[0::2], k], dim=2)  # (B, n_kv_heads, steps T, head_dim)
            values = torch.cat([*earlier[1::2], v], dim=2)
            T = q.size(2)
            causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
            same = torch.eye(T, dtype=torch.bool, device=q.device)
            mask = torch.cat([causal] + [same] * (steps - 1), dim=1)  # (T, steps T)
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=attention.grouped)
        h = state + attention.output(y)
        return h + self.feed_forward(self.ffn_norm(h)), k, v


class Eagle3Heads(Heads):
    """eagle3: one layer on the fused inputs of three trunk layers, then on its own output states; its own norm and
    unembedding (``outputs[1]``, every draft's), head 1's the model's (``outputs[0]``)."""

    conditions_on_tokens = True
    own_unembeddings = True
    not_a_llama = "is EAGLE-3's layer on three trunk layers' states and the token before"
    not_split = "read three trunk layers' inputs and draft over their own vocabulary"

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.outputs = unembeddings(config, 1 if config.n_future == 1 else 2)
        if config.n_future > 1:  # one head (next-token prediction alone) drafts nothing
            self.fc = nn.Linear(len(config.feature_layers) * config.d_model, config.d_model, bias=False)
            self.layer = Eagle3Layer(config)
            self.norm = RMSNorm(config.d_model, config.norm_eps)

    def unembedding(self, k: int) -> nn.Linear:
        return self.outputs[0 if k == 1 else 1]

    def blocks(self) -> list[nn.Module]:
        return [self.layer] if self.n_future > 1 else []

    def states(self, x: HeadInputs) -> list[Tensor]:
        following, reads = x.following, x.reads
        if self.n_future > 1 and (following is None or x.features is None):
            raise ValueError("eagle3 heads need three trunk layers' states and the following tokens (n - 1, B, T)")
        states = [x.norm(x.head1)]
        if self.n_future == 1:
            return states
        state, earlier = self.fc(x.features), ()
        for step in range(self.n_future - 1):  # step j drafts head j + 2 from position i + j, reading token i + j + 1
            k = step + 2
            tokens = following[step] if reads is None or step == 0 else reads(k, states[-1], following[step])
            state, keys, values = self.layer(x.embed(tokens), state, *x.rotary(step), earlier)
            earlier = (*earlier, keys, values)
            states.append(self.norm(state))
        return states


HEADS: dict[str, Callable[[ModelConfig], Heads]] = {
    "transformer": ParallelHeads,
    "linear": LinearHeads,
    "causal": CausalHeads,
    "medusa": MedusaHeads,
    "eagle3": Eagle3Heads,
}
"""The module of each type :data:`mtp.model.config.HEAD_TYPES` names."""

LEGACY_NAMES = {"extra_heads.": "heads.layers.", "extra_inputs.": "heads.inputs.", "medusa_heads.": "heads.residuals."}
LEGACY_NAMES["outputs."] = "heads.outputs."
"""Checkpoints written before the head types were modules kept heads 2..n at the model's top level:
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
