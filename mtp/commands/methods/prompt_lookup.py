"""Prompt lookup decoding (Saxena 2023): the drafts are what followed the latest earlier occurrence of the last
tokens, in the prompt or the output so far; no model drafts."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from mtp.commands.cli import require_at_least
from mtp.commands.methods.base import DraftingMethod, Target, register
from mtp.decode.proposers import LookupDrafter, Proposer


@dataclass
class PromptLookupSettings:
    prompt_lookup: int | None = None
    """Draft what followed the latest earlier occurrence of the last N (down to 1) tokens."""


@register
class PromptLookup(DraftingMethod):
    """Prompt lookup drafts the continuation of an earlier match of the last tokens."""

    name = "lookup"
    markers = {"lookup": "v"}
    settings = PromptLookupSettings
    selected_by = "prompt_lookup"

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
