"""How a model trains (:class:`LossConfig`, the Hydra config's ``loss`` group): the loss's implementation, what heads
2..n learn from, what causal depths read, the head weights over the run and the levers on them (curricula, decaying
weights, head 1 scored against the tokens after the next). The losses themselves: :mod:`mtp.training.loss`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from mtp.errors import UserError
from mtp.model.config import ModelConfig, stored_loss_settings
from mtp.model.heads import HEADS

LOSS_MODES = ("sequential", "naive")
HEAD_LOSSES = ("ce", "distill", "ce+distill")
CAUSAL_INPUTS = ("true", "drafts", "mixed")
WEIGHT_SCHEDULES = ("constant", "steps", "linear", "forward", "reverse")
CURRICULA = ("forward", "reverse")
"""The schedules that add or remove heads one at a time in equal parts of training (Aynetdinov & Akbik 2025)."""


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
    lambda 0.3 -> 0.1), 'linear' (from ``loss_weights`` to ``loss_weights_final`` over the run), 'forward' (a
    curriculum: the run in n equal parts, part i training heads 1..i at their ``loss_weights``, the others at 0: next-
    token prediction first, then one head more each part) or 'reverse' (part i training heads 1..n-i+1: every head
    first, then one head fewer each part, next-token prediction alone last)."""
    loss_weights_final: list[float] | None = None
    """The head weights at the end of a 'steps' or 'linear' schedule (one per head)."""
    loss_weights_switch: float = 0.7
    """'steps' schedule: the fraction of training steps after which ``loss_weights_final`` applies."""
    detach_heads: bool = False
    """Heads 2..n's losses train only the heads' own parameters: they read the trunk's states, the embedding, the shared
    norm and a shared unembedding through no gradient, so every parameter a one-head model also has gets exactly
    head 1's gradient (torchtitan's ``detach_heads``): fine-tuning a model's built-in MTP layer beside its trunk without
    the layer's loss moving the trunk."""
    head1_targets: int | None = None
    """MTP without extra heads (modded-nanogpt's record): head 1's logits at position t are also scored against tokens
    t+2..t+k (k = this), the term of token t+j weighted ``head1_target_weights[j-1]`` at the start of the run and
    decaying linearly to 0 at its end (next-token prediction alone). Costs what next-token training costs: the logits
    are computed once. None: off."""
    head1_target_weights: list[float] | None = None
    """The weights of head 1's targets t+1..t+k at the start of the run (``head1_targets`` of them; the first, the next
    token's, never decays); None: 1, 1/2, 1/4, ... ."""
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
        lists = ("loss_weights", "loss_weights_final", "head1_target_weights")
        return cls(**{k: (list(v) if k in lists and v is not None else v) for k, v in values.items()})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def stored(cls, model: dict[str, Any], loss: dict[str, Any] | None = None) -> LossConfig:
        """The loss config a checkpoint stored, of either layout (:func:`mtp.model.config.stored_loss_settings`)."""
        return cls.from_dict(stored_loss_settings(model, loss))

    def weights(self, n_future: int) -> list[float]:
        """The head weights of ``n_future`` heads: ``loss_weights``, or 1.0 for every head."""
        return list(self.loss_weights) if self.loss_weights is not None else [1.0] * n_future

    def weights_at(self, progress: float, n_future: int) -> list[float]:
        """The head weights at a fraction ``progress`` (0..1) of training, under ``loss_weights_schedule``."""
        if self.loss_weights_schedule == "constant":
            return self.weights(n_future)
        if self.loss_weights_schedule in CURRICULA:
            part = min(int(min(max(progress, 0.0), 1.0) * n_future), n_future - 1)  # 0..n-1: n equal parts
            trained = part + 1 if self.loss_weights_schedule == "forward" else n_future - part
            return [w if k < trained else 0.0 for k, w in enumerate(self.weights(n_future))]
        start, final = self.weights(n_future), list(self.loss_weights_final)
        if self.loss_weights_schedule == "steps":
            return final if progress >= self.loss_weights_switch else start
        progress = min(max(progress, 0.0), 1.0)
        return [a + (b - a) * progress for a, b in zip(start, final, strict=True)]

    def head1_weights_at(self, progress: float) -> list[float] | None:
        """The weights of head 1's targets t+1..t+k at a fraction ``progress`` (0..1) of training (``head1_targets``):
        the next token's as given, the others decayed linearly from theirs to 0 over the run; None when off."""
        if self.head1_targets is None:
            return None
        start = self.head1_target_weights or [2.0**-j for j in range(self.head1_targets)]
        left = 1.0 - min(max(progress, 0.0), 1.0)
        return [start[0]] + [w * left for w in start[1:]]

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
        for name in ("loss_weights", "loss_weights_final", "head1_target_weights"):
            weights = getattr(self, name)
            if weights is not None and (any(w < 0 for w in weights) or sum(weights) <= 0):
                raise UserError(f"loss.{name} must be non-negative with a positive sum.")
        if self.head1_targets is not None and self.head1_targets < 2:
            raise UserError(
                f"loss.head1_targets={self.head1_targets} scores head 1 against tokens t+1..t+k and needs k >= 2 "
                "(4: the next four tokens); set null for next-token prediction alone."
            )
        if self.head1_target_weights is not None:
            if self.head1_targets is None:
                raise UserError(
                    "loss.head1_target_weights is read only with loss.head1_targets; set loss.head1_targets to "
                    f"{len(self.head1_target_weights)}, or drop loss.head1_target_weights."
                )
            if len(self.head1_target_weights) != self.head1_targets:
                raise UserError(
                    f"loss.head1_target_weights has {len(self.head1_target_weights)} entries but "
                    f"loss.head1_targets={self.head1_targets}; give one weight per target token (t+1..t+k)."
                )
        if self.head1_targets is not None and self.answers_after is not None:
            raise UserError(
                "loss.head1_targets scores head 1 against the tokens after the next, across answers, and "
                "loss.answers_after scores answers alone; drop one of them."
            )
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
        ends = self.loss_weights_schedule in ("steps", "linear")
        if not ends and self.loss_weights_final is not None:
            raise UserError(
                f"loss.loss_weights_final is read only by the steps and linear schedules, not "
                f"loss.loss_weights_schedule={self.loss_weights_schedule}; set loss.loss_weights_schedule=steps or "
                "linear, or drop loss.loss_weights_final."
            )
        if ends and self.loss_weights_final is None:
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
        if self.loss_weights_schedule in CURRICULA and model.n_future == 1:
            raise UserError(
                f"loss.loss_weights_schedule={self.loss_weights_schedule} adds or removes heads 2..n over training, "
                "and model.n_future=1 has none; train more heads (model=mtp4) or set loss.loss_weights_schedule="
                "constant."
            )
        for name in ("loss_weights", "loss_weights_final"):
            weights = getattr(self, name)
            if weights is not None and len(weights) != model.n_future:
                raise UserError(
                    f"loss.{name} has {len(weights)} entries but model.n_future={model.n_future}; give one weight per "
                    "head."
                )
        if self.detach_heads and model.n_future == 1:
            raise UserError(
                "loss.detach_heads=true keeps heads 2..n's losses out of the trunk, and model.n_future=1 has no such "
                "head; drop loss.detach_heads or set model.n_future > 1."
            )
        if self.causal_inputs != "true" and not HEADS[model.head_type].conditions_on_tokens:
            raise UserError(
                f"loss.causal_inputs={self.causal_inputs} applies to causal and eagle3 heads only (they read the "
                f"tokens before the one they predict), not model.head_type={model.head_type!r}; set "
                "model.head_type=causal or eagle3, or drop loss.causal_inputs."
            )
