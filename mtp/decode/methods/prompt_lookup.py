"""Prompt lookup decoding (Saxena 2023): the drafts are what followed the latest earlier occurrence of the last
tokens, in the prompt or the output so far; no model drafts. Beside the heads its chain and theirs are verified
together in one step (a hybrid: lookup drafts where the text repeats itself, the heads elsewhere)."""

from __future__ import annotations

from dataclasses import dataclass

from mtp.decode.lookup import LookupDrafter
from mtp.decode.methods.base import BenchRow, DecodingMethod, Sweep, Target, register
from mtp.decode.proposal import Proposer
from mtp.errors import SettingError

BESIDE_HEADS = "lookup+heads"
"""bench_decode's --methods entry (and row label) of prompt lookup's chain beside the heads' chain (a hybrid step)."""


@dataclass
class PromptLookupSettings:
    prompt_lookup: int | None = None
    """Draft what followed the latest earlier occurrence of the last N (down to 1) tokens."""

    def __post_init__(self) -> None:
        if self.prompt_lookup is not None and self.prompt_lookup < 1:
            raise SettingError("{prompt_lookup} must be at least 1.", prompt_lookup=self.prompt_lookup)


@register
class PromptLookup(DecodingMethod):
    """Prompt lookup drafts the continuation of an earlier match of the last tokens."""

    name = "lookup"
    labels = ("lookup", BESIDE_HEADS)
    settings = PromptLookupSettings
    selected_by = "prompt_lookup"
    beside_heads = True

    def proposer(self, target: Target) -> Proposer:
        return LookupDrafter(self.options.prompt_lookup, target.loaded.config.vocab_size, target.device)

    def rows(self, target: Target, mode: str, labels: list[str], sweep: Sweep) -> list[BenchRow]:
        rows = super().rows(target, mode, labels, sweep) if self.name in labels else []
        if BESIDE_HEADS in labels and target.config.heads > 1:  # its chain and the heads' chain, one tree
            rows.append(BenchRow(BESIDE_HEADS, target.config, self.drafter(target)))
        return rows
