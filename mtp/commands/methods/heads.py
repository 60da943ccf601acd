"""The heads' own ways of drafting, benchmarked beside their chain: a tree of their candidates, typical acceptance on
it, adaptive chains, SpecTr's several sequences. Each is a :class:`HeadsVariant` registered by name, as the drafting
methods are (:mod:`.base`): bench_decode's ``--methods`` lists them after the chain, and a new one is a class here (or
in a test file) with ``@register_variant``."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

from mtp.benchmarks.cli import int_list, node_budgets
from mtp.checkpoint.load import LoadedCheckpoint
from mtp.decode.settings import Drafted
from mtp.decode.tree import DraftTree, read_tree
from mtp.decode.tree_fit import FASTEST, FASTEST_SIZES, fitted_tree

VariantRow = tuple[str, Drafted, None]
"""A benchmark row of the heads' variant: its label, its decoding settings, and no drafter (the heads draft)."""
BenchTree = tuple[str, DraftTree | None, DraftTree]
"""A tree the benchmark decodes: its rows' label, the tree the rows verify (None: the fastest fit is the chain,
decoded without one) and the tree proper (typical acceptance runs on it)."""


class HeadsVariant:
    """A way the heads draft other than their plain chain, as benchmark rows at the largest k."""

    name: ClassVar[str]
    """Its --methods entry and its rows' method."""
    markers: ClassVar[dict[str, str]] = {}
    """The benchmark plot's matplotlib marker of each of its rows' labels."""
    uses_trees: ClassVar[bool] = False
    """Its rows verify the benchmark's trees (read with --tree, or fitted with --tree auto)."""

    @classmethod
    def rows(cls, chain: Drafted, mode: str, args: argparse.Namespace, trees: list[BenchTree]) -> list[VariantRow]:
        """Its rows for one mode (greedy or sampling), from the heads' chain settings at the largest k."""
        raise NotImplementedError


HEADS_VARIANTS: dict[str, type[HeadsVariant]] = {}
"""Every registered variant by name, in the order registered."""


def register_variant(cls: type[HeadsVariant]) -> type[HeadsVariant]:
    """Register a variant of the heads' drafting (as a class decorator); a second one of the same name is refused."""
    if cls.name in HEADS_VARIANTS and HEADS_VARIANTS[cls.name] is not cls:
        raise ValueError(f"a variant of the heads' drafting named {cls.name!r} is registered already")
    HEADS_VARIANTS[cls.name] = cls
    return cls


def unregister_variant(name: str) -> None:
    """Forget a variant (a test's own, once it is done)."""
    HEADS_VARIANTS.pop(name, None)


def add_variant_flags(parser: argparse.ArgumentParser) -> None:
    """--tree, --tree-nodes and --sequences: the flags of the variants' rows on bench_decode's parser."""
    parser.add_argument("--tree", default="auto", help="for tree/typical: a JSON tree, or auto (fitted per mode)")
    parser.add_argument(
        "--tree-nodes",
        type=node_budgets,
        default=[FASTEST],
        help=f"node budgets of the fitted trees, one tree row each (e.g. fastest,8,16); {FASTEST}: the size of 1 to "
        f"{FASTEST_SIZES[-1]} nodes whose steps, timed here at batch 1, give the most expected tokens per second",
    )
    parser.add_argument(
        "--sequences",
        type=int_list,
        default=[2, 4],
        help="for spectr: draft sequences per step (SpecTr's k), one row each (with draft: the draft model's too)",
    )


def bench_trees(args: argparse.Namespace, loaded: LoadedCheckpoint, chain: Drafted, mode: str) -> list:
    """The trees a benchmark decodes: --tree's file, or with --tree auto one fitted per --tree-nodes budget."""
    if args.tree != "auto":
        tree = read_tree(Path(args.tree), chain.heads - 1, loaded.config.vocab_size)
        return [(Tree.name, tree, tree)]
    trees = []
    for nodes in args.tree_nodes:
        fitted = fitted_tree(loaded, chain, nodes)
        print(f"{mode}: {fitted.summary()}")
        if fitted.chain_faster:  # the fastest "tree" here is the heads' chain, decoded without a tree
            trees.append((f"{FASTEST} {Tree.name}: the chain", None, fitted.tree))
        else:
            trees.append((f"{FASTEST} {Tree.name}" if nodes == FASTEST else Tree.name, fitted.tree, fitted.tree))
    return trees


@register_variant
class Tree(HeadsVariant):
    """A tree of the heads' candidates per step (one row per tree)."""

    name = "tree"
    markers = {"tree": "*", f"{FASTEST} tree": "p", f"{FASTEST} tree: the chain": "p"}
    uses_trees = True

    @classmethod
    def rows(cls, chain, mode, args, trees):
        return [(label, replace(chain, tree=tree), None) for label, tree, _ in trees]


@register_variant
class Typical(HeadsVariant):
    """Medusa's typical acceptance on the first tree proper (lossy, so sampling only)."""

    name = "typical"
    markers = {"typical": "x"}
    uses_trees = True

    @classmethod
    def rows(cls, chain, mode, args, trees):
        if mode != "sampling":
            return []
        return [(cls.name, replace(chain, tree=trees[0][2], acceptance="typical"), None)]


@register_variant
class Adaptive(HeadsVariant):
    """Chains cut by the heads' confidence (--draft-p-min) and sized by the last step (+2 / -1 drafts)."""

    name = "adaptive"
    markers = {"adaptive": "s"}

    @classmethod
    def rows(cls, chain, mode, args, trees):
        return [(cls.name, replace(chain, draft_p_min=args.draft_p_min, adaptive_drafts=True), None)]


@register_variant
class SpecTr(HeadsVariant):
    """k sequences of the heads a step under SpecTr's rule (greedy: the k likeliest first drafts), one row per k."""

    name = "spectr"
    markers = {"spectr": "h"}

    @classmethod
    def rows(cls, chain, mode, args, trees):
        return [(cls.name, replace(chain, drafts_per_step=k, acceptance="spectr"), None) for k in args.sequences]
