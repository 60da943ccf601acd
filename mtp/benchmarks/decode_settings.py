"""What the decoding benchmark times: its settings (a mode, a batch size, a method's row), each beside its twins in the
other draft dtypes, draft vocabularies, quantized precisions, step modes and draft choices asked for
(:class:`Variations`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from mtp.benchmarks.methods import BenchRow
from mtp.benchmarks.methods.heads import CHAIN
from mtp.decode.graphs import captures_on
from mtp.decode.plan import Plan
from mtp.decode.settings import StepSettings
from mtp.errors import SettingError
from mtp.model.config import ModelConfig

STEP_MODES = ("eager", "captured")


@dataclass(frozen=True)
class BenchSetting:
    """One setting the benchmark times: a row of its table."""

    mode: str
    """greedy or sampling."""
    batch_size: int
    method: str
    """The row's label: the heads' chain (:data:`~mtp.benchmarks.methods.heads.CHAIN`), a variant of it or a
    drafting method ('tree', 'draft spectr')."""
    plan: Plan
    """Its decoding plan: the heads (k), a tree, the drafter, the acceptance rule, the drafts' dtype, choice and
    vocabulary, eager or captured steps."""
    drafts_with_a_model: bool = True
    """Its drafter's drafts come out of a model (:attr:`~mtp.benchmarks.methods.BenchRow.drafts_with_a_model`)."""
    draws_drafts: bool = True
    """Its drafter draws its drafts from laws it computes (:attr:`~mtp.benchmarks.methods.BenchRow.draws_drafts`)."""

    def twin(self, **changes) -> BenchSetting:
        """The same setting with ``changes`` to its decoding settings (``draft_dtype="int8"``), its drafter the
        same."""
        return replace(self, plan=self.plan.changed(**changes))

    @property
    def checked(self) -> bool:
        """Its outputs are compared with autoregressive decoding's: greedy at batch 1."""
        return (self.mode, self.batch_size) == ("greedy", 1)

    @property
    def drafts_from_a_model(self) -> bool:
        """Its drafts come from a model: the heads above k = 1, a draft model, layer skip (not prompt lookup)."""
        drafter = self.plan.drafter
        return self.plan.heads.heads > 1 or (drafter is not None and self.drafts_with_a_model)


@dataclass(frozen=True)
class Variations:
    """The twins every setting runs beside, each list led by its baseline rows' value."""

    draft_dtypes: list[str]
    """The drafts' dtypes (auto, int8) of every setting whose drafts come from a model."""
    draft_first_ids: list[int]
    """The first N token ids the heads' drafts score (0: all) wherever the heads draft."""
    step_modes: list[str]
    """eager and/or captured (CUDA graphs), every setting in each."""
    draft_choices: list[str]
    """How sampling's drafts from a model are chosen (auto, sampled, tempered, top)."""
    quantize: list[str] = field(default_factory=lambda: ["none"])
    """The target's precisions (none: its own weights; int8, int4: quantized weight-only, its drafts' too), every
    setting in each whose drafts are not int8 drafts already."""

    def check_on(self, device: torch.device) -> None:
        """int8 drafts and quantized targets need the CPU and captured steps CUDA: one sentence where the benchmark runs
        elsewhere."""
        quantized = [q for q in self.quantize if q != "none"]
        if quantized and device.type != "cpu":
            raise SettingError(
                f"{{quantize}} runs PyTorch's weight-only CPU kernels, and the benchmark runs on {device.type}; use "
                "{device:cpu}, or {quantize:none}.",
                quantize=",".join(self.quantize),
                device=device.type,
            )
        if quantized and "captured" in self.step_modes:
            raise SettingError(
                "{quantize} runs on CPU and {step_modes:captured} on CUDA; time them in separate runs.",
                quantize=",".join(self.quantize),
                step_modes=",".join(self.step_modes),
            )
        if "int8" in self.draft_dtypes and device.type != "cpu":
            raise SettingError(
                "{draft_dtypes:int8} drafts with PyTorch's int8 CPU kernels, and the benchmark runs on "
                f"{device.type}; use {{device:cpu}}, or drop int8.",
                draft_dtypes=self.draft_dtypes,
                device=device.type,
            )
        if "captured" in self.step_modes and not captures_on(device):
            raise SettingError(
                f"{{step_modes:captured}} replays CUDA graphs, and the benchmark runs on {device.type}; use "
                "{device:cuda} on a machine with a GPU, or {step_modes:eager}.",
                step_modes=self.step_modes,
                device=device.type,
            )

    def check_for(self, config: ModelConfig, device: torch.device, dtype: torch.dtype) -> None:
        """Heads trained on a reduced draft vocabulary draft over it alone, no N may reach past the vocabulary, and each
        precision of ``quantize`` runs on the model (``config`` in ``dtype`` on ``device``: one sentence naming what is
        supported where not, before any weight is converted)."""
        for quantize in self.quantize:
            StepSettings(quantize=quantize).check_model(config, device, dtype)
        vocab, trained, most = config.vocab_size, config.draft_vocab, max(self.draft_first_ids)
        if trained and most:
            raise SettingError(
                f"{{draft_first_ids:name}}: this checkpoint's heads were trained to score its {trained} most frequent "
                "tokens; leave {draft_first_ids:name} out.",
                draft_first_ids=most,
            )
        if most >= vocab:
            raise SettingError(
                f"{{draft_first_ids}}: each must be below the vocabulary's {vocab} tokens.", draft_first_ids=most
            )


def bench_settings(
    modes: list[str],
    batch_sizes: list[int],
    heads: list[int],
    chain: Plan,
    method_rows: Callable[[Plan, str], list[BenchRow]],
    variations: Variations,
) -> list[BenchSetting]:
    """Every setting, per mode and batch size: the chain at each k of ``heads``, then ``method_rows(chain, mode)``
    (the other methods' rows at the largest k, asked once per mode), each with its twins in the ``variations`` (the
    draft dtypes, draft vocabularies, step modes and, sampling, draft choices)."""
    settings = []
    for mode in modes:
        mode_chain = chain if mode == "sampling" else chain.changed(temperature=0.0, top_p=1.0)
        rows = method_rows(mode_chain, mode)
        for batch_size in batch_sizes:
            entries = [BenchSetting(mode, batch_size, CHAIN, mode_chain.changed(heads=k)) for k in heads]
            entries += [BenchSetting(mode, batch_size, *row) for row in rows]
            entries = in_draft_dtypes(entries, variations.draft_dtypes)
            entries = in_draft_first_ids(entries, variations.draft_first_ids)
            entries = in_precisions(entries, variations.quantize)
            entries = in_step_modes(entries, variations.step_modes)
            if mode == "sampling":
                entries = in_draft_choices(entries, variations.draft_choices)
            settings += entries
    return settings


def in_draft_dtypes(settings: list[BenchSetting], draft_dtypes: list[str]) -> list[BenchSetting]:
    """``settings``, each followed by its twins in the other ``draft_dtypes`` where its drafts come from a model
    (heads above 1, a draft model, layer skip): the same drafter, another ``draft_dtype``."""
    out = []
    for setting in settings:
        out.append(setting)
        if setting.drafts_from_a_model:
            out += [setting.twin(draft_dtype=d) for d in draft_dtypes if d != setting.plan.drafts.draft_dtype]
    return out


def in_precisions(settings: list[BenchSetting], quantize: list[str]) -> list[BenchSetting]:
    """``settings`` (every one at the model's own weights, its drafts at theirs or int8), then each precision of
    ``quantize`` other than none: the settings again with the target quantized, drafts and drafter included (an int8
    drafts row has no quantized twin: its drafts are the quantized target's)."""
    out = list(settings)
    for precision in quantize:
        if precision != "none":
            out += [s.twin(quantize=precision) for s in settings if s.plan.drafts.draft_dtype == "auto"]
    return out


def in_step_modes(settings: list[BenchSetting], step_modes: list[str]) -> list[BenchSetting]:
    """``settings`` in each of ``step_modes``: eager, then captured (CUDA graphs)."""
    modes = [mode == "captured" for mode in STEP_MODES if mode in step_modes]
    return [setting.twin(cuda_graphs=captured) for captured in modes for setting in settings]


def in_draft_first_ids(settings: list[BenchSetting], draft_first_ids: list[int]) -> list[BenchSetting]:
    """``settings``, each followed by its twins drafting over the first N token ids for every other N of
    ``draft_first_ids`` where the heads draft (a drafter's vocabulary is its own)."""
    out = []
    for setting in settings:
        out.append(setting)
        if setting.plan.heads.heads > 1:
            current = setting.plan.heads.draft_first_ids
            out += [setting.twin(draft_first_ids=v) for v in draft_first_ids if v != current]
    return out


def in_draft_choices(settings: list[BenchSetting], draft_choices: list[str]) -> list[BenchSetting]:
    """Sampling's ``settings``, each followed by its twins with the other ``draft_choices`` where it samples drafts
    from a model and may draft them otherwise (not SpecTr's i.i.d. sequences, not a staged draft, not prompt lookup,
    whose drafts are top-ranked already)."""
    out = []
    for setting in settings:
        out.append(setting)
        plan, drafter = setting.plan, setting.plan.drafter
        if plan.samples_drafts and plan.sampling.acceptance == "exact" and (drafter is None or setting.draws_drafts):
            if plan.heads.heads > 1 or drafter is not None:
                out += [setting.twin(draft_choice=c) for c in draft_choices if c != plan.drafts.draft_choice]
    return out
