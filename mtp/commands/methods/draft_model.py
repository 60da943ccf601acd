"""A draft model (speculative sampling with a smaller mtp model on the target's tokenizer), decoded plainly or itself
speculatively (staged: its own drafts from prompt lookup or from its heads), and beside the target's heads (hybrid).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import torch

from mtp.benchmarks.cli import int_list
from mtp.checkpoint.load import LoadedCheckpoint, load_checkpoint
from mtp.commands.cli import add_settings
from mtp.commands.methods.base import BenchRow, DraftingMethod, Target, register
from mtp.decode.proposal import DEFAULT_GAMMA, Proposer
from mtp.decode.proposers import StagedDrafter, draft_model_drafter, staged_drafter
from mtp.decode.settings import Drafted
from mtp.errors import UserError


def load_draft(path: Path, target: LoadedCheckpoint, device: torch.device, dtype: str) -> LoadedCheckpoint:
    """A draft checkpoint for ``target``: an mtp checkpoint with the same tokenizer and vocabulary."""
    try:
        draft = load_checkpoint(path, device, dtype)
    except UserError as err:
        raise UserError(f"--draft: {err}") from err
    if draft.tokenizer.to_str() != target.tokenizer.to_str():
        raise UserError(
            f"--draft {path} has a different tokenizer from the target's; train the draft on the target's tokenizer "
            "(data/tokenizer=pretrained data.tokenizer.path=TARGET.ckpt)."
        )
    if draft.config.vocab_size != target.config.vocab_size:
        raise UserError(
            f"--draft {path} has model.vocab_size={draft.config.vocab_size} but the target has "
            f"{target.config.vocab_size}; train the draft with model.vocab_size={target.config.vocab_size}."
        )
    return draft


def staged_draft(
    path: Path, draft: LoadedCheckpoint, inner: str, compile: bool = False, gamma: int = DEFAULT_GAMMA
) -> StagedDrafter:
    """The staged drafter of --draft ``path`` --staged ``inner``: the draft model's own drafts from prompt lookup or
    from its heads, which it must have."""
    if inner == "heads" and draft.config.n_future < 2:
        raise UserError(
            f"--staged heads drafts with the draft model's own heads, and --draft {path} has one; train the draft with "
            "model=mtp2 (or mtp4), or use --staged lookup."
        )
    return staged_drafter(draft.model, inner, compile, gamma)


@dataclass
class DraftModelSettings:
    draft: Path | None = None
    """Draft with this checkpoint (same tokenizer; e.g. a tiny mtp1), verify with CKPT."""
    staged: Literal["lookup", "heads"] | None = None
    """Decode the draft model speculatively too, its own drafts from prompt lookup or from its heads (a draft trained
    as mtp2 or mtp4)."""


@register
class DraftModel(DraftingMethod):
    """A draft model drafts gamma tokens a step (Leviathan et al. 2023), staged or beside the heads."""

    name = "draft"
    settings = DraftModelSettings
    selected_by = "draft"
    beside_heads = True
    bench_names = ("draft", "hybrid", "staged")
    markers = {"draft": "D", "draft spectr": "H", "hybrid": "d", "staged": ">"}
    gamma_series = {"draft": "draft model"}
    predicted = ("draft",)

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser, bench: bool = False) -> None:
        if not bench:
            return super().add_flags(parser)
        group = parser.add_argument_group("draft, hybrid and staged: a draft model")
        add_settings(group, DraftModelSettings, notes={"staged": "for staged (default: lookup)"})
        group.add_argument("--gammas", type=int_list, default=list(range(1, 9)), help="for draft: drafts per step")

    @classmethod
    def check(cls, args: argparse.Namespace, chosen: bool) -> None:
        if args.staged is not None and args.draft is None:
            raise UserError("--staged decodes a draft model speculatively; give it with --draft DRAFT.ckpt.")

    def proposer(self, target: Target) -> Proposer:
        draft = load_draft(self.args.draft, target.loaded, target.device, target.dtype)
        if self.args.staged is not None:
            return staged_draft(self.args.draft, draft, self.args.staged, target.compile)
        return draft_model_drafter(draft.model, target.compile)

    def bench_gamma(self) -> int:
        return max(self.args.gammas)

    def bench_rows(self, target: Target, methods: list[str], drafted: Callable[[int], Drafted]) -> list[BenchRow]:
        args = self.args
        draft = load_draft(args.draft, target.loaded, target.device, args.dtype)
        model = draft_model_drafter(draft.model, args.compile)
        rows: list[BenchRow] = []
        if "draft" in methods:
            rows += [("draft", drafted(g), model.with_gamma(g)) for g in args.gammas]
            if "spectr" in methods:  # k draft sequences a step, SpecTr's rule
                spectr = replace(drafted(args.gamma), acceptance="spectr")
                rows += [
                    ("draft spectr", replace(spectr, drafts_per_step=k), model.with_gamma(args.gamma))
                    for k in args.sequences
                ]
        if "hybrid" in methods:  # the draft model's chain and the heads' chain, one tree
            rows.append(("hybrid", target.config, model.with_gamma(args.gamma)))
        if "staged" in methods:
            inner = args.staged or "lookup"
            staged = staged_draft(args.draft, draft, inner, args.compile, args.gamma)
            rows.append(("staged", drafted(args.gamma), staged))
        return rows
