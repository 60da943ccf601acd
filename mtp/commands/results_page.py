"""Results page: a benchmark's output folder (results.json, results.md and its plot), or the sweep folders of a task
experiment, as a page under docs/results/.

    python scripts/results_page.py results/smollm2_humaneval/results.json --out docs/results/smollm2-humaneval.md
    python scripts/results_page.py logs/pretrain/sweeps/paper_polynomial --out docs/results/polynomial-1m.md

A benchmark's page is headed by the date, commit, machine, torch version and command the benchmark recorded in
results.json, then the benchmark's own tables (results.md beside results.json) and its plot (copied beside the page).
A sweep's page (one folder or several, e.g. one per size) aggregates every finished run in them
(mtp/benchmarks/task_sweep.py): accuracy per operation count (or per size) and n, averaged over the seeds with their
range, the unfinished runs listed apart, headed by the runs' own provenance; its plot, the paper's figure, is written
beside the page. A rerun replaces the page.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import NoReturn

from mtp.benchmarks.results_page import page, provenance
from mtp.benchmarks.sweep_plots import plot_curves, plot_sweep
from mtp.benchmarks.sweep_runs import read_sweep
from mtp.benchmarks.task_sweep import sweep_provenance, sweep_tables, sweep_title
from mtp.commands.cli import run_script
from mtp.errors import UserError

PLOTS = ("decode.png", "memory.png", "heads.png", "curve.png")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "results",
        type=Path,
        nargs="+",
        help="a benchmark's results.json (results.md and its plot beside it), or one or more sweep folders",
    )
    parser.add_argument("--out", type=Path, required=True, help="the page to write, e.g. docs/results/NAME.md")
    args = parser.parse_args(argv)
    if any(path.is_dir() for path in args.results):
        sweep_page(args.results, args.out, argv)
        return
    if len(args.results) > 1:
        raise UserError("several results.json were given; pass one (or pass sweep folders, which may be several)")
    args.results = args.results[0]
    if not args.results.is_file():
        raise UserError(f"{args.results} is not a file; pass the results.json a benchmark wrote")
    folder = args.results.parent
    tables_file = folder / "results.md"
    if not tables_file.is_file():
        raise UserError(f"{tables_file} is missing; pass the results.json of a benchmark's output folder")
    title, _, tables = tables_file.read_text().partition("\n\n")
    title = title.strip().lstrip("#").strip()  # a title written as a Markdown heading (eval_task's) is one title
    plot = None
    for name in PLOTS:
        if (folder / name).is_file():
            plot = f"{args.out.stem}.png"
            args.out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(folder / name, args.out.parent / plot)
            break
    text = page(json.loads(args.results.read_text()), title.strip(), tables, plot)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")


def sweep_page(folders: list[Path], out: Path, argv: list[str] | None) -> None:
    """The page of the task sweeps in ``folders`` and its plot (``out`` with .png) beside it."""
    finished, unfinished = read_sweep(folders)
    title = sweep_title(finished)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot = out.with_suffix(".png")
    plot_sweep(finished, plot, title)
    tables = sweep_tables(finished, unfinished)
    written = [out, plot]
    if any(run.curve() for run in finished):  # the learning curves, beside the paper's figure
        curves = out.with_name(f"{out.stem}-curves.png")
        plot_curves(finished, curves, f"{title}: learning curves")
        tables = tables.replace("### Runs", f"![Learning curves]({curves.name})\n\n### Runs", 1)
        written.append(curves)
    command = provenance(argv)["command"]  # this page's own command, after the sweep's
    text = page({"provenance": sweep_provenance(finished, command)}, title, tables, plot.name)
    out.write_text(text)
    left = f" ({len(unfinished)} unfinished run(s) left out)" if unfinished else ""
    print(f"wrote {', '.join(map(str, written))}{left}")


def entry_point() -> NoReturn:
    """scripts/results_page.py."""
    run_script(main)
