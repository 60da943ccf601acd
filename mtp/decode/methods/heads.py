"""The target's own heads as a decoding method (self-speculative decoding): their chain, and their other ways of
drafting as the method's variants, each a benchmark row beside the chain at the largest k: a tree of their
candidates, typical acceptance on it, adaptive chains, SpecTr's several sequences. A variant is a function of
:class:`HeadsBench` returning its rows, kept by name in :attr:`Heads.variants` (:meth:`Heads.add_variant`: a test file
may add one). Their proposers are in :mod:`mtp.decode.heads_proposer` (the loop builds them on the form it packs);
how a run chooses its heads' part (a count, a tree) is :mod:`mtp.decode.heads_choice`'s."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import ClassVar, Literal

from mtp.decode.methods.base import BenchRow, DecodingMethod, Target, register
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
class HeadsBench:
    """What a variant of the heads' drafting builds its rows from, in one mode of a benchmark."""

    target: Target
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


Variant = Callable[[HeadsBench], list[BenchRow]]
"""A way the heads draft other than their plain chain: its rows in one mode."""


def tree_rows(bench: HeadsBench) -> list[BenchRow]:
    """A tree of the heads' candidates per step (one row per tree)."""
    return [BenchRow(label, bench.chain.changed(tree=tree)) for label, tree, _ in bench.trees]


def typical_rows(bench: HeadsBench) -> list[BenchRow]:
    """Medusa's typical acceptance on the first tree proper (lossy, so sampling only)."""
    if bench.mode != "sampling":
        return []
    return [BenchRow("typical", bench.chain.changed(tree=bench.trees[0][2], acceptance="typical"))]


def adaptive_rows(bench: HeadsBench) -> list[BenchRow]:
    """Chains cut by the heads' confidence (draft_p_min) and sized by the last step (+2 / -1 drafts)."""
    plan = bench.chain.changed(draft_p_min=bench.settings.draft_p_min, adaptive_drafts=True)
    return [BenchRow("adaptive", plan)]


def spectr_rows(bench: HeadsBench) -> list[BenchRow]:
    """k sequences of the heads a step under SpecTr's rule (greedy: the k likeliest first drafts), one row per k of
    the target's SpecTr sequences."""
    chain = bench.chain
    return [BenchRow("spectr", chain.changed(drafts_per_step=k, acceptance="spectr")) for k in bench.target.sequences]


@register
class Heads(DecodingMethod):
    """The target's heads draft: heads 2..k propose, head 1 verifies (Stern et al. 2018, Gloeckle et al. 2024)."""

    name = "heads"
    settings = HeadsSettings
    sweep = HeadsSweep
    selected_by = None
    variants: ClassVar[dict[str, Variant]] = {
        TREE: tree_rows,
        "typical": typical_rows,
        "adaptive": adaptive_rows,
        "spectr": spectr_rows,
    }
    """Its variants by name (each a --methods entry and its rows' label), in the order their rows come."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return (CHAIN, *cls.variants)

    @classmethod
    def add_variant(cls, name: str, rows: Variant) -> None:
        """Add a variant (a second one of the same name is refused)."""
        if name in cls.variants and cls.variants[name] is not rows:
            raise ValueError(f"a variant of the heads' drafting named {name!r} is there already")
        cls.variants[name] = rows

    @classmethod
    def remove_variant(cls, name: str) -> None:
        """Forget a variant (a test's own, once it is done)."""
        cls.variants.pop(name, None)

    def proposer(self, target: Target):
        raise TypeError("the heads draft inside the target's step; their settings are the plan's, with no drafter")

    def rows(self, target: Target, mode: str, labels: list[str]) -> list[BenchRow]:
        """The rows of the variants among ``labels`` (the chain's rows, one per k, the benchmark makes itself)."""
        bench = HeadsBench(target, mode, self.options, self.sweep_values)
        return [row for name, variant in self.variants.items() if name in labels for row in variant(bench)]
