"""A draft model's benchmark part (:class:`~mtp.decode.methods.draft_model.DraftModel`): its chain at every drafts
per step swept, its sequences under SpecTr's rule, its chain beside the heads' (hybrid) and staged."""

from __future__ import annotations

from dataclasses import dataclass, field

from mtp.benchmarks.methods.base import BenchRow, BenchTarget, MethodBench, register_bench
from mtp.decode.methods.draft_model import DraftModel, draft_model_drafter, load_draft, staged_draft

SPECTR = "draft-spectr"
"""bench_decode's --methods entry of the draft model's rows of several sequences a step under SpecTr's rule (each row
labelled 'draft spectr'), one per --sequences."""


@dataclass
class DraftModelSweep:
    gammas: list[int] = field(default_factory=lambda: list(range(1, 9)))
    """The draft model's drafts per step, a draft row each."""


@register_bench
class DraftModelBench(MethodBench):
    """A draft model's rows: a chain per gamma swept, SpecTr's sequences, hybrid and staged."""

    method = DraftModel
    sweep = DraftModelSweep
    labels = ("draft", SPECTR, "hybrid", "staged")
    predicted = ("draft",)
    markers = {"draft": "D", "draft spectr": "H", "hybrid": "d", "staged": ">"}
    series = {"draft": "draft model"}

    def most_drafts(self, gamma: int) -> int:
        return max([gamma, *self.sweep_values.gammas])

    def rows(self, target: BenchTarget, mode: str, labels: list[str]) -> list[BenchRow]:
        options, gamma = self.options, target.gamma
        draft = load_draft(options.draft, target.loaded, target.device, target.dtype)
        model = draft_model_drafter(draft.model, target.compile)
        rows: list[BenchRow] = []
        if "draft" in labels:
            rows += [self.row("draft", target.drafting(model.with_gamma(g))) for g in self.sweep_values.gammas]
        if SPECTR in labels:  # k draft sequences a step, SpecTr's rule
            spectr = target.drafting(model.with_gamma(gamma))
            rows += [
                self.row("draft spectr", spectr.changed(drafts_per_step=k, acceptance="spectr"))
                for k in target.sequences
            ]
        if "hybrid" in labels:  # the draft model's chain and the heads' chain, one tree
            rows.append(self.row("hybrid", target.plan(model.with_gamma(gamma))))
        if "staged" in labels:
            inner = options.staged or "lookup"
            staged = staged_draft(options.draft, draft, inner, target.compile, gamma)
            rows.append(self.row("staged", target.drafting(staged), draws_drafts=False))  # its inner step draws them
        return rows
