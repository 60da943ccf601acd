"""Prompt lookup decoding (Saxena 2023): the drafts are what followed the latest earlier occurrence of the last
tokens, in the prompt or the output so far; no model drafts. With --self-speculative its chain and the heads' are
verified together in one step (a hybrid: lookup drafts where the text repeats itself, the heads elsewhere)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from mtp.commands.cli import require_at_least
from mtp.commands.methods.base import BenchRow, DraftingMethod, Target, register
from mtp.decode.lookup import LookupDrafter
from mtp.decode.proposal import Proposer
from mtp.decode.settings import Drafted

BESIDE_HEADS = "lookup+heads"
"""bench_decode's --methods entry (and row label) of prompt lookup's chain beside the heads' chain (a hybrid step)."""


@dataclass
class PromptLookupSettings:
    prompt_lookup: int | None = None
    """Draft what followed the latest earlier occurrence of the last N (down to 1) tokens."""


@register
class PromptLookup(DraftingMethod):
    """Prompt lookup drafts the continuation of an earlier match of the last tokens."""

    name = "lookup"
    bench_names = ("lookup", BESIDE_HEADS)
    markers = {"lookup": "v", BESIDE_HEADS: "P"}
    settings = PromptLookupSettings
    selected_by = "prompt_lookup"
    beside_heads = True

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser, bench: bool = False) -> None:
        if not bench:
            return super().add_flags(parser)
        parser.add_argument("--prompt-lookup", type=int, default=3, help="for lookup: the longest n-gram matched")

    @classmethod
    def check(cls, args: argparse.Namespace, chosen: bool) -> None:
        require_at_least(args, 1, "prompt_lookup")

    def proposer(self, target: Target) -> Proposer:
        return LookupDrafter(self.args.prompt_lookup, target.loaded.config.vocab_size, target.device)

    def bench_rows(self, target: Target, methods: list[str], drafted: Callable[[int], Drafted]) -> list[BenchRow]:
        rows = super().bench_rows(target, methods, drafted) if self.name in methods else []
        if BESIDE_HEADS in methods and target.config.heads > 1:  # its chain and the heads' chain, one tree
            rows.append((BESIDE_HEADS, target.config, self.drafter(target)))
        return rows
