"""The settings of a model and of its training loss, each validated on construction.

:class:`ModelConfig` is every size and switch of an MTP model (what a checkpoint needs to rebuild it);
:class:`LossConfig` is how the model trains (the Hydra config's ``loss`` group). Checks that need both are
:meth:`LossConfig.check_model`'s. Checkpoints written before the two were apart kept the loss settings among the
model's: :func:`stored_configs` reads both layouts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from mtp.errors import UserError

HEAD_TYPES = ("transformer", "linear", "causal", "medusa", "eagle3")
"""What heads 2..n can be (the modules: :mod:`mtp.model.heads`)."""
LOSS_MODES = ("sequential", "naive")
HEAD_LOSSES = ("ce", "distill", "ce+distill")
CAUSAL_INPUTS = ("true", "drafts", "mixed")
WEIGHT_SCHEDULES = ("constant", "steps", "linear")


def head_blocks(head_type: str, n_future: int, share_depth: bool) -> int:
    """Transformer blocks heads 2..n add (counted in ``n_layers``): one per head for transformer and causal heads
    (one in all for a shared depth), EAGLE-3's one draft layer, none for linear and medusa heads."""
    if head_type not in ("transformer", "causal", "eagle3") or n_future == 1:
        return 0
    return 1 if share_depth or head_type == "eagle3" else n_future - 1


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
        moved = [name for name in unknown if name in MOVED_TO_LOSS]
        if moved:
            raise UserError(
                f"{', '.join(f'model.{name}' for name in moved)} moved to the loss settings; set "
                f"{', '.join(f'loss.{MOVED_TO_LOSS[name]}' for name in moved)} instead."
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


@dataclass
class LossConfig:
    """How a model trains: the loss's implementation, what heads 2..n learn from, what causal depths read and the
    head weights over the run (the Hydra config's ``loss`` group: ``loss.head_loss=distill``)."""

    mode: str = "sequential"
    """'sequential' (per-head backward, O(V+d) peak memory) or 'naive' (all heads' logits alive)."""
    loss_weights: list[float] | None = None
    """Per-head loss weights (one per head: model.n_future of them); None means 1.0 for every head."""
    loss_chunk: int = 0
    """If > 0, sequential mode computes each head's unembedding + loss in chunks of this many positions."""
    head_loss: str = "ce"
    """What heads 2..n learn from (:data:`HEAD_LOSSES`; head 1 always from the corpus token): 'ce' the corpus token
    k steps ahead; 'distill' head 1's distribution for that token (HASS: its top ``distill_top_k`` tokens, at the
    position where head 1 predicts it); 'ce+distill' the sum of both."""
    distill_top_k: int = 10
    """Distillation: how many of head 1's most probable tokens its distribution is cut to (then renormalised)."""
    distill_temperature: float = 1.0
    """Distillation: both distributions at this temperature (the loss scaled by its square, Hinton et al.)."""
    causal_inputs: str = "true"
    """Causal heads only, in training (:data:`CAUSAL_INPUTS`): the token depth k reads before the one it predicts is
    'true' (the corpus's), 'drafts' (depth k-1's argmax there, what decoding feeds it: EAGLE-3's training-time test)
    or 'mixed' (the draft at a ``causal_draft_rate`` fraction of positions drawn at random, elsewhere the true one)."""
    causal_draft_rate: float = 0.5
    """causal_inputs=mixed: the fraction of positions where depth k reads depth k-1's draft."""
    loss_weights_schedule: str = "constant"
    """How the head weights move over training (:data:`WEIGHT_SCHEDULES`): 'constant' (``loss_weights`` throughout),
    'steps' (``loss_weights`` until ``loss_weights_switch`` of the run, then ``loss_weights_final``: DeepSeek-V3's
    lambda 0.3 -> 0.1), 'linear' (from ``loss_weights`` to ``loss_weights_final`` over the run)."""
    loss_weights_final: list[float] | None = None
    """The head weights at the end of a 'steps' or 'linear' schedule (one per head)."""
    loss_weights_switch: float = 0.7
    """'steps' schedule: the fraction of training steps after which ``loss_weights_final`` applies."""
    answers_after: str | None = None
    """Score only each document's answer: the tokens after this text (one token of the tokenizer), up to and with the
    end-of-text that closes the document (``=`` for ``data=polynomial``: ``<problem>=<answer>``); every head's target
    outside an answer counts for nothing. None: every token (pretraining on text)."""

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> LossConfig:
        """Build from a plain mapping (a Hydra node); unknown keys are a user error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise UserError(
                f"unknown loss setting(s) {', '.join(unknown)}; valid settings are {', '.join(sorted(known))}."
            )
        if values.get("causal_inputs") is True:  # loss.causal_inputs=true on Hydra's command line is a boolean
            values = {**values, "causal_inputs": "true"}
        lists = ("loss_weights", "loss_weights_final")
        return cls(**{k: (list(v) if k in lists and v is not None else v) for k, v in values.items()})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def weights(self, n_future: int) -> list[float]:
        """The head weights of ``n_future`` heads: ``loss_weights``, or 1.0 for every head."""
        return list(self.loss_weights) if self.loss_weights is not None else [1.0] * n_future

    def weights_at(self, progress: float, n_future: int) -> list[float]:
        """The head weights at a fraction ``progress`` (0..1) of training, under ``loss_weights_schedule``."""
        if self.loss_weights_schedule == "constant":
            return self.weights(n_future)
        start, final = self.weights(n_future), list(self.loss_weights_final)
        if self.loss_weights_schedule == "steps":
            return final if progress >= self.loss_weights_switch else start
        progress = min(max(progress, 0.0), 1.0)
        return [a + (b - a) * progress for a, b in zip(start, final, strict=True)]

    @property
    def draft_rate(self) -> float:
        """The fraction of positions where causal depth k reads depth k-1's draft in training (``causal_inputs``: 0 for
        'true', 1 for 'drafts', ``causal_draft_rate`` for 'mixed'): :meth:`mtp.model.MTPModel.head_states`' own."""
        return {"true": 0.0, "drafts": 1.0}.get(self.causal_inputs, self.causal_draft_rate)

    def validate(self) -> None:
        for name, value, allowed in (
            ("mode", self.mode, LOSS_MODES),
            ("head_loss", self.head_loss, HEAD_LOSSES),
            ("causal_inputs", self.causal_inputs, CAUSAL_INPUTS),
            ("loss_weights_schedule", self.loss_weights_schedule, WEIGHT_SCHEDULES),
        ):
            if value not in allowed:
                raise UserError(f"loss.{name}={value!r} is not one of {', '.join(allowed)}.")
        for name in ("loss_weights", "loss_weights_final"):
            weights = getattr(self, name)
            if weights is not None and (any(w < 0 for w in weights) or sum(weights) <= 0):
                raise UserError(f"loss.{name} must be non-negative with a positive sum.")
        if self.answers_after == "":
            raise UserError(
                "loss.answers_after is empty; give the text that precedes each answer, or null for every token."
            )
        if self.distill_top_k < 1:
            raise UserError(f"loss.distill_top_k={self.distill_top_k} must be at least 1 (10 is HASS's).")
        if not self.distill_temperature > 0:
            raise UserError(f"loss.distill_temperature={self.distill_temperature} must be positive (1.0: as is).")
        if not 0 <= self.causal_draft_rate <= 1:
            raise UserError(f"loss.causal_draft_rate={self.causal_draft_rate} must lie between 0 and 1.")
        if self.loss_weights_schedule == "constant" and self.loss_weights_final is not None:
            raise UserError(
                "loss.loss_weights_final is read only by a schedule; set loss.loss_weights_schedule=steps or "
                "linear, or drop loss.loss_weights_final."
            )
        if self.loss_weights_schedule != "constant" and self.loss_weights_final is None:
            example = ",".join(["1.0"] + ["0.1"] * (len(self.loss_weights or [1.0] * 4) - 1))
            raise UserError(
                f"loss.loss_weights_schedule={self.loss_weights_schedule} needs the weights to end at: set "
                f"loss.loss_weights_final (one per head, e.g. [{example}])."
            )
        if not 0 < self.loss_weights_switch <= 1:
            raise UserError(f"loss.loss_weights_switch={self.loss_weights_switch} must lie in (0, 1].")
        if self.loss_chunk < 0:
            raise UserError(f"loss.loss_chunk={self.loss_chunk} must be 0 (off) or a positive number of positions.")

    def check_model(self, model: ModelConfig) -> None:
        """The checks that need the model's settings too: one weight per head, drafted inputs for causal heads only."""
        for name in ("loss_weights", "loss_weights_final"):
            weights = getattr(self, name)
            if weights is not None and len(weights) != model.n_future:
                raise UserError(
                    f"loss.{name} has {len(weights)} entries but model.n_future={model.n_future}; give one weight per "
                    "head."
                )
        if self.causal_inputs != "true" and model.head_type not in ("causal", "eagle3"):
            raise UserError(
                f"loss.causal_inputs={self.causal_inputs} applies to causal and eagle3 heads only (they read the "
                f"tokens before the one they predict), not model.head_type={model.head_type!r}; set "
                "model.head_type=causal or eagle3, or drop loss.causal_inputs."
            )


MOVED_TO_LOSS = {"loss": "mode"} | {f.name: f.name for f in fields(LossConfig) if f.name != "mode"}
"""The model settings that moved to :class:`LossConfig`, every one of its settings (``mode`` was ``loss``): checkpoints
written before it kept them in their model config. Read from the dataclass, so that the loss settings are written in
one place (conf/loss/default.yaml repeats them, and tests/test_config.py holds it to the dataclass)."""


def stored_loss_settings(model: dict[str, Any], loss: dict[str, Any] | None = None) -> dict[str, Any]:
    """The loss settings a checkpoint recorded: its ``loss_config`` entry (``loss``), or, in a checkpoint written
    before :class:`LossConfig`, those it kept among its model settings (``model``), each under its new name."""
    if loss is not None:
        return dict(loss)
    return {MOVED_TO_LOSS[name]: value for name, value in model.items() if name in MOVED_TO_LOSS}


def stored_configs(model: dict[str, Any], loss: dict[str, Any] | None = None) -> tuple[ModelConfig, LossConfig]:
    """The model and loss configs a checkpoint stored (its ``model_config`` and ``loss_config`` entries), of either
    layout: the loss settings an earlier checkpoint kept among the model's move to the loss config (the key adapter
    of the settings: :func:`stored_loss_settings`); those it never had keep their defaults."""
    kept = {name: value for name, value in model.items() if name not in MOVED_TO_LOSS}
    return ModelConfig.from_dict(kept), LossConfig.from_dict(stored_loss_settings(model, loss))
