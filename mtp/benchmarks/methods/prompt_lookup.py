"""Prompt lookup's benchmark part (:class:`~mtp.decode.methods.prompt_lookup.PromptLookup`): its chain, and its chain
beside the heads' (a hybrid step). Its drafts are looked up in the tokens: no int8 or draft-choice twins."""

from __future__ import annotations

from mtp.benchmarks.methods.base import BenchRow, BenchTarget, MethodBench, register_bench
from mtp.decode.methods.prompt_lookup import PromptLookup

BESIDE_HEADS = "lookup+heads"
"""bench_decode's --methods entry (and row label) of prompt lookup's chain beside the heads' chain (a hybrid step)."""


@register_bench
class PromptLookupBench(MethodBench):
    """Prompt lookup's rows: its chain, and beside the heads' chain."""

    method = PromptLookup
    labels = ("lookup", BESIDE_HEADS)
    bench_defaults = {"prompt_lookup": 3}
    markers = {"lookup": "v", BESIDE_HEADS: "P"}
    drafts_with_a_model = draws_drafts = False

    def rows(self, target: BenchTarget, mode: str, labels: list[str]) -> list[BenchRow]:
        rows = super().rows(target, mode, labels) if self.name in labels else []
        if BESIDE_HEADS in labels and target.heads.heads > 1:  # its chain and the heads' chain, one tree
            rows.append(self.row(BESIDE_HEADS, target.plan(self.drafter(target))))
        return rows
