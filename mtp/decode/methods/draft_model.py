"""A draft model (speculative sampling with a smaller mtp model on the target's tokenizer), decoded plainly or itself
speculatively (staged: its own drafts from prompt lookup or from its heads), and beside the target's heads (hybrid).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import torch

from mtp.checkpoint.load import LoadedCheckpoint, load_checkpoint
from mtp.decode.methods.base import BenchRow, DecodingMethod, Sweep, Target, register
from mtp.decode.proposal import DEFAULT_GAMMA, Proposer
from mtp.decode.proposers import StagedDrafter, draft_model_drafter, staged_drafter
from mtp.errors import SettingError, UserError


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
    """The staged drafter of the draft ``path`` staged with ``inner``: the draft model's own drafts from prompt lookup
    or from its heads, which it must have."""
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

    def __post_init__(self) -> None:
        if self.staged is not None and self.draft is None:
            raise SettingError(
                "{staged:name} decodes a draft model speculatively; give it with {draft:name} DRAFT.ckpt.",
                staged=self.staged,
                draft=self.draft,
            )


@register
class DraftModel(DecodingMethod):
    """A draft model drafts gamma tokens a step (Leviathan et al. 2023), staged or beside the heads."""

    name = "draft"
    settings = DraftModelSettings
    selected_by = "draft"
    beside_heads = True
    labels = ("draft", "hybrid", "staged")
    predicted = ("draft",)

    def proposer(self, target: Target) -> Proposer:
        options = self.options
        draft = load_draft(options.draft, target.loaded, target.device, target.dtype)
        if options.staged is not None:
            return staged_draft(options.draft, draft, options.staged, target.compile)
        return draft_model_drafter(draft.model, target.compile)

    def most_drafts(self, gamma: int, sweep: Sweep) -> int:
        return max(sweep.gammas)

    def rows(self, target: Target, mode: str, labels: list[str], sweep: Sweep) -> list[BenchRow]:
        options, gamma = self.options, target.config.gamma
        draft = load_draft(options.draft, target.loaded, target.device, target.dtype)
        model = draft_model_drafter(draft.model, target.compile)
        rows: list[BenchRow] = []
        if "draft" in labels:
            rows += [BenchRow("draft", target.drafting(g), model.with_gamma(g)) for g in sweep.gammas]
            if "spectr" in labels:  # k draft sequences a step, SpecTr's rule
                spectr = replace(target.drafting(gamma), acceptance="spectr")
                rows += [
                    BenchRow("draft spectr", replace(spectr, drafts_per_step=k), model.with_gamma(gamma))
                    for k in sweep.sequences
                ]
        if "hybrid" in labels:  # the draft model's chain and the heads' chain, one tree
            rows.append(BenchRow("hybrid", target.config, model.with_gamma(gamma)))
        if "staged" in labels:
            inner = options.staged or "lookup"
            staged = staged_draft(options.draft, draft, inner, target.compile, gamma)
            rows.append(BenchRow("staged", target.drafting(gamma), staged))
        return rows
