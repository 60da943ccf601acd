"""Results page: a benchmark's output folder (results.json, results.md and its plot) as a page under docs/results/.

    python scripts/results_page.py results/smollm2_humaneval/results.json --out docs/results/smollm2-humaneval.md

The page is headed by the date, commit, machine, torch version and command the benchmark recorded in results.json,
then the benchmark's own tables (results.md beside results.json) and its plot (copied beside the page). A rerun
replaces the page.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import NoReturn

from mtp.benchmarks.results_page import page
from mtp.commands.cli import run_script
from mtp.errors import UserError

PLOTS = ("decode.png", "memory.png", "heads.png", "curve.png")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="a benchmark's results.json (results.md and its plot beside it)")
    parser.add_argument("--out", type=Path, required=True, help="the page to write, e.g. docs/results/NAME.md")
    args = parser.parse_args(argv)
    if not args.results.is_file():
        raise UserError(f"{args.results} is not a file; pass the results.json a benchmark wrote")
    folder = args.results.parent
    tables_file = folder / "results.md"
    if not tables_file.is_file():
        raise UserError(f"{tables_file} is missing; pass the results.json of a benchmark's output folder")
    title, _, tables = tables_file.read_text().partition("\n\n")
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


def entry_point() -> NoReturn:
    """scripts/results_page.py."""
    run_script(main)
