"""What more data and time buy: decoding benchmarks of heads trained on more tokens, for more steps, as one curve.

A point is one ``bench_decode`` output folder whose checkpoint is an mtp checkpoint trained on ``scripts/distill.py``
folders (JSON lines with ``prompt_ids`` and ``completion_ids``, a ``settings.json`` beside them). What it cost is read
from what the runs recorded, not given by hand:

- **distilled tokens**: the new tokens the model generated, of every row in the training data's files (the
  checkpoint's data source; the validation share, held out of training, included);
- **teacher-forced tokens**: every token of the rows whose replies were given (``--replies source``): text the model
  read in training, its own distribution labelling each position;
- **distillation minutes**: the folders' recorded seconds, for those files' share of their tokens (a subset of a
  folder's shards costs its share of the folder's time);
- **training minutes**: Lightning's ``ThroughputMonitor`` training time (``train/time``, validation left out) at the
  checkpoint's step, from the run's TensorBoard logs beside its ``checkpoints/`` folder (reading teacher-forced text
  happens there).
"""

from __future__ import annotations

import glob
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mtp.benchmarks.common import require_plotting, save_figure, table
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
    teacher_forced_tokens: int = 0
    head_type: str = "transformer"

    @property
    def minutes(self) -> float:
        return self.distill_minutes + self.train_minutes

    @property
    def tokens(self) -> int:
        """The tokens the heads trained on: generated and teacher-forced."""
        return self.distilled_tokens + self.teacher_forced_tokens


def training_files(stored: dict[str, Any], checkpoint: Path) -> list[Path]:
    """The files of the checkpoint's training data: those training recorded (path and size, checked against the files
    here), or, for a checkpoint that predates that record, its data source's paths globbed now, leaving out the
    files changed after the checkpoint was written (training cannot have read them)."""
    data = stored.get(CHECKPOINT_KEY, {}).get("data", {})
    if "files" in data:
        files = [Path(f["path"]) for f in data["files"]]
        for recorded, path in zip(data["files"], files, strict=True):
            if not path.is_file() or path.stat().st_size != recorded["bytes"]:
                now = f"{path.stat().st_size} bytes now" if path.is_file() else "gone"
                raise UserError(
                    f"{path}, which {checkpoint} trained on, has changed since ({recorded['bytes']} bytes then, "
                    f"{now}); a curve point counts the tokens training read, so restore the file or retrain on what "
                    "is there."
                )
        return files
    paths = data.get("source", {}).get("paths") or []
    written = checkpoint.stat().st_mtime
    files = sorted({Path(f) for pattern in paths for f in glob.glob(str(pattern))})
    files = [f for f in files if f.stat().st_mtime <= written]
    if not files:
        raise UserError(
            f"{checkpoint} records no training files that exist here (data.source.paths); a curve point needs heads "
            "trained on distilled files (scripts/distill.py's folders)."
        )
    return files


def distillation_cost(files: list[Path]) -> tuple[int, int, float]:
    """(new tokens in ``files``, teacher-forced tokens in them, the seconds making them took: each folder's recorded
    seconds times these files' share of its tokens)."""
    tokens, forced, seconds = 0, 0, 0.0
    for folder in sorted({f.parent for f in files}):
        settings = folder / "settings.json"
        if not settings.is_file():
            raise UserError(
                f"{folder} has no settings.json; a curve point's training files must be a distillation folder's "
                "shards (scripts/distill.py writes both)."
            )
        recorded = json.loads(settings.read_text())
        totals, given = recorded["totals"], recorded["settings"].get("replies") == "source"
        rows = [
            json.loads(line)
            for f in files
            if f.parent == folder
            for line in f.read_text(encoding="utf-8").splitlines()
            if line.strip()
        ]
        here = sum(len(row["completion_ids"]) for row in rows)
        if given:
            forced += sum(len(row["prompt_ids"]) + len(row["completion_ids"]) for row in rows)
        else:
            tokens += here
        seconds += totals["seconds"] * here / max(totals["tokens"], 1)
    return tokens, forced, seconds


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
    tokens, forced, distill_s = distillation_cost(training_files(stored, checkpoint))
    head_type = stored.get(CHECKPOINT_KEY, {}).get("model_config", {}).get("head_type", "transformer")
    rows = [
        {key: row[key] for key in ("method", "heads", "tokens_per_forward", "acceptance", "speedup", "forward_cost")}
        for row in results["results"]
        if (row["mode"], row["batch_size"]) == ("greedy", 1) and (row["heads"] > 1 or row["method"] != "chain")
    ]
    train_s = training_seconds(checkpoint, step)
    return CurvePoint(str(folder), str(checkpoint), step, tokens, distill_s / 60, train_s / 60, rows, forced, head_type)


def curve_table(points: list[CurvePoint]) -> str:
    """One row per point and method, in order of tokens, then steps. A speed-up is its own benchmark's, against mtp's
    autoregressive decoding in the same run: the points' benchmarks may have run at different times, under different
    loads, so compare speed-ups across points with that in mind."""
    head = (
        "| heads | distilled tokens | teacher-forced tokens | distillation min | training steps | training min "
        "| total min | method | k | tokens/forward | acceptance by draft position | speed-up |"
    )
    rows = (
        [
            point.head_type,
            f"{point.distilled_tokens:,}",
            f"{point.teacher_forced_tokens:,}",
            f"{point.distill_minutes:.1f}",
            str(point.step),
            f"{point.train_minutes:.1f}",
            f"{point.minutes:.1f}",
            row["method"],
            str(row["heads"]),
            f"{row['tokens_per_forward']:.2f}",
            ", ".join(f"{a:.2f}" for a in row["acceptance"]) or "-",
            f"{row['speedup']:.2f}x",
        ]
        for point in points
        for row in point.rows
    )
    return table(head, "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---:|", rows)


def plot_curve(points: list[CurvePoint], path: Path, title: str) -> None:
    """Tokens per forward (top) and speed-up (bottom) of each method against the tokens the heads trained on and
    against total minutes."""
    require_plotting()
    import matplotlib  # optional (the benchmarks extra): imported only when a plot is asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(11, 7.6), sharex="col", sharey="row")
    # one series per head type, method and k, and per step count where one amount of data trained for several: a line
    # joins the same training on more data (or, where each amount trained as long as it needed, the points in order)
    by_steps = len({p.tokens for p in points}) < len(points)
    series_keys = sorted(
        {(p.head_type, row["method"], row["heads"], p.step if by_steps else 0) for p in points for row in p.rows}
    )
    for head_type, method, heads, step in series_keys:
        series = [
            (point, row)
            for point in points
            for row in point.rows
            if (point.head_type, row["method"], row["heads"], point.step if by_steps else 0)
            == (head_type, method, heads, step)
        ]
        label = f"{head_type}: {method} k={heads}" + (f", {step} steps" if by_steps else "")
        for column, x in enumerate((lambda p: p.tokens, lambda p: p.minutes)):
            for row_axis, key in enumerate(("tokens_per_forward", "speedup")):
                axes[row_axis, column].plot([x(p) for p, _ in series], [r[key] for _, r in series], "o-", label=label)
    axes[1, 0].set_xlim(left=0)
    axes[1, 0].xaxis.set_major_formatter(lambda value, _: f"{value / 1000:.0f}k")
    axes[1, 0].set_xlabel("tokens the heads trained on (distilled + teacher-forced)")
    axes[1, 1].set_xlabel("minutes: distillation + training")
    axes[0, 0].set_ylabel("HumanEval tokens per forward")
    axes[1, 0].set_ylabel("speed-up over mtp autoregressive")
    for axis in axes.flat:
        axis.grid(alpha=0.3)
    axes[0, 1].legend(fontsize=7)
    save_figure(figure, title, path, fontsize=9, dpi=110)


def as_json(points: list[CurvePoint]) -> list[dict[str, Any]]:
    return [{**asdict(p), "minutes": p.minutes} for p in points]
