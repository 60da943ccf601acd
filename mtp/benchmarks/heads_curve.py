"""What more data and time buy: decoding benchmarks of heads trained on more distilled tokens, for more steps, as one
curve.

A point is one ``bench_decode`` output folder whose checkpoint is an mtp checkpoint trained on distilled data
(``scripts/distill.py`` folders: JSON lines with ``completion_ids``, a ``settings.json`` beside them). What it cost is
read from what the runs recorded, not given by hand:

- **distilled tokens**: the new tokens of every row in the training data's files (the checkpoint's data source; the
  validation share, held out of training, included);
- **distillation minutes**: the distillation folder's recorded seconds, for that share of its tokens (a subset of a
  folder's shards costs its share of the folder's time);
- **training minutes**: Lightning's ``ThroughputMonitor`` training time (``train/time``, validation left out) at the
  checkpoint's step, from the run's TensorBoard logs beside its ``checkpoints/`` folder.
"""

from __future__ import annotations

import glob
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mtp.benchmarks.cli import require_plotting
from mtp.checkpoint.format import CHECKPOINT_KEY, read_checkpoint
from mtp.errors import UserError


@dataclass
class CurvePoint:
    folder: str
    """The benchmark's output folder."""
    checkpoint: str
    step: int
    distilled_tokens: int
    distill_minutes: float
    train_minutes: float
    rows: list[dict[str, Any]]
    """The benchmark's greedy batch-1 rows above k = 1: method, k, tokens per forward, acceptance, speed-up."""

    @property
    def minutes(self) -> float:
        return self.distill_minutes + self.train_minutes


def training_files(stored: dict[str, Any], checkpoint: Path) -> list[Path]:
    """The files of the checkpoint's training data (its data source's paths, globbed as training globbed them)."""
    meta = stored.get(CHECKPOINT_KEY, {})
    paths = meta.get("data", {}).get("source", {}).get("paths") or []
    files = sorted({Path(f) for pattern in paths for f in glob.glob(str(pattern))})
    if not files:
        raise UserError(
            f"{checkpoint} records no training files that exist here (data.source.paths); a curve point needs heads "
            "trained on distilled files (scripts/distill.py's folders)."
        )
    return files


def distillation_cost(files: list[Path]) -> tuple[int, float]:
    """(new tokens in ``files``, the seconds their distillation took: each folder's recorded seconds times these files'
    share of its tokens)."""
    tokens, seconds = 0, 0.0
    for folder in sorted({f.parent for f in files}):
        settings = folder / "settings.json"
        if not settings.is_file():
            raise UserError(
                f"{folder} has no settings.json; a curve point's training files must be a distillation folder's "
                "shards (scripts/distill.py writes both)."
            )
        totals = json.loads(settings.read_text())["totals"]
        here = sum(
            len(json.loads(line)["completion_ids"])
            for f in files
            if f.parent == folder
            for line in f.read_text(encoding="utf-8").splitlines()
            if line.strip()
        )
        tokens += here
        seconds += totals["seconds"] * here / max(totals["tokens"], 1)
    return tokens, seconds


def training_seconds(checkpoint: Path, step: int) -> float:
    """``train/time`` (Lightning's ThroughputMonitor) at ``step`` (the last logged at or before it) in the TensorBoard
    logs of the run the checkpoint belongs to (``<run>/checkpoints/<name>.ckpt``, ``<run>/tensorboard/``)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # only this reads the logs

    run = checkpoint.resolve().parent.parent
    logged: list[tuple[int, float]] = []
    for events in sorted((run / "tensorboard").glob("**/events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        if "train/time" in accumulator.Tags()["scalars"]:
            logged += [(e.step, e.value) for e in accumulator.Scalars("train/time")]
    before = [(s, v) for s, v in logged if s < step]  # a checkpoint at step N follows logged steps 0..N-1
    if not before:
        raise UserError(
            f"{run / 'tensorboard'} logs no train/time before step {step}; a curve point needs the run's TensorBoard "
            "logs beside its checkpoints/ folder."
        )
    return max(before)[1]


def curve_point(folder: Path) -> CurvePoint:
    """The point of one bench_decode output folder."""
    results_file = folder / "results.json"
    if not results_file.is_file():
        raise UserError(f"{folder} holds no results.json; pass bench_decode output folders (its --out).")
    results = json.loads(results_file.read_text())
    checkpoint = Path(results["setup"]["checkpoint"])
    if not checkpoint.is_file() or checkpoint.suffix != ".ckpt":
        raise UserError(f"{folder}: its checkpoint {checkpoint} is not an mtp checkpoint file here; a point needs it.")
    stored = read_checkpoint(checkpoint, mmap=True)
    step = stored.get("global_step", 0)
    tokens, distill_s = distillation_cost(training_files(stored, checkpoint))
    rows = [
        {key: row[key] for key in ("method", "heads", "tokens_per_forward", "acceptance", "speedup", "forward_cost")}
        for row in results["results"]
        if (row["mode"], row["batch_size"]) == ("greedy", 1) and (row["heads"] > 1 or row["method"] != "chain")
    ]
    train_s = training_seconds(checkpoint, step)
    return CurvePoint(str(folder), str(checkpoint), step, tokens, distill_s / 60, train_s / 60, rows)


def curve_table(points: list[CurvePoint]) -> str:
    """One row per point and method, in order of distilled tokens, then steps. Speed-ups are left to each benchmark's
    own page: the points' benchmarks may have run at different times, under different loads."""
    lines = [
        "| distilled tokens | distillation min | training steps | training min | total min | method | k "
        "| tokens/forward | acceptance by draft position |",
        "|---:|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for point in points:
        for row in point.rows:
            acceptance = ", ".join(f"{a:.2f}" for a in row["acceptance"]) or "-"
            lines.append(
                f"| {point.distilled_tokens:,} | {point.distill_minutes:.1f} | {point.step} | "
                f"{point.train_minutes:.1f} | {point.minutes:.1f} | {row['method']} | {row['heads']} | "
                f"{row['tokens_per_forward']:.2f} | {acceptance} |"
            )
    return "\n".join(lines)


def plot_curve(points: list[CurvePoint], path: Path, title: str) -> None:
    """Tokens per forward of each method against distilled tokens and against total minutes."""
    require_plotting()
    import matplotlib  # optional (the benchmarks extra): imported only when a plot is asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    # one series per method, k and training steps: a line joins the same training on more data
    series_keys = sorted({(row["method"], row["heads"], point.step) for point in points for row in point.rows})
    for method, heads, step in series_keys:
        series = [
            (point, row)
            for point in points
            for row in point.rows
            if (row["method"], row["heads"], point.step) == (method, heads, step)
        ]
        for axis, x in zip(axes, (lambda p: p.distilled_tokens, lambda p: p.minutes), strict=True):
            axis.plot([x(p) for p, _ in series], [r["tokens_per_forward"] for _, r in series], "o-",
                      label=f"{method} k={heads}, {step} steps")  # fmt: skip
    axes[0].set_xlim(left=0)
    axes[0].xaxis.set_major_formatter(lambda value, _: f"{value / 1000:.0f}k")
    axes[0].set_xlabel("distilled tokens the heads trained on")
    axes[1].set_xlabel("minutes: distillation + training")
    axes[0].set_ylabel("HumanEval tokens per forward")
    for axis in axes:
        axis.grid(alpha=0.3)
    axes[1].legend()
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def as_json(points: list[CurvePoint]) -> list[dict[str, Any]]:
    return [{**asdict(p), "minutes": p.minutes} for p in points]
