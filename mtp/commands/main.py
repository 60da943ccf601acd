"""mtp: every command of the framework under one name.

    mtp pretrain model=mtp4                  # scripts/pretrain.py model=mtp4
    mtp decode CKPT --self-speculative --prompt "def parse("
    mtp bench-decode CKPT --device cuda --step-modes eager,captured
    mtp SUBCOMMAND --help                    # its own flags

A subcommand takes exactly the arguments of its script (``scripts/<name>.py``) and of its ``mtp-<name>`` command,
which stay. Only the subcommand that runs is imported, so ``mtp --help`` answers at once.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from typing import NoReturn

from mtp.commands.cli import run_script

SUBCOMMANDS = {
    "pretrain": ("pretrain", "pretrain a model or add heads to one (Hydra overrides: model=mtp4, experiment=...)"),
    "decode": ("decode", "decode from a checkpoint or model file, autoregressively or speculatively"),
    "distill": ("distill", "a model's own continuations of prompts, to train draft heads on"),
    "bench-decode": ("bench_decode", "decoding benchmark: every method against autoregressive (and Hugging Face)"),
    "bench-train": ("bench_train", "training benchmark: memory and step time of the multi-head loss modes"),
    "compare-heads": ("compare_heads", "head types side by side: the checkpoints of one sweep in one table"),
    "fit-tree": ("fit_tree", "fit a draft tree to a checkpoint's own acceptance"),
    "export": ("export", "export a checkpoint as a Hugging Face Llama directory"),
    "results-page": ("results_page", "a benchmark's output folder, or a task sweep's, as a page under docs/results/"),
    "heads-curve": ("heads_curve", "what more distilled data and training time buy: benchmarks of heads as a curve"),
    "eval-task": ("eval_task", "score a checkpoint on its synthetic task (polynomial arithmetic): results.json"),
}
"""Subcommand -> (its module in mtp.commands, one line for the listing)."""


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = [f"  {name:<{width}}  {summary}" for name, (_, summary) in SUBCOMMANDS.items()]
    return "usage: mtp SUBCOMMAND [ARGS ...]\n\nsubcommands:\n" + "\n".join(lines) + "\n\n" + __doc__.split("\n\n")[1]


def main(argv: list[str] | None = None) -> NoReturn:
    """Run the subcommand named first in ``argv`` (None: the process's arguments) with the rest."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        sys.exit(0 if argv else 2)
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        near = difflib.get_close_matches(name, SUBCOMMANDS, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        print(f"mtp: no subcommand {name!r}{hint}; choose one of {', '.join(SUBCOMMANDS)}", file=sys.stderr)
        sys.exit(2)
    command = importlib.import_module(f"mtp.commands.{SUBCOMMANDS[name][0]}")
    sys.argv = [f"mtp {name}", *rest]  # usage and error lines name the subcommand
    run_script(command.main, rest)


def entry_point() -> NoReturn:
    """The mtp command."""
    main()
