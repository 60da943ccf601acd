"""What a decoding run is asked to do, each part with the settings it owns and checks where it is defined:
:class:`GenerationConfig` (sampling, acceptance and limits: what every method shares), :class:`HeadsSettings` (the
heads' drafting: how many, a tree, their cut and vocabulary), :class:`DraftSettings` (how any proposer that drafts from
a model draws its drafts: their dtype, their choice when sampling, several sequences, adaptive chains) and
:class:`StepSettings` (how a step runs: compiled, captured). A run's plan holds them, beside a drafter
(:class:`mtp.decode.plan.Plan`), and checks what needs two of them.

A setting out of its range, or at odds with another, is a :class:`mtp.errors.SettingError`: one sentence naming the
setting, its value and a fix, which the command lines render under their flags
(:func:`mtp.commands.cli.settings_named_by_flags`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal, get_args

import torch

from mtp.decode.graphs import captures_on
from mtp.decode.quantize import QUANTIZE, Quantize, check_quantizable
from mtp.decode.tree import DraftTree
from mtp.errors import SettingError, Trained
from mtp.model.config import ModelConfig

Acceptance = Literal["exact", "typical", "spectr"]
ACCEPTANCE_RULES: tuple[str, ...] = get_args(Acceptance)
DraftDtype = Literal["auto", "int8"]
DRAFT_DTYPES: tuple[str, ...] = get_args(DraftDtype)
DraftChoice = Literal["auto", "sampled", "tempered", "top"]
DRAFT_CHOICES: tuple[str, ...] = get_args(DraftChoice)
SiblingDraws = Literal["distinct", "independent"]
SIBLING_DRAWS: tuple[str, ...] = get_args(SiblingDraws)


@dataclass
class GenerationConfig:
    """How to sample and accept, whoever drafts. The decoding commands spell each field as a flag, its docstring's first
    sentence the flag's help (:func:`mtp.commands.cli.add_settings`), unless its metadata says ``flag=False``; who
    drafts has its own settings (:class:`HeadsSettings`, a method's)."""

    max_new_tokens: int = 128
    """New tokens per prompt, at most (a row stops early after eos_id)."""
    temperature: float = 0.0
    """Sampling temperature; 0 is greedy."""
    top_k: int = 0
    """Keep only the k most likely tokens (0: all)."""
    top_p: float = 1.0
    """Keep the smallest set of most likely tokens whose probability reaches top_p (1: all)."""
    eos_id: int | None = field(default=None, metadata={"flag": False})
    """Stop a row after this token (it is not included in the output); the commands take it from the tokenizer."""
    seed: int = 0
    """Row b samples from a generator seeded seed + b."""
    acceptance: Acceptance = "exact"
    """exact: greedy-exact / lossless sampling; spectr: lossless, SpecTr's k-sequential selection among the several
    candidates a step drafts; typical: Medusa's typical acceptance (lossy; sampling only)."""
    typical_epsilon: float = 0.09
    """Typical acceptance: a draft passes above min(typical_epsilon, typical_delta * exp(-entropy))."""
    typical_delta: float = 0.3
    """Typical acceptance's entropy factor (see typical_epsilon)."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise SettingError("{max_new_tokens} must be at least 1.", max_new_tokens=self.max_new_tokens)
        if self.temperature < 0:
            raise SettingError("{temperature} must be 0 (greedy) or positive.", temperature=self.temperature)
        if self.top_k < 0:
            raise SettingError("{top_k} must be 0 (off) or positive.", top_k=self.top_k)
        if not 0 < self.top_p <= 1:
            raise SettingError("{top_p} must lie in (0, 1]; 1 turns nucleus sampling off.", top_p=self.top_p)
        if self.acceptance not in ACCEPTANCE_RULES:
            rules = ", ".join(ACCEPTANCE_RULES)
            raise SettingError(f"{{acceptance}} must be one of {rules}.", acceptance=self.acceptance)
        if not 0 <= self.typical_epsilon <= 1:
            raise SettingError("{typical_epsilon} must lie in [0, 1].", typical_epsilon=self.typical_epsilon)
        if self.typical_delta < 0:
            raise SettingError("{typical_delta} must be at least 0.", typical_delta=self.typical_delta)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def typical(self) -> bool:
        """Typical acceptance in force (it only ever applies to sampling)."""
        return self.acceptance == "typical" and not self.greedy


@dataclass
class HeadsSettings:
    """How the target's own heads draft (self-speculative decoding): the settings of the heads' method
    (:class:`mtp.decode.methods.Heads`). The default, one head, drafts nothing: autoregressive decoding."""

    heads: int = 1
    """Heads used: 1 decodes autoregressively, k > 1 drafts k - 1 tokens per step with heads 2..k."""
    tree: DraftTree | None = field(default=None, metadata={"flag": False})
    """Verify this tree of candidates per step instead of one chain of drafts (at most heads - 1 deep). The commands
    read it from a file, or fit it, each by a setting of its own."""
    draft_p_min: float = 0.0
    """Stop drafting deeper than the first draft whose head's top probability is below this (0: off)."""
    draft_first_ids: int = field(default=0, metadata={"renamed_from": "draft_vocab"})
    """Heads 2..k score only the token ids below this (0: all): FR-Spec's frequency-ranked draft vocabulary, as a BPE
    vocabulary lists its tokens (merges in the order they were learned, most frequent first). Only the drafts'
    unembedding shrinks; head 1 verifies over every token, so greedy output is unchanged and sampling stays lossless.
    (A draft vocabulary trained with the heads is the model's own: ``model.draft_vocab``.)"""
    sibling_draws: SiblingDraws = "distinct"
    """A sampled tree of the heads' drafts, exact acceptance: distinct: a node's children are drawn without replacement
    and each is tested against its law without the siblings tried before it (Sequoia's rule); independent: each drawn
    from the full law (SpecInfer's). Both lossless; SpecTr's rule always draws independently."""

    def __post_init__(self) -> None:
        if self.heads < 1:
            raise SettingError("{heads} must be at least 1.", heads=self.heads)
        if not 0 <= self.draft_p_min <= 1:
            raise SettingError("{draft_p_min} must lie in [0, 1]; 0 turns it off.", draft_p_min=self.draft_p_min)
        if self.tree is not None and self.tree.depth > self.heads - 1:
            raise SettingError(
                f"the draft {{tree:name}} is {self.tree.depth} deep but {{heads}} drafts {self.heads - 1}; "
                "use a shallower tree or more heads.",
                tree=self.tree,
                heads=self.heads,
            )
        if self.draft_first_ids < 0:
            raise SettingError(
                "{draft_first_ids} must be 0 (every token) or positive.", draft_first_ids=self.draft_first_ids
            )
        if self.sibling_draws not in SIBLING_DRAWS:
            choices = ", ".join(SIBLING_DRAWS)
            raise SettingError(f"{{sibling_draws}} must be one of {choices}.", sibling_draws=self.sibling_draws)

    def check_for(self, model: ModelConfig) -> None:
        """Whether ``model``'s heads draft as asked: a SettingError for more heads than it has (beyond a shared causal
        depth), or a draft vocabulary of ids beside the one its heads were trained on or beyond its vocabulary."""
        if self.heads > model.n_future and not model.recursive:
            raise SettingError(
                f"{{heads}} exceeds this checkpoint's {model.n_future} head(s); only eagle3 heads and causal heads "
                f"trained with {{share_depth:true}} draft beyond them; use {{heads:1..{model.n_future}}}.",
                heads=self.heads,
                share_depth=Trained(ModelConfig, True),
            )
        if self.draft_first_ids and model.draft_vocab:
            raise SettingError(
                f"this checkpoint's heads were trained to score its {model.draft_vocab} most frequent tokens, and "
                "{draft_first_ids} would choose others; leave {draft_first_ids:0}.",
                draft_first_ids=self.draft_first_ids,
            )
        if self.draft_first_ids >= model.vocab_size:
            raise SettingError(
                f"{{draft_first_ids}} must be below the vocabulary's {model.vocab_size} tokens (0: every token); "
                f"use {{draft_first_ids:{model.vocab_size // 4}}}, say.",
                draft_first_ids=self.draft_first_ids,
            )


@dataclass
class DraftSettings:
    """How a proposer that drafts from a model (the heads, a draft model, layer skip) makes its drafts."""

    adaptive_drafts: bool = False
    """Chains and drafters: a row drafts 2 more after a step that accepted all its drafts, 1 less otherwise."""
    drafts_per_step: int = 1
    """Independent draft sequences per step (SpecTr's k): a tree of k chains, verified together; 1: one chain."""
    draft_dtype: DraftDtype = "auto"
    """int8: the draft side (draft heads, a draft model, layer skip) multiplies int8 weights, on CPU; auto: the model's
    dtype. Head 1 verifies at full precision, so greedy output is unchanged and sampling stays lossless; only
    acceptance may move."""
    draft_choice: DraftChoice = "auto"
    """Sampling with exact acceptance: sampled (drafts drawn from the drafter's distribution processed as the target's,
    top-p included), tempered (drawn after temperature and top-k only: no nucleus to find), top (the top-ranked drafts,
    one-hot proposals); auto: tempered for the heads on CPU, else sampled. All lossless."""

    def __post_init__(self) -> None:
        if self.draft_dtype not in DRAFT_DTYPES:
            dtypes = ", ".join(DRAFT_DTYPES)
            raise SettingError(f"{{draft_dtype}} must be one of {dtypes}.", draft_dtype=self.draft_dtype)
        if self.drafts_per_step < 1:
            raise SettingError("{drafts_per_step} must be at least 1.", drafts_per_step=self.drafts_per_step)
        if self.draft_choice not in DRAFT_CHOICES:
            choices = ", ".join(DRAFT_CHOICES)
            raise SettingError(f"{{draft_choice}} must be one of {choices}.", draft_choice=self.draft_choice)
        if self.drafts_per_step > 1 and self.adaptive_drafts:
            raise SettingError(
                "{drafts_per_step} verifies a tree of independent chains; it does not combine with "
                "{adaptive_drafts:name}.",
                drafts_per_step=self.drafts_per_step,
                adaptive_drafts=self.adaptive_drafts,
            )

    def check_device(self, device: torch.device) -> None:
        """int8 drafts run only on CPU (:mod:`mtp.decode.int8`)."""
        if self.draft_dtype == "int8" and device.type != "cpu":
            raise SettingError(
                f"{{draft_dtype}} drafts with PyTorch's int8 CPU kernels, and the model is on {device.type}; "
                "decode on CPU, or leave {draft_dtype:auto}.",
                draft_dtype=self.draft_dtype,
            )


@dataclass
class StepSettings:
    """How a decoding step runs: compiled or captured (outputs equal the eager step's either way), and the precision
    of the weights it multiplies."""

    compile: bool = False
    """torch.compile the step (the first call compiles; outputs equal eager ones)."""
    cuda_graphs: bool = False
    """Capture each step shape as a CUDA graph and replay it: one launch a step instead of one per kernel (CUDA; the
    first step of each shape captures, timed apart; outputs equal eager ones)."""
    quantize: Quantize = "none"
    """int8 or int4: every matrix of the model, its heads and a draft model quantized weight-only (CPU; float32 or
    bfloat16 models; int4 needs widths that are multiples of 32), verifying and drafting with the same weights; greedy
    output equals that precision's own autoregressive output, which may differ from the float model's. none: the
    model's own weights."""

    def __post_init__(self) -> None:
        if self.quantize not in QUANTIZE:
            raise SettingError(f"{{quantize}} must be one of {', '.join(QUANTIZE)}.", quantize=self.quantize)

    def check_model(self, config: ModelConfig, device: torch.device, dtype: torch.dtype) -> None:
        """Whether ``quantize`` runs on a model of ``config`` in ``dtype`` on ``device``: one SettingError naming what
        is supported if not (:func:`mtp.decode.quantize.check_quantizable`), before any weight is converted."""
        check_quantizable(self.quantize, config, device, dtype)

    def check_device(self, device: torch.device) -> None:
        """Captured steps run only on CUDA (:mod:`mtp.decode.graphs`)."""
        if self.cuda_graphs and not captures_on(device):
            raise SettingError(
                f"{{cuda_graphs:name}} captures steps as CUDA graphs, and the model is on {device.type}; decode on a "
                "CUDA device, or leave {cuda_graphs:name} off.",
                cuda_graphs=self.cuda_graphs,
            )


PARTS: tuple[type, ...] = (GenerationConfig, HeadsSettings, DraftSettings, StepSettings)
"""The settings a decoding run is made of, each checking its own fields."""


def owner_of(name: str) -> type:
    """The part of :data:`PARTS` whose field ``name`` is."""
    return next(part for part in PARTS if name in {f.name for f in fields(part)})
