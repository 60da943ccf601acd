"""Score a checkpoint on the synthetic task it was trained on (python scripts/eval_task.py, or mtp eval-task).

    python scripts/eval_task.py CKPT                        # every operation count, 1-10, the whole sets
    python scripts/eval_task.py CKPT --ops 1-5 --problems 200 --heads 2 --out results/poly_mtp2

The task is the one the checkpoint records as its data source (polynomial: experiment=paper_polynomial); each
evaluation problem is decoded greedily (--heads k > 1: self-speculatively with the model's heads, the same output)
and scored by exact match, per operation count, with a Wilson 95% interval (mtp/benchmarks/task_eval.py). Writes
results.json and results.md into --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, NoReturn

from mtp.benchmarks.results_page import provenance
from mtp.benchmarks.task_eval import TASKS, EvalSettings, parse_ops, results_table, task_of
from mtp.checkpoint.load import load_checkpoint
from mtp.commands.cli import add_device_flag, pick_device, require_at_least, run_script, settings_named_by_flags
from mtp.files import write_whole


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a checkpoint written by scripts/pretrain.py on a task (its last.ckpt)")
    parser.add_argument("--ops", default="1-10", help="polynomial: the operation counts, e.g. 1-10 or 1-5,8")
    parser.add_argument("--problems", type=int, default=None, help="problems per count (default: the whole set)")
    parser.add_argument("--heads", type=int, default=1, help="1: autoregressive; k > 1: k heads draft (same output)")
    parser.add_argument("--batch-size", type=int, default=64, help="problems decoded together (default: 64)")
    parser.add_argument("--out", type=Path, default=Path("results/eval_task"), help="folder of results.json and .md")
    add_device_flag(parser)
    return parser


def checked_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, checked before any checkpoint is loaded (a training run that scores itself at its end learns
    of a bad setting before it trains)."""
    args = build_parser().parse_args(argv)
    require_at_least(args, 1, "problems", "heads", "batch_size")
    args.settings = EvalSettings(parse_ops(args.ops), args.problems, args.heads, args.batch_size)
    pick_device(args.device)
    args.argv = argv  # the command results.json is headed by (None: this process's own arguments)
    return args


def main(argv: list[str] | None = None) -> None:
    run(checked_args(argv))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Score the checkpoint of :func:`checked_args`' arguments: results.json and results.md in --out (each written
    whole or not at all: a finished sweep job is one whose results.json exists). Returns the results."""
    loaded = load_checkpoint(args.checkpoint, pick_device(args.device), "float32")
    task = task_of(loaded, args.checkpoint)
    with settings_named_by_flags():  # the decoder's checks (e.g. more heads than trained) name --heads
        results = TASKS[task](loaded, args.settings)
    parameters = sum(p.numel() for p in loaded.model.parameters())
    results = {"provenance": provenance(args.argv), "task": task, "checkpoint": str(args.checkpoint),
               "step": loaded.global_step, "n_future": loaded.config.n_future, "parameters": parameters,
               **results}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    title = f"{task}: {Path(args.checkpoint).name}, step {loaded.global_step}, n_future {loaded.config.n_future}"
    markdown = f"# {title}\n\n{results_table(results)}"
    write_whole(args.out / "results.md", lambda f: f.write(markdown.encode()))
    text = json.dumps(results, indent=2) + "\n"
    write_whole(args.out / "results.json", lambda f: f.write(text.encode()))  # last: it marks the run finished
    print(results_table(results), end="")
    print(f"wrote {args.out / 'results.json'}")
    return results


def entry_point() -> NoReturn:
    """scripts/eval_task.py."""
    run_script(main)
