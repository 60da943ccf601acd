"""The target's own heads' benchmark part (:class:`~mtp.decode.methods.heads.Heads`): their chain, and their other
ways of drafting as rows beside the chain at the largest k: a tree of their candidates, typical acceptance on it,
adaptive chains, SpecTr's several sequences. Each is a function of :class:`HeadsRows` returning its rows, kept by its
--methods entry in :attr:`HeadsBench.variants` (:meth:`HeadsBench.add_variant`: a test file may add one)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import ClassVar, Literal

from mtp.benchmarks.methods.base import BenchRow, BenchTarget, MethodBench, register_bench
from mtp.decode.methods.heads import Heads
from mtp.decode.plan import Plan
from mtp.decode.settings import HeadsSettings
from mtp.decode.tree import DraftTree, read_tree
from mtp.decode.tree_fit import FASTEST, fitted_tree

CHAIN = "chain"
"""The heads' chain: the label of their rows at every k (k = 1: autoregressive decoding, every speed-up's baseline)."""
TREE = "tree"
BenchTree = tuple[str, DraftTree | None, DraftTree]
"""A tree the benchmark decodes: its rows' label, the tree the rows verify (None: the fastest fit is the chain,
decoded without one) and the tree proper (typical acceptance runs on it)."""


@dataclass
class HeadsSweep:
    tree: str = "auto"
    """For tree and typical: a JSON tree, or auto (fitted per mode)."""
    tree_nodes: list[int | Literal["fastest"]] = field(default_factory=lambda: [FASTEST])
    """Node budgets of the fitted trees, one tree row each; fastest: the size of 1 to 64 nodes whose steps, timed here
    at batch 1, give the most expected tokens per second."""


@dataclass
class HeadsRows:
    """What a variant of the heads' drafting builds its rows from, in one mode of a benchmark."""

    target: BenchTarget
    """The target, its parts the heads' chain at the largest k in this mode."""
    mode: str
    """greedy or sampling."""
    settings: HeadsSettings
    """The heads' settings asked for (the adaptive variant's ``draft_p_min``)."""
    sweep: HeadsSweep

    @property
    def chain(self) -> Plan:
        """The heads' chain at the largest k (no drafter)."""
        return self.target.plan()

    @cached_property
    def trees(self) -> list[BenchTree]:
        """The trees the variants decode (read or fitted once a mode, when a variant asks): the sweep's file, or with
        auto one fitted per node budget."""
        sweep, loaded, chain = self.sweep, self.target.loaded, self.chain
        if sweep.tree != "auto":
            tree = read_tree(Path(sweep.tree), chain.heads.heads - 1, loaded.config.vocab_size)
            return [(TREE, tree, tree)]
        trees = []
        for nodes in sweep.tree_nodes:
            fitted = fitted_tree(loaded, chain, nodes)
            self.target.log(f"{self.mode}: {fitted.summary()}")
            if fitted.chain_faster:  # the fastest "tree" here is the heads' chain, decoded without a tree
                trees.append((f"{FASTEST} {TREE}: the chain", None, fitted.tree))
            else:
                trees.append((f"{FASTEST} {TREE}" if nodes == FASTEST else TREE, fitted.tree, fitted.tree))
        return trees


Variant = Callable[[HeadsRows], list[BenchRow]]
"""A way the heads draft other than their plain chain: its rows in one mode."""


def tree_rows(bench: HeadsRows) -> list[BenchRow]:
    """A tree of the heads' candidates per step (one row per tree)."""
    return [BenchRow(label, bench.chain.changed(tree=tree)) for label, tree, _ in bench.trees]


def typical_rows(bench: HeadsRows) -> list[BenchRow]:
    """Medusa's typical acceptance on the first tree proper (lossy, so sampling only)."""
    if bench.mode != "sampling":
        return []
    return [BenchRow("typical", bench.chain.changed(tree=bench.trees[0][2], acceptance="typical"))]


def adaptive_rows(bench: HeadsRows) -> list[BenchRow]:
    """Chains cut by the heads' confidence (draft_p_min) and sized by the last step (+2 / -1 drafts)."""
    plan = bench.chain.changed(draft_p_min=bench.settings.draft_p_min, adaptive_drafts=True)
    return [BenchRow("adaptive", plan)]


def spectr_rows(bench: HeadsRows) -> list[BenchRow]:
    """k sequences of the heads a step under SpecTr's rule (greedy: the k likeliest first drafts), one row per k of
    the target's SpecTr sequences."""
    chain = bench.chain
    return [BenchRow("spectr", chain.changed(drafts_per_step=k, acceptance="spectr")) for k in bench.target.sequences]


@register_bench
class HeadsBench(MethodBench):
    """The heads' rows: their chain at every k (the benchmark makes those itself) and their variants'."""

    method = Heads
    sweep = HeadsSweep
    variants: ClassVar[dict[str, Variant]] = {
        TREE: tree_rows,
        "typical": typical_rows,
        "adaptive": adaptive_rows,
        "spectr": spectr_rows,
    }
    """Its variants by name (each a --methods entry and its rows' label), in the order their rows come."""
    markers = {
        TREE: "*",
        f"{FASTEST} {TREE}": "p",
        f"{FASTEST} {TREE}: the chain": "p",
        "typical": "x",
        "adaptive": "s",
        "spectr": "h",
    }

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return (CHAIN, *cls.variants)

    @classmethod
    def add_variant(cls, name: str, rows: Variant, marker: str | None = None) -> None:
        """Add a variant, its rows shown with ``marker`` (None: a spare); a second one of the same name is refused."""
        if name in cls.variants and cls.variants[name] is not rows:
            raise ValueError(f"a variant of the heads' drafting named {name!r} is there already")
        cls.variants[name] = rows
        if marker is not None:
            cls.markers = {**cls.markers, name: marker}

    @classmethod
    def remove_variant(cls, name: str) -> None:
        """Forget a variant (a test's own, once it is done)."""
        cls.variants.pop(name, None)
        cls.markers = {label: marker for label, marker in cls.markers.items() if label != name}

    def rows(self, target: BenchTarget, mode: str, labels: list[str]) -> list[BenchRow]:
        """The rows of the variants among ``labels`` (the chain's rows, one per k, the benchmark makes itself)."""
        bench = HeadsRows(target, mode, self.options, self.sweep_values)
        return [row for name, variant in self.variants.items() if name in labels for row in variant(bench)]
