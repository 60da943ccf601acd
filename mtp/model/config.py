"""The settings of an MTP model (:class:`ModelConfig`): every size and switch of it, what a checkpoint needs to rebuild
it, validated on construction. How a model trains has its own settings
(:class:`mtp.training.loss_config.LossConfig`, the Hydra config's ``loss`` group); checkpoints written before the two
were apart kept those among the model's, and :func:`stored_model_config` and :func:`stored_loss_settings` read both
layouts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from mtp.errors import UserError

HEAD_TYPES = ("transformer", "linear", "causal", "medusa", "eagle3")
"""What heads 2..n can be (the modules: :mod:`mtp.model.heads`)."""


def head_blocks(head_type: str, n_future: int, share_depth: bool) -> int:
    """Transformer blocks heads 2..n add (counted in ``n_layers``): one per head for transformer and causal heads
    (one in all for a shared depth), EAGLE-3's one draft layer, none for linear and medusa heads."""
    if head_type not in ("transformer", "causal", "eagle3") or n_future == 1:
        return 0
    return 1 if share_depth or head_type == "eagle3" else n_future - 1


CAUSAL_FIRST_TOKENS = ("keep", "zero")
"""What a causal depth reads as the token at position 0 (:attr:`ModelConfig.causal_first_token`)."""

EAGLE3_FEATURES = 3
"""Trunk layers an EAGLE-3 draft reads (low, middle, high): what its ``fc`` (3d -> d) and the engines expect."""


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
    """What heads 2..n are (:data:`HEAD_TYPES`; their modules: mtp.model.heads): 'transformer' (a block each, in
    parallel on the trunk), 'linear' (an unembedding each), 'causal' (DeepSeek-V3 modules, each on the previous depth),
    'medusa' (residual MLPs), 'eagle3' (EAGLE-3: one layer on three trunk layers' states, applied recursively)."""
    share_depth: bool = False
    """Causal heads only: one module applied at every depth (decoding may then draft beyond n_future)."""
    causal_first_token: str = "keep"
    """Causal heads only: what a depth reads as the token at position 0 (:data:`CAUSAL_FIRST_TOKENS`): 'keep' its
    embedding, or 'zero' a zero vector there, as vLLM's MiMo MTP layer does (it masks the token input at position 0),
    so that a model trained with it drafts in vLLM exactly as in mtp (exported in MiMo's layout:
    :mod:`mtp.interop.mimo`)."""
    medusa_layers: int = 1
    """Medusa heads only: residual blocks per head."""
    eagle3_layers: list[int] | None = None
    """EAGLE-3 heads only: the three trunk layers whose inputs the draft fuses (low, middle, high; 0 is the first);
    None: 2, L/2 and L-3 of the L trunk layers, what vLLM gives a Llama's EAGLE-3 draft."""
    draft_vocab: int = 0
    """If > 0, heads 2..n score only this many tokens, the training data's most frequent (a reduced draft vocabulary:
    FR-Spec, EAGLE-3's d2t); head 1 keeps the whole vocabulary, so greedy decoding stays exact and sampling lossless
    (a draft's proposal has no mass outside the subset). 0: every head scores every token."""
    max_seq_len: int = 4096
    """Longest position the rotary tables cover."""
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02
    ffn_hidden: int = field(init=False)
    """Derived: SwiGLU hidden width."""

    def __post_init__(self) -> None:
        if self.eagle3_layers is not None:  # a Hydra list (or a tuple) as plain ints, as a checkpoint stores them
            self.eagle3_layers = [int(layer) for layer in self.eagle3_layers]
        self.validate()
        self.ffn_hidden = swiglu_width(self.d_model, self.ffn_multiple_of)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        """Build from a plain mapping (a Hydra node); unknown keys are a user error (a loss setting given as a model
        setting: one naming where it moved)."""
        known = {f.name for f in fields(cls) if f.init}
        unknown = sorted(set(values) - known)
        moved = [name for name in unknown if name in FORMER_LOSS_SETTINGS]
        if moved:
            raise UserError(
                f"{', '.join(f'model.{name}' for name in moved)} moved to the loss settings; set "
                f"{', '.join(f'loss.{FORMER_LOSS_SETTINGS[name]}' for name in moved)} instead."
            )
        if unknown:
            raise UserError(
                f"unknown model setting(s) {', '.join(unknown)}; valid settings are {', '.join(sorted(known))}."
            )
        return cls(**values)

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
    def recursive(self) -> bool:
        """One module drafts at every depth (a shared causal depth, EAGLE-3's layer), so decoding may draft beyond
        n_future."""
        return self.share_depth or self.head_type == "eagle3"

    @property
    def feature_layers(self) -> list[int]:
        """The trunk layers whose inputs the heads read beside the trunk output (EAGLE-3's three); none for others."""
        if self.head_type != "eagle3" or self.n_future == 1:  # one head: no draft to read them
            return []
        if self.eagle3_layers is not None:
            return list(self.eagle3_layers)
        trunk = self.n_layer_blocks
        return [2, trunk // 2, trunk - 3]

    @property
    def head_blocks(self) -> int:
        """Transformer blocks of heads 2..n (:func:`head_blocks`)."""
        return head_blocks(self.head_type, self.n_future, self.share_depth)

    @property
    def n_layer_blocks(self) -> int:
        """Blocks in ``layers``: the trunk, and head 1's block where it has one (``n_layers`` counts every block)."""
        return self.n_layers - self.head_blocks

    def validate_eagle3(self) -> None:
        """EAGLE-3 heads read three trunk layers that exist; its layer list applies to them alone."""
        if self.eagle3_layers is not None and self.head_type != "eagle3":
            raise UserError(
                f"model.eagle3_layers={self.eagle3_layers} applies to EAGLE-3 heads only, not "
                f"head_type={self.head_type!r}; set model.head_type=eagle3 or drop model.eagle3_layers."
            )
        if self.head_type != "eagle3":
            return
        trunk = self.n_layer_blocks
        if trunk < EAGLE3_FEATURES:
            raise UserError(
                f"model.head_type=eagle3 reads the inputs of {EAGLE3_FEATURES} trunk layers, and model.n_layers="
                f"{self.n_layers} leaves {max(trunk, 0)} beside the draft layer; use n_layers >= {EAGLE3_FEATURES + 1}."
            )
        layers = self.eagle3_layers
        if layers is not None and len(layers) != EAGLE3_FEATURES:
            raise UserError(
                f"model.eagle3_layers={layers} names {len(layers)} layers; EAGLE-3 fuses {EAGLE3_FEATURES} (low, "
                f"middle, high), e.g. [2,{trunk // 2},{trunk - 3}]."
            )
        outside = [layer for layer in layers or [] if not 0 <= layer < trunk]
        if outside:
            raise UserError(
                f"model.eagle3_layers={layers} names layer {outside[0]}, but the trunk's layers are 0..{trunk - 1}; "
                f"use layers in that range, e.g. [2,{trunk // 2},{trunk - 3}]."
            )

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
        if self.causal_first_token not in CAUSAL_FIRST_TOKENS:
            raise UserError(
                f"model.causal_first_token={self.causal_first_token!r} is not one of {', '.join(CAUSAL_FIRST_TOKENS)}."
            )
        if self.causal_first_token != "keep" and self.head_type != "causal":
            raise UserError(
                f"model.causal_first_token={self.causal_first_token} applies to causal heads only, not "
                f"head_type={self.head_type!r}; set model.head_type=causal or drop model.causal_first_token."
            )
        if self.medusa_layers < 1:
            raise UserError(f"model.medusa_layers={self.medusa_layers} must be at least 1.")
        self.validate_eagle3()
        if not 0 <= self.draft_vocab <= self.vocab_size:
            raise UserError(
                f"model.draft_vocab={self.draft_vocab} must lie between 0 (off) and model.vocab_size={self.vocab_size}."
            )
        if self.draft_vocab and self.n_future == 1:
            raise UserError(
                f"model.draft_vocab={self.draft_vocab} sizes the draft heads' vocabulary, and model.n_future=1 has "
                "none; set model.n_future > 1 or model.draft_vocab=0."
            )
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


FORMER_LOSS_SETTINGS = {
    "loss": "mode",
    **{
        name: name
        for name in (
            "loss_weights", "loss_chunk", "head_loss", "distill_top_k", "distill_temperature", "causal_inputs",
            "causal_draft_rate", "loss_weights_schedule", "loss_weights_final", "loss_weights_switch",
        )
    },
}  # fmt: skip
"""The loss settings a model config held before the loss had its own (checkpoints written then keep them there), by
their name now in :class:`mtp.training.loss_config.LossConfig` (``loss`` became ``mode``). A record of that layout,
so it never grows: a loss setting added since was never a model setting."""


def stored_loss_settings(model: dict[str, Any], loss: dict[str, Any] | None = None) -> dict[str, Any]:
    """The loss settings a checkpoint recorded, as a plain mapping under today's names: its ``loss_config`` entry
    (``loss``), or, in a checkpoint written before the loss had its own config, those it kept among its model
    settings (``model``: :data:`FORMER_LOSS_SETTINGS`). The training layer builds its config of them."""
    if loss is not None:
        return dict(loss)
    return {FORMER_LOSS_SETTINGS[name]: value for name, value in model.items() if name in FORMER_LOSS_SETTINGS}


def stored_model_config(model: dict[str, Any]) -> ModelConfig:
    """The model config a checkpoint stored (its ``model_config`` entry), of either layout: the loss settings an
    earlier checkpoint kept there are left out (:func:`stored_loss_settings` reads them)."""
    return ModelConfig.from_dict({name: value for name, value in model.items() if name not in FORMER_LOSS_SETTINGS})
