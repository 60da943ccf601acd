"""ModelConfig: every size and switch of an MTP model, validated on construction."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from mtp.errors import UserError

HEAD_TYPES = ("transformer", "linear", "causal", "medusa")
"""What heads 2..n can be (the modules: :mod:`mtp.heads`)."""
LOSS_MODES = ("sequential", "naive")


def head_blocks(head_type: str, n_future: int, share_depth: bool) -> int:
    """Transformer blocks heads 2..n add (counted in ``n_layers``): one per head for transformer and causal heads
    (one in all for a shared depth), none for linear and medusa heads."""
    if head_type not in ("transformer", "causal") or n_future == 1:
        return 0
    return 1 if share_depth else n_future - 1


def swiglu_width(d_model: int, multiple_of: int) -> int:
    """SwiGLU's hidden width: 8/3 of the model width rounded up to a multiple (Llama's rule)."""
    return multiple_of * -(-int(8 * d_model / 3) // multiple_of)


@dataclass
class ModelConfig:
    vocab_size: int = 8192
    """Rows of the embedding and the unembedding; must be >= the tokenizer's vocabulary."""
    d_model: int = 256
    """Width of the residual stream."""
    n_layers: int = 10
    """Total transformer blocks, head blocks included, so mtpN and mtp1 have equal parameter counts."""
    n_heads: int = 8
    """Attention (query) heads per block."""
    n_kv_heads: int = 4
    """Key/value heads per block (grouped-query attention); must divide n_heads."""
    ffn_multiple_of: int = 64
    """SwiGLU hidden width is 8/3 * d_model rounded up to this multiple."""
    n_future: int = 4
    """Output heads; head k predicts the token k steps ahead (k = 1..n_future)."""
    head_type: str = "transformer"
    """What heads 2..n are (:data:`HEAD_TYPES`; their modules: mtp.heads): 'transformer' (a block each, in parallel
    on the trunk), 'linear' (an unembedding each), 'causal' (DeepSeek-V3 modules, each on the previous depth),
    'medusa' (residual MLPs)."""
    share_depth: bool = False
    """Causal heads only: one module applied at every depth (decoding may then draft beyond n_future)."""
    medusa_layers: int = 1
    """Medusa heads only: residual blocks per head."""
    draft_vocab: int = 0
    """If > 0, heads 2..n score only this many tokens, the training data's most frequent (a reduced draft vocabulary:
    FR-Spec, EAGLE-3's d2t); head 1 keeps the whole vocabulary, so greedy decoding stays exact and sampling lossless
    (a draft's proposal has no mass outside the subset). 0: every head scores every token."""
    max_seq_len: int = 4096
    """Longest position the rotary tables cover."""
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02
    loss: str = "sequential"
    """'sequential' (per-head backward, O(V+d) peak memory) or 'naive' (all heads' logits alive)."""
    loss_weights: list[float] | None = None
    """Per-head loss weights (length n_future); None means 1.0 for every head."""
    loss_chunk: int = 0
    """If > 0, sequential mode computes each head's unembedding + loss in chunks of this many positions."""
    ffn_hidden: int = field(init=False)
    """Derived: SwiGLU hidden width."""

    def __post_init__(self) -> None:
        self.validate()
        self.ffn_hidden = swiglu_width(self.d_model, self.ffn_multiple_of)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        """Build from a plain mapping (a Hydra node); unknown keys are a user error."""
        known = {f.name for f in fields(cls) if f.init}
        unknown = sorted(set(values) - known)
        if unknown:
            raise UserError(
                f"unknown model setting(s) {', '.join(unknown)}; valid settings are {', '.join(sorted(known))}."
            )
        return cls(**{k: (list(v) if k == "loss_weights" and v is not None else v) for k, v in values.items()})

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values.pop("ffn_hidden")
        return values

    @property
    def head1_block(self) -> bool:
        """Whether head 1 has a block of its own, the last of ``layers`` (transformer and causal heads); else every
        block of ``layers`` is trunk and head 1 is the unembedding of the trunk output."""
        return self.head_type in ("transformer", "causal")

    @property
    def head_blocks(self) -> int:
        """Transformer blocks of heads 2..n (:func:`head_blocks`)."""
        return head_blocks(self.head_type, self.n_future, self.share_depth)

    @property
    def n_layer_blocks(self) -> int:
        """Blocks in ``layers``: the trunk, and head 1's block where it has one (``n_layers`` counts every block)."""
        return self.n_layers - self.head_blocks

    @property
    def weights(self) -> list[float]:
        return list(self.loss_weights) if self.loss_weights is not None else [1.0] * self.n_future

    def validate(self) -> None:
        def positive(name: str) -> None:
            if getattr(self, name) < 1:
                raise UserError(f"model.{name}={getattr(self, name)} must be at least 1.")

        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "max_seq_len", "ffn_multiple_of"):
            positive(name)
        if self.n_future < 1:
            raise UserError(f"model.n_future={self.n_future} must be at least 1 (1 is plain next-token prediction).")
        if self.head_type not in HEAD_TYPES:
            raise UserError(f"model.head_type={self.head_type!r} is not one of {', '.join(HEAD_TYPES)}.")
        if self.share_depth and self.head_type != "causal":  # only causal depths form a chain to share
            raise UserError(
                f"model.share_depth=true applies to causal heads only, not head_type={self.head_type!r}; "
                "set model.head_type=causal or drop model.share_depth."
            )
        if self.medusa_layers < 1:
            raise UserError(f"model.medusa_layers={self.medusa_layers} must be at least 1.")
        if not 0 <= self.draft_vocab <= self.vocab_size:
            raise UserError(
                f"model.draft_vocab={self.draft_vocab} must lie between 0 (off) and model.vocab_size={self.vocab_size}."
            )
        if self.draft_vocab and self.n_future == 1:
            raise UserError(
                f"model.draft_vocab={self.draft_vocab} sizes the draft heads' vocabulary, and model.n_future=1 has "
                "none; set model.n_future > 1 or model.draft_vocab=0."
            )
        if self.loss not in LOSS_MODES:
            raise UserError(f"model.loss={self.loss!r} is not one of {', '.join(LOSS_MODES)}.")
        if self.head1_block and self.n_layer_blocks < 2:
            needed = self.head_blocks + 2
            raise UserError(
                f"model.n_future={self.n_future} leaves no trunk layer out of model.n_layers={self.n_layers}; "
                f"use n_layers >= {needed} or fewer heads."
            )
        if self.d_model % self.n_heads:
            raise UserError(f"model.d_model={self.d_model} must be divisible by model.n_heads={self.n_heads}.")
        if (self.d_model // self.n_heads) % 2:
            raise UserError(f"head dimension d_model/n_heads={self.d_model // self.n_heads} must be even for rotary.")
        if self.n_heads % self.n_kv_heads:
            raise UserError(f"model.n_kv_heads={self.n_kv_heads} must divide model.n_heads={self.n_heads}.")
        if self.loss_weights is not None:
            if len(self.loss_weights) != self.n_future:
                raise UserError(
                    f"model.loss_weights has {len(self.loss_weights)} entries but n_future={self.n_future}; "
                    "give one weight per head."
                )
            if any(w < 0 for w in self.loss_weights) or sum(self.loss_weights) <= 0:
                raise UserError("model.loss_weights must be non-negative with a positive sum.")
        if self.loss_chunk < 0:
            raise UserError(f"model.loss_chunk={self.loss_chunk} must be 0 (off) or a positive number of positions.")
