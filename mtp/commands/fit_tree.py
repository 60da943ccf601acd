"""Fit a draft tree to a checkpoint: the tree of --nodes candidates that its own decoding accepts most often.

    python scripts/fit_tree.py CKPT --nodes 16                                  # greedy
    python scripts/fit_tree.py CKPT --nodes 16 --temperature 0.8 --top-p 0.95   # for sampling
    python scripts/fit_tree.py CKPT --nodes fastest    # the size (1 to 64 nodes) decoding fastest on this machine
    python scripts/decode.py CKPT --self-speculative --tree results/trees/CKPT-16-greedy.json --prompt "def f("

Decodes held-out prompts of the checkpoint's validation split (documents after the ones the benchmarks use as
prompts) with a measuring tree of the paths of the smallest rank sums (up to 4 candidates below a node; 256 nodes,
or --nodes if more), counts how often each path of candidates was accepted, and keeps the most often accepted paths
(each with its parent and earlier siblings). Writes the tree as JSON ({"paths": [[0], [1], [0, 0], ...],
"expected_tokens_per_step": ..., ...}) for --tree.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

from mtp.checkpoint.load import load_checkpoint
from mtp.commands.cli import (
    add_device_flag,
    add_dtype_flag,
    node_budget,
    pick_device,
    require_at_least,
    run_script,
    settings_named_by_flags,
)
from mtp.commands.schema import add_parts, decoding_parts, decoding_schema
from mtp.decode.plan import Plan
from mtp.decode.tree_fit import FASTEST, FASTEST_SIZES, fitted_tree
from mtp.errors import UserError

DECODING = decoding_schema(
    ("max_new_tokens", "temperature", "top_k", "top_p", "heads", "seed"),
    notes={"heads": "default: all; the tree is heads - 1 deep", "temperature": "the tree is for this temperature"},
    heads=None,
)
"""The decoding settings a tree is fitted for, as flags."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument(
        "--nodes",
        type=node_budget,
        default=16,
        help=f"node budget (the root, head 1's token, not counted), or {FASTEST}: the size of 1 to "
        f"{FASTEST_SIZES[-1]} nodes whose steps, timed on this machine at batch 1, give the most expected tokens/s",
    )
    parser.add_argument("--prompts", type=int, default=16, help="held-out prompts to decode")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    add_parts(parser, DECODING)
    add_device_flag(parser)
    add_dtype_flag(parser)  # fit in the dtype the tree will decode in: their argmaxes can differ
    parser.add_argument("--out", type=Path, default=None, help="default: results/trees/<ckpt>-<nodes>-<mode>.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    require_at_least(args, 1, "prompts", "prompt_tokens", *(["nodes"] if args.nodes != FASTEST else []))
    if args.heads is not None and args.heads < 2:
        raise UserError(f"--heads {args.heads} drafts nothing; a tree needs --heads 2 or more (default: all).")
    parts = decoding_parts(DECODING, vars(args), heads=args.heads or 2)  # each part checked before anything is loaded
    device = pick_device(args.device)
    mode = "greedy" if parts["sampling"].greedy else f"T{args.temperature:g}"
    out = args.out or Path("results") / "trees" / f"{args.checkpoint.stem}-{args.nodes}-{mode}.json"
    out.parent.mkdir(parents=True, exist_ok=True)  # an unwritable --out fails before the fitting
    loaded = load_checkpoint(args.checkpoint, device, args.dtype)
    heads = replace(parts["heads"], heads=args.heads or loaded.config.n_future)
    if heads.heads < 2:
        raise UserError(f"{args.checkpoint} has 1 head, which drafts nothing; fit a tree to a checkpoint of 2 or more.")
    with settings_named_by_flags():  # the heads and context checked by generate() before the fitting decodes
        plan = Plan(**{**parts, "heads": heads})
        fitted = fitted_tree(loaded, plan, args.nodes, args.prompts, args.prompt_tokens)
    with tempfile.NamedTemporaryFile("w", dir=out.parent, suffix=".tmp", delete=False) as tmp:
        tmp.write(fitted.to_json())
    os.replace(tmp.name, out)
    if fitted.trials:
        print(fitted.summary())
    if fitted.chain_faster:
        print(f"note: here the heads' chain decodes faster than any tree: decode with --heads {heads.heads}, no --tree")
    print(
        f"nodes={fitted.tree.size} depth={fitted.tree.depth} expected_tokens/step={1 + fitted.expected_accepted:.3f} "
        f"measured_steps={fitted.steps} wrote {out}"
    )
    return 0


def entry_point() -> NoReturn:
    """mtp-fit-tree and scripts/fit_tree.py."""
    run_script(main)


if __name__ == "__main__":
    entry_point()
