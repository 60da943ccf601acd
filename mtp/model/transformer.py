"""The MTP transformer in pure PyTorch: embeddings -> shared trunk -> n heads -> shared norm -> unembedding.

Layout, after the released multi-token checkpoints of Gloeckle et al. (2024):

- ``layers``: the trunk, then head 1's block where the head type has one (transformer, causal heads);
- ``heads``: heads 2..n and every head's unembedding, one module of the head type (:mod:`mtp.model.heads`);
- ``norm``: one final RMSNorm shared by every head.

The blocks are :mod:`mtp.model.blocks`'. Checkpoints of the layout before the heads were a module load as they are
(:func:`mtp.model.heads.current_names`, applied to every state dict the model loads).
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mtp.model.blocks import Block, RMSNorm, rms_norm, rotary_tables
from mtp.model.config import ModelConfig
from mtp.model.heads import HEADS, HeadInputs, Heads, current_names

IGNORE = -100
"""A target no loss counts: a token outside a draft head's reduced vocabulary (PyTorch's ignore_index)."""


class MTPModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layer_blocks))
        self.heads: Heads = HEADS[config.head_type](config)
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.register_buffer("rope_cos", None, persistent=False)
        self.register_buffer("rope_sin", None, persistent=False)
        self.set_rotary_tables()
        if config.draft_vocab:  # the ids heads 2..n score; saved with the weights (training sets them from its data)
            self.register_buffer("draft_tokens", torch.arange(config.draft_vocab))
        self.reset_parameters()
        self.register_load_state_dict_pre_hook(_current_names)
        self.register_load_state_dict_post_hook(_weights_loaded)
        self.weights_version = 0
        """Bumped whenever the weights change (:meth:`weights_changed`): what decoding's packed forms of them are
        built from (:meth:`mtp.decode.inference.InferenceModel.of`)."""

    def weights_changed(self) -> None:
        """Say that the weights (or buffers) were written, so that decoding rebuilds what it derived from them: whoever
        writes them in place calls this (the training module after each optimizer step, the online updates after
        theirs, a test that edits them); ``load_state_dict`` calls it itself."""
        self.weights_version += 1

    @classmethod
    def with_weights(cls, config: ModelConfig, weights: dict[str, Tensor]) -> MTPModel:
        """A model holding ``weights`` (a full state dict, tensors adopted where they are), built without first
        initialising the weights they replace: that costs seconds for a model of a hundred million parameters."""
        with torch.device("meta"):
            model = cls(config)
        model.load_state_dict(weights, assign=True)
        model.set_rotary_tables(next(iter(weights.values())).device)
        return model

    def set_rotary_tables(self, device: torch.device | str | None = None) -> None:
        """The rotary cos and sin tables (computed, not saved), in fp32 on ``device`` (default: the current one)."""
        cos, sin = rotary_tables(
            self.config.d_model // self.config.n_heads, self.config.max_seq_len, self.config.rope_theta
        )
        self.rope_cos, self.rope_sin = cos.to(device), sin.to(device)

    def reset_parameters(self) -> None:
        std = self.config.init_std
        # Scaled init of the projections that write into the residual stream (GPT-2), by total depth.
        residual_std = std / math.sqrt(2 * self.config.n_layers)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(("wo.weight", "w2.weight")):
                nn.init.normal_(p, 0.0, residual_std)
            else:
                nn.init.normal_(p, 0.0, std)
        self.heads.reset_parameters()

    @property
    def n_future(self) -> int:
        return self.config.n_future

    def rotary(self, seq_len: int) -> tuple[Tensor, Tensor]:
        return self.rope_cos[:seq_len], self.rope_sin[:seq_len]

    def trunk(self, idx: Tensor) -> Tensor:
        """Shared trunk output z, (B, T, d_model), for token ids (B, T)."""
        return self.trunk_features(idx)[..., -self.config.d_model :]

    def trunk_features(self, idx: Tensor) -> Tensor:
        """What the heads read of the trunk for token ids (B, T): the inputs of the layers
        :attr:`~mtp.model.config.ModelConfig.feature_layers` names (EAGLE-3's three), then the trunk output z,
        concatenated: (B, T, (F + 1) d_model); z alone, (B, T, d_model), for head types that read no layer."""
        if idx.size(1) > self.config.max_seq_len:
            raise ValueError(f"sequence of {idx.size(1)} tokens exceeds max_seq_len={self.config.max_seq_len}")
        cos, sin = self.rotary(idx.size(1))
        x = self.tok_embeddings(idx)
        inputs = {}
        for i, block in enumerate(self.trunk_blocks):
            inputs[i] = x
            x = block(x, cos, sin)
        layers = self.config.feature_layers
        return torch.cat([inputs[i] for i in layers] + [x], dim=-1) if layers else x

    @property
    def trunk_blocks(self) -> nn.ModuleList:
        return self.layers[:-1] if self.config.head1_block else self.layers

    def head_block(self, k: int) -> Block | None:
        """The block of head k (1-based) for head types whose heads are blocks on the trunk; None for k=1 of
        linear and medusa heads (head 1 is the unembedding of the trunk output)."""
        if k == 1:
            return self.layers[-1] if self.config.head1_block else None
        return self.heads.block(k)

    def unembedding(self, k: int) -> nn.Linear:
        """Head k's unembedding module, over the whole vocabulary (see :meth:`head_weight` for what head k scores)."""
        return self.heads.unembedding(k)

    def head_vocab(self, k: int) -> Tensor | None:
        """The token ids head k scores (K,), in the order of its logits; None: the whole vocabulary, in id order."""
        return self.draft_tokens if k > 1 and self.config.draft_vocab else None

    def head_weight(self, k: int) -> Tensor:
        """The rows of head k's unembedding it scores: (V, d), or (K, d) for a draft head of a reduced vocabulary."""
        weight = self.unembedding(k).weight
        vocab = self.head_vocab(k)
        return weight if vocab is None else weight[vocab]

    def head_logits(self, k: int, state: Tensor) -> Tensor:
        """Head k's logits (..., V or K) of its normed state (..., d): over the tokens of :meth:`head_vocab`."""
        return F.linear(state, self.head_weight(k))

    def head_targets(self, k: int, targets: Tensor) -> Tensor:
        """Token ids as indices into head k's logits; a token head k does not score becomes ``IGNORE``."""
        vocab = self.head_vocab(k)
        if vocab is None:
            return targets
        index = torch.full((self.config.vocab_size,), IGNORE, dtype=torch.long, device=targets.device)
        index[vocab] = torch.arange(vocab.numel(), device=targets.device)
        return index[targets]

    def head_tokens(self, k: int, indices: Tensor) -> Tensor:
        """Indices into head k's logits (e.g. its argmax) as token ids."""
        vocab = self.head_vocab(k)
        return indices if vocab is None else vocab[indices]

    def full_vocab(self, k: int, logits: Tensor) -> Tensor:
        """Head k's logits over the whole vocabulary (..., V): -inf for the tokens it does not score."""
        vocab = self.head_vocab(k)
        if vocab is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
        return full.index_copy_(-1, vocab, logits)

    def head_states(
        self,
        idx: Tensor,
        following: Tensor | None = None,
        trunk: Tensor | None = None,
        draft_rate: float = 0.0,
        detach_heads: bool = False,
    ) -> list[Tensor]:
        """What each head's unembedding reads: its hidden state after the shared norm, n_future x (B, T, d_model).

        ``following`` (n_future - 1, B, T), following[j-1][b, t] = token t + j: the tokens causal and EAGLE-3 heads
        condition on (the window's targets in training); other head types ignore it. ``trunk``:
        :meth:`trunk_features`' output for ``idx``, when the caller has it already (a frozen trunk's, kept from an
        earlier epoch). ``draft_rate``: the fraction of positions where causal depth k reads depth k-1's draft instead
        of ``following``'s token (0: the true tokens, evaluation's; 1: drafts everywhere; training passes
        :attr:`~mtp.training.loss_config.LossConfig.draft_rate`). ``detach_heads``: heads 2..n read the trunk's
        states, the embedding and the shared norm through no gradient
        (:attr:`~mtp.training.loss_config.LossConfig.detach_heads`), so that their losses train only their own
        parameters; head 1's state keeps its graph.

        Training and evaluation call the model through this one method (the unembedding comes after, one head
        at a time), so a wrapper that hooks a forward method (FSDP2's ``register_fsdp_forward_method``) needs
        only this and ``forward``.
        """
        features = self.trunk_features(idx) if trunk is None else trunk
        d = self.config.d_model
        z = features[..., -d:]
        head1 = self._head1(z)
        reads = partial(self.drafted_inputs, draft_rate) if draft_rate > 0 else None
        layers = features[..., :-d] if self.config.feature_layers else None
        rope = (self.rope_cos, self.rope_sin)
        if not detach_heads:
            return self.heads.states(
                HeadInputs(z, head1, layers, self.norm, self.tok_embeddings, rope, following, reads)
            )
        norm = partial(rms_norm, weight=self.norm.weight.detach(), eps=self.norm.eps)

        def embed(tokens: Tensor) -> Tensor:  # the lookup's output reads only the weight: no gradient reaches it
            return self.tok_embeddings(tokens).detach()

        layers = layers.detach() if layers is not None else None
        inputs = HeadInputs(z.detach(), head1.detach(), layers, norm, embed, rope, following, reads)
        return [self.norm(head1), *self.heads.states(inputs)[1:]]

    def next_token_logits(self, idx: Tensor) -> Tensor:
        """Head 1's logits alone, (B, T, vocab_size): the model's next-token prediction, which reads no following
        tokens (those condition causal and EAGLE-3 heads 2..n only)."""
        return self.head_logits(1, self.norm(self._head1(self.trunk(idx))))

    def _head1(self, z: Tensor) -> Tensor:
        """Head 1's state before the shared norm, from the trunk's output ``z``: through its own block, if any."""
        return self.layers[-1](z, *self.rotary(z.size(1))) if self.config.head1_block else z

    def drafted_inputs(self, rate: float, k: int, state: Tensor, true: Tensor) -> Tensor:
        """The tokens causal depth k reads in training at a draft ``rate``
        (:attr:`~mtp.training.loss_config.LossConfig.draft_rate`): depth k-1's argmax (what greedy decoding feeds it; no
        gradient flows through the choice) at every position (rate 1: loss.causal_inputs=drafts), or at a ``rate``
        fraction of positions drawn at random and ``true`` (B, T) elsewhere (loss.causal_inputs=mixed). ``state``:
        depth k-1's normed state (B, T, d)."""
        with torch.no_grad():
            drafted = self.head_tokens(k - 1, self.head_logits(k - 1, state).argmax(dim=-1))
        if rate >= 1:
            return drafted
        chosen = torch.rand(true.shape, device=true.device) < rate
        return torch.where(chosen, drafted, true)

    def forward(self, idx: Tensor, following: Tensor | None = None) -> Tensor:
        """Logits of every head, (n_future, B, T, vocab_size); head k at position t predicts token t+k. A draft head of
        a reduced vocabulary has -inf for the tokens it does not score."""
        states = self.head_states(idx, following)
        return torch.stack([self.full_vocab(k, self.head_logits(k, s)) for k, s in enumerate(states, start=1)])

    def blocks(self) -> list[Block]:
        """Every block: ``layers`` (the trunk and head 1), then the blocks of heads 2..n."""
        return [*self.layers, *self.heads.blocks()]


def _current_names(module: nn.Module, state: dict[str, Tensor], prefix: str, *args) -> None:
    """Load-time key adapter (a ``load_state_dict`` pre-hook): a state dict of the earlier layout, renamed in place
    before any submodule reads it, so that every way in (a checkpoint, a resumed run, init_from) reads both layouts."""
    renamed = current_names(state, prefix)
    if renamed.keys() != state.keys():
        state.clear()
        state.update(renamed)


def _weights_loaded(model: MTPModel, incompatible_keys: object) -> None:
    """A ``load_state_dict`` post-hook: the loaded weights are new ones (:meth:`MTPModel.weights_changed`)."""
    model.weights_changed()
