"""Heads curve: what more training data and time buy, from decoding benchmarks of the checkpoints.

    python scripts/heads_curve.py results/quarter results/full100 results/full300 --out results/heads_curve
    python scripts/results_page.py results/heads_curve/results.json --out docs/results/NAME.md

Each folder is a bench_decode output (its --out) of an mtp checkpoint whose heads trained on scripts/distill.py
folders (generated replies, or given ones: teacher forcing). A point's distilled and teacher-forced tokens,
distillation and training minutes are read from what the runs recorded (the files, the folders' settings.json, the
run's TensorBoard train/time); its tokens per forward, acceptance and speed-up from the benchmark (greedy, batch 1).
Writes results.json, results.md and curve.png.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import NoReturn

from mtp.benchmarks.heads_curve import as_json, curve_point, curve_table, plot_curve
from mtp.benchmarks.results_page import provenance
from mtp.commands.cli import run_script


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", type=Path, nargs="+", help="bench_decode output folders, one point each")
    parser.add_argument("--out", type=Path, default=Path("results") / "heads_curve")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    points = sorted(map(curve_point, args.folders), key=lambda p: (p.head_type, p.tokens, p.step))
    first = json.loads((args.folders[0] / "results.json").read_text())
    title = (
        f"HumanEval tokens per forward and speed-up against training tokens and minutes ({len(points)} checkpoints; "
        f"{first['setup']['device']}, {first['setup']['prompts']} prompts, greedy, batch 1)"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"provenance": provenance(getattr(args, "argv", argv)), "points": as_json(points)}
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    (args.out / "results.md").write_text(f"{title}\n\n{curve_table(points)}\n")
    plot_curve(points, args.out / "curve.png", title)
    print(curve_table(points))
    print(f"wrote {args.out}/results.json, results.md, curve.png")


def entry_point() -> NoReturn:
    """scripts/heads_curve.py."""
    run_script(main)
