"""A sweep of an experiment as one page: every finished run of one or more sweep folders, averaged over seeds.

A sweep folder (``python scripts/pretrain.py -m experiment=paper_polynomial ...``: logs/pretrain/sweeps/<experiment>)
holds one folder per job; a job is finished when it scored itself (its ``eval_task/results.json``, written by
``mtp eval-task`` at the end of training). Each job's settings come from Hydra's record of it (``.hydra/``): its seed,
its size preset and its other overrides; its number of heads n from its results. Runs that differ only in their seed
are one group, averaged; unfinished runs are listed, never averaged. Every run's budget (steps, tokens, training time
and threads) is listed.

The figures (mtp/benchmarks/sweep_plots.py) are the paper's (Gloeckle et al. 2024, figures 3 and 4): polynomial
arithmetic, accuracy against the number of operations, one line per n with the seeds' lowest-to-highest as a band;
induction, accuracy against model size (parameters), one line per n with the seeds' range as error bars. Runs that
recorded a task curve (``callbacks=task_curve``) add the learning curves (the headline accuracy against tokens trained:
the seeds' mean and their lowest-to-highest band, per n and size) and a table of each curve's best point beside its
last (the paper keeps the best checkpoint by the test metric). A sweep of models of a text corpus (``task``
``corpus``: the size trend, the byte models) is a table of head 1's held-out loss and of the tokens per forward of
self-speculative decoding, by size and n, and a figure of both against the non-embedding parameters.

A job that finishes also keeps a summary (:func:`write_summary`): one folder per job under the repository's results
folder (``results/experiments/<experiment>/<job>/results.json``: its scores and learning curve, budget, provenance, its
settings and the resolved config; no checkpoint, no event file), committed, so that its page is made again on any
machine without the job folders (a results folder is read as a sweep folder is) and a rerun of the sweep skips it.
"""

from __future__ import annotations

import json
import re
import shlex
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from mtp.benchmarks.task_eval import CORPUS
from mtp.errors import UserError, first_line
from mtp.files import write_whole

EVAL_RESULTS = Path("eval_task") / "results.json"
"""Where a job of a task experiment writes its score (mtp/commands/pretrain.py): its presence marks it finished."""
SUMMARY = "results.json"
"""A job's summary in its folder of the results folder: the job's results (:data:`EVAL_RESULTS`), plus ``job`` (its
experiment, name, settings, overrides, size preset and the overrides that only say where files go) and ``config``
(the job's resolved config)."""
SUMMARY_KEYS = ("job", "config", "provenance", "task", "group", "rows")
"""What a summary must hold for a page and a rerun to read it."""
VARIED = ("model", "model.n_future", "seed", "size", "experiment")
"""The overrides a sweep compares along (n, seed, size) or names its folder by: not part of a run's other settings."""
TASK_TITLES = {"polynomial": "Polynomial arithmetic", "induction": "Induction", CORPUS: "Next-token loss and drafts"}


@dataclass
class SweepRun:
    """One job of a sweep folder."""

    folder: Path
    size: str
    """The size preset (``size=``), from Hydra's record of the job's choices."""
    seed: int | None
    setting: tuple[str, ...]
    """The job's other overrides, sorted, less the seed, n and size and those that only say where files go (Hydra's
    ``override_dirname.exclude_keys``)."""
    n: int | None = None
    """model.n_future: the results' (the checkpoint's), else the config's."""
    results: dict[str, Any] | None = None
    """eval_task/results.json; None while the job is unfinished."""
    checkpoint: bool = False
    """Whether an unfinished job has a last.ckpt to resume from."""

    @property
    def headline(self) -> str:
        """The label of the results' first row (induction: the second token; polynomial: one operation)."""
        assert self.results is not None
        group = self.results["group"]
        return f"{group} {self.results['rows'][0][group]}"

    def curve(self) -> list[tuple[int, int, float]]:
        """(step, tokens, accuracy of the first row) of each point of the run's task curve (empty: none)."""
        points = (self.results or {}).get("curve", [])
        return [(p["step"], p["tokens"], float(p["rows"][0]["accuracy"])) for p in points]


@dataclass
class SweepGroup:
    """The runs of one setting, size, n and group (an operation count, a token) that differ only in their seed."""

    setting: tuple[str, ...]
    size: str
    n: int
    group: Any
    in_domain: bool
    seeds: list[int | None] = field(default_factory=list)
    accuracies: list[float] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.accuracies)

    @property
    def low(self) -> float:
        return min(self.accuracies)

    @property
    def high(self) -> float:
        return max(self.accuracies)


def job_folders(folder: Path) -> list[Path]:
    """The jobs under a sweep folder (job folders, each with Hydra's ``.hydra``) or under a results folder (summary
    folders: every folder without subfolders, which must hold its :data:`SUMMARY`); a job folder or a summary folder
    itself is its only job."""
    if (folder / ".hydra").is_dir() or (folder / SUMMARY).is_file():
        return [folder]
    jobs = sorted(path.parent for path in folder.rglob(".hydra") if path.is_dir())
    if jobs:
        return jobs
    summaries = []
    for path in sorted(folder.rglob("*")):
        hidden = any(part.startswith(".") for part in path.relative_to(folder).parts)
        if path.is_dir() and not hidden and not has_subfolders(path):
            summaries.append(path)
    return summaries


def has_subfolders(folder: Path) -> bool:
    return any(path.is_dir() for path in folder.iterdir())


def read_run(folder: Path) -> SweepRun:
    """A job's settings and, when finished, its results: from its job folder (Hydra's record in ``.hydra`` and
    :data:`EVAL_RESULTS`), or from its summary (:data:`SUMMARY`: finished by definition)."""
    hydra_dir = folder / ".hydra"
    if not hydra_dir.is_dir():
        summary = read_summary(folder / SUMMARY)
        job = summary["job"]
        run = settings_run(folder, summary["config"], job["overrides"], job["choices"], job["excluded"])
        run.results = summary
        run.n = summary.get("n_future", run.n)
        return run
    config = OmegaConf.load(hydra_dir / "config.yaml") if (hydra_dir / "config.yaml").is_file() else OmegaConf.create()
    hydra = OmegaConf.load(hydra_dir / "hydra.yaml").hydra if (hydra_dir / "hydra.yaml").is_file() else None
    overrides = list(OmegaConf.load(hydra_dir / "overrides.yaml")) if (hydra_dir / "overrides.yaml").is_file() else []
    choices = hydra.runtime.choices if hydra is not None else {}
    excluded = OmegaConf.select(hydra, "job.config.override_dirname.exclude_keys", default=None) or []
    run = settings_run(folder, config, overrides, choices, excluded)
    results_file = folder / EVAL_RESULTS
    if results_file.is_file():
        run.results = json.loads(results_file.read_text())
        run.n = run.results.get("n_future", run.n)
    run.checkpoint = (folder / "checkpoints" / "last.ckpt").exists()
    return run


def settings_run(
    folder: Path, config: Any, overrides: Iterable[str], choices: Any, excluded: Iterable[str]
) -> SweepRun:
    """A job's run, its results not read yet, from its config, its overrides, Hydra's choices of config groups and
    the override keys that only say where files go (``excluded``)."""
    apart = set(VARIED) | set(excluded)
    others = sorted(o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in apart)
    config = OmegaConf.create(config)
    seed = OmegaConf.select(config, "seed", default=None)
    n = OmegaConf.select(config, "model.n_future", default=None)
    return SweepRun(folder, str(choices.get("size", "?")), seed, tuple(others), n)


def summary_job(experiment: str, name: str, settings: str, overrides: Iterable[str], choices: Any,
                excluded: Iterable[str]) -> dict[str, Any]:  # fmt: skip
    """A summary's ``job``: what its page needs to group it as the job folder's Hydra record would (its overrides,
    the size preset chosen, the overrides that say only where files go) and what a rerun checks (``settings``: Hydra's
    ``override_dirname``)."""
    return {"experiment": experiment, "name": name, "settings": settings, "overrides": list(overrides),
            "choices": {"size": choices.get("size")}, "excluded": list(excluded)}  # fmt: skip


def write_summary(folder: Path, results: dict[str, Any], config: dict[str, Any], job: dict[str, Any]) -> Path:
    """Keep a finished job's summary: its results (scores, learning curve, steps, tokens, training time and threads,
    provenance: date, commit, machine, torch, command), its ``job`` (:func:`summary_job`) and its resolved ``config``,
    as ``folder``/results.json, written whole. Returns the file."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SUMMARY
    text = json.dumps({**results, "job": job, "config": config}, indent=1) + "\n"
    write_whole(path, lambda f: f.write(text.encode()))
    return path


def read_summary(path: Path) -> dict[str, Any]:
    """A job's summary; a missing, unreadable or incomplete one is refused in one sentence naming the file and the
    fix."""
    fix = (
        f"restore it from git (git checkout -- {shlex.quote(str(path.parent))}), or delete the folder "
        f"{shlex.quote(str(path.parent))} and run its sweep again to write it anew"
    )
    if not path.is_file():
        raise UserError(f"{path} is missing, so {path.parent} is no job's summary; {fix}.")
    try:
        summary = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{path} is not a readable job summary ({first_line(err)}); {fix}.") from None
    missing = [key for key in SUMMARY_KEYS if not isinstance(summary, dict) or key not in summary]
    if missing:
        raise UserError(f"{path} is not a job summary: it lacks {', '.join(missing)}; {fix}.")
    return summary


def read_sweep(folders: Sequence[Path]) -> tuple[list[SweepRun], list[SweepRun]]:
    """The finished and the unfinished runs of ``folders``; a UserError when there is no finished run, or when the
    finished runs are of more than one task."""
    for folder in folders:
        if not folder.is_dir():
            raise UserError(
                f"{folder} is not a folder; pass a sweep's folder, e.g. logs/pretrain/sweeps/paper_polynomial, or "
                "a results folder, e.g. results/experiments/paper_polynomial."
            )
    runs = [read_run(job) for folder in folders for job in job_folders(folder)]
    finished = [run for run in runs if run.results is not None]
    if not finished:
        named = ", ".join(map(str, folders))
        raise UserError(
            f"{named} holds no finished run (no job folder with {EVAL_RESULTS}, no job summary); run the sweep, or "
            "run its command again to finish what it left, before making its page."
        )
    tasks = sorted({run.results["task"] for run in finished})
    if len(tasks) > 1:
        raise UserError(f"the runs given are of several tasks ({', '.join(tasks)}); make one page per task.")
    return finished, [run for run in runs if run.results is None]


def natural_key(text: str) -> list[Any]:
    """``paper_3m`` before ``paper_10m``: the numbers in a name compared as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def size_order(runs: Iterable[SweepRun]) -> list[str]:
    """The size presets from the smallest model to the largest (their runs' parameter counts; else their names)."""
    parameters: dict[str, list[int]] = {}
    for run in runs:
        parameters.setdefault(run.size, []).append(run.results.get("parameters", 0) if run.results else 0)
    return sorted(parameters, key=lambda size: (statistics.median(parameters[size]), natural_key(size)))


def aggregate(runs: Sequence[SweepRun]) -> list[SweepGroup]:
    """One group per setting, size, n and result row (operation count, token), its runs' accuracies over the seeds;
    ordered by setting, size (smallest first), row (as the results list them) and n."""
    groups: dict[tuple, SweepGroup] = {}
    rows_order: dict[Any, int] = {}
    group_key = runs[0].results["group"]
    for run in runs:
        for row in run.results["rows"]:
            value = row[group_key]
            rows_order.setdefault(value, len(rows_order))
            key = (run.setting, run.size, run.n, value)
            group = groups.setdefault(key, SweepGroup(run.setting, run.size, run.n, value, bool(row.get("in_domain"))))
            group.seeds.append(run.seed)
            group.accuracies.append(row["accuracy"])
    sizes = size_order(runs)
    return sorted(groups.values(), key=lambda g: (g.setting, sizes.index(g.size), rows_order[g.group], g.n))


def setting_labels(settings: Iterable[tuple[str, ...]]) -> tuple[tuple[str, ...], dict[tuple[str, ...], str]]:
    """The overrides every setting shares, and each setting's label: the overrides it does not share (``as
    configured`` for none)."""
    settings = list(settings)
    common = set.intersection(*map(set, settings)) if settings else set()
    labels = {setting: ", ".join(o for o in setting if o not in common) or "as configured" for setting in settings}
    return tuple(sorted(common)), labels


def percent(value: float) -> str:
    return f"{value:.1%}"


def cell(group: SweepGroup | None) -> str:
    """A table cell: the seeds' mean, their lowest and highest, and how many seeds ran."""
    if group is None:
        return ""
    count = len(group.accuracies)
    if count == 1:
        return f"{percent(group.mean)} (1 seed)"
    return f"{percent(group.mean)} ({percent(group.low)}-{percent(group.high)}, {count} seeds)"


def sweep_tables(finished: Sequence[SweepRun], unfinished: Sequence[SweepRun]) -> str:
    """The page's body: per setting, a table of the metric by size and row (operation count, token; a corpus model:
    its loss and decoding) with one column per n; the learning curves' best and last points where the runs recorded
    curves; then every run (its folder, settings and budget) and the unfinished ones, which no average includes."""
    if finished[0].results.get("task") == CORPUS:
        parts = [corpus_tables(finished)]
    else:
        parts = task_tables(finished)
        if any(run.curve() for run in finished):
            parts.append(curve_table(finished))
        if finished[0].results.get("task") == "induction":
            parts.append(formed_table(finished))
    parts.append(runs_table([*finished, *unfinished]))
    if unfinished:
        parts.append(
            f"{len(unfinished)} run(s) unfinished, in no average above: run the sweep's command again to resume them."
        )
    return "\n\n".join(parts) + "\n"


def task_tables(finished: Sequence[SweepRun]) -> list[str]:
    """Accuracy per setting, size and row, one column per n."""
    groups = aggregate(finished)
    results = finished[0].results
    group_key, metric = results["group"], results["metric"]
    ns = sorted({g.n for g in groups})
    parts = [
        f"Each cell: the {metric} averaged over the seeds that finished, with the lowest and the highest seed's in "
        "brackets and how many seeds there were; domain: in for what training saw, out for beyond it."
    ]
    problems = sorted({row["problems"] for run in finished for row in run.results["rows"]})
    parts[0] += f" Problems per row and run: {', '.join(map(str, problems))}."
    common, labels = setting_labels({g.setting for g in groups})
    if common:
        parts.append(f"Every run's other settings: `{' '.join(common)}`.")
    for setting in sorted(labels):
        chosen = [g for g in groups if g.setting == setting]
        if len(labels) > 1:
            parts.append(f"### {labels[setting]}")
        lines = [
            f"| size | {group_key} | domain | " + " | ".join(f"n={n}" for n in ns) + " |",
            "|---|---:|---|" + "---:|" * len(ns),
        ]
        rows: dict[tuple, dict[int, SweepGroup]] = {}
        for g in chosen:
            rows.setdefault((g.size, g.group, g.in_domain), {})[g.n] = g
        for (size, value, in_domain), by_n in rows.items():
            cells = " | ".join(cell(by_n.get(n)) for n in ns)
            lines.append(f"| {size} | {value} | {'in' if in_domain else 'out'} | {cells} |")
        parts.append("\n".join(lines))
    return parts


def duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def runs_table(runs: Sequence[SweepRun]) -> str:
    """Every run with its parameters (the paper's matching keeps them equal across n) and budget (steps, tokens,
    training time and threads), and the sweep's training time in all."""
    lines = [
        "| run | size | n | seed | parameters | step | tokens | training time | threads | status |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for run in sorted(runs, key=lambda r: str(r.folder)):
        results = run.results or {}
        tokens = f"{results['tokens'] / 1e6:.1f}M" if results.get("tokens") else ""
        status = (
            "finished" if run.results else "unfinished, " + ("has a last.ckpt" if run.checkpoint else "not started")
        )
        n = "" if run.n is None else run.n
        parameters = f"{results['parameters'] / 1e6:.2f}M" if results.get("parameters") else ""
        lines.append(
            f"| {run.folder.name} | {run.size} | {n} | {run.seed} | {parameters} | {results.get('step', '')} | "
            f"{tokens} | {duration(results.get('train_seconds'))} | {results.get('train_threads') or ''} | {status} |"
        )
    seconds = [run.results["train_seconds"] for run in runs if run.results and run.results.get("train_seconds")]
    total = f"\n\nTraining time of the finished runs in all: {duration(sum(seconds))}." if seconds else ""
    return "### Runs\n\n" + "\n".join(lines) + total


@dataclass
class CurveGroup:
    """The task curves of the runs of one setting, size and n: each seed's accuracy (the results' first row) at each
    step every seed scored."""

    setting: tuple[str, ...]
    size: str
    n: int
    runs: list[SweepRun]

    def steps(self) -> list[tuple[int, int]]:
        """(step, tokens) scored by every run."""
        common = set.intersection(*({(step, tokens) for step, tokens, _ in run.curve()} for run in self.runs))
        return sorted(common)

    def band(self) -> tuple[list[int], list[float], list[float], list[float]]:
        """(tokens, mean, lowest, highest) over the seeds at each common step."""
        by_run = [{step: accuracy for step, _, accuracy in run.curve()} for run in self.runs]
        tokens, means, lows, highs = [], [], [], []
        for step, count in self.steps():
            values = [points[step] for points in by_run]
            tokens.append(count)
            means.append(statistics.fmean(values))
            lows.append(min(values))
            highs.append(max(values))
        return tokens, means, lows, highs


def curve_groups(finished: Sequence[SweepRun]) -> list[CurveGroup]:
    groups: dict[tuple, CurveGroup] = {}
    for run in finished:
        if run.curve():
            key = (run.setting, run.size, run.n)
            groups.setdefault(key, CurveGroup(*key, [])).runs.append(run)
    sizes = size_order(finished)
    return sorted(groups.values(), key=lambda g: (g.setting, sizes.index(g.size), g.n))


def spread(values: Sequence[float], form: Any = percent) -> str:
    """The seeds' mean with their lowest and highest: ``30.1% (28.7%-31.5%)``, or the one value."""
    if len(values) == 1:
        return form(values[0])
    return f"{form(statistics.fmean(values))} ({form(min(values))}-{form(max(values))})"


def curve_table(finished: Sequence[SweepRun]) -> str:
    """Each curve's best point beside its last (the seeds' mean and range), for the results' first row."""
    groups = curve_groups(finished)
    labels = setting_labels({g.setting for g in groups})[1]
    headline = finished[0].headline
    lines = [
        f"| size | n | seeds | best point ({headline}) | its step | last point | last step |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for group in groups:
        best = [max(run.curve(), key=lambda point: (point[2], -point[0])) for run in group.runs]
        last = [run.curve()[-1] for run in group.runs]
        size = group.size + (f", {labels[group.setting]}" if len(labels) > 1 else "")
        steps = ", ".join(str(step) for step, _, _ in best)
        lines.append(
            f"| {size} | {group.n} | {len(group.runs)} | {spread([a for _, _, a in best])} | {steps} | "
            f"{spread([a for _, _, a in last])} | {last[0][0]} |"
        )
    scored = sorted({p["rows"][0]["problems"] for run in finished for p in run.results.get("curve", [])})
    return (
        "### Learning curves\n\n"
        f"Each run scored its task every few steps while it trained ({', '.join(map(str, scored))} "
        f"{'repeated names' if finished[0].results['task'] == 'induction' else 'problems'} of the evaluation set, "
        "the first of them; the table above scored the whole set once training ended). The best point of a run's "
        "curve is what keeping its best checkpoint by the test metric would give (the paper's epoch oracle); the "
        "seeds' mean, lowest and highest.\n\n" + "\n".join(lines)
    )


INDUCTION_FORMED = 0.10
"""A run has formed induction when its final score on the second token of repeated names is at least this (stated
before the five-seed runs at paper_1m were made: docs/experiments-induction.md)."""


def token_count(tokens: int) -> str:
    """4.9M, 12.0K, 900."""
    if tokens >= 1e6:
        return f"{tokens / 1e6:.1f}M"
    return f"{tokens / 1e3:.1f}K" if tokens >= 1e3 else str(tokens)


def formed_table(finished: Sequence[SweepRun]) -> str:
    """Per size and n, the seeds that formed induction (:data:`INDUCTION_FORMED`) and, per seed, the final score and
    the tokens trained at the curve's first point at the threshold or above."""
    groups = corpus_groups(finished)
    labels = setting_labels(set(key[0] for key in groups))[1]
    sizes = size_order(finished)
    threshold = percent(INDUCTION_FORMED)
    lines = [
        f"| size | n | seeds | formed | final point per seed | first curve point at {threshold} or more per seed |",
        "|---|---:|---:|---|---|---|",
    ]
    for key in sorted(groups, key=lambda k: (k[0], sizes.index(k[1]), k[2])):
        runs = sorted(groups[key], key=lambda run: -1 if run.seed is None else run.seed)
        finals = [run.results["rows"][0]["accuracy"] for run in runs]
        reached = [next((tokens for _, tokens, a in run.curve() if a >= INDUCTION_FORMED), None) for run in runs]
        size = key[1] + (f", {labels[key[0]]}" if len(labels) > 1 else "")
        seeds = ", ".join(str(run.seed) for run in runs)
        formed = sum(final >= INDUCTION_FORMED for final in finals)
        lines.append(
            f"| {size} | {key[2]} | {seeds} | {formed} of {len(runs)} | {', '.join(map(percent, finals))} | "
            + ", ".join("-" if tokens is None else f"{token_count(tokens)} tokens" for tokens in reached)
            + " |"
        )
    return (
        "### Seeds that formed induction\n\n"
        f"A run has formed induction when its final point (the first table's second token) is {threshold} or more, "
        "the threshold stated before the five-seed runs were made. Beside each seed's final point (in the order of the "
        f"seeds), the tokens it had trained on at its curve's first point at {threshold} or more (-: none).\n\n"
        + "\n".join(lines)
    )


def corpus_groups(finished: Sequence[SweepRun]) -> dict[tuple, list[SweepRun]]:
    """The runs by setting, size and n (a corpus page's cells, an induction page's counts)."""
    groups: dict[tuple, list[SweepRun]] = {}
    for run in finished:
        groups.setdefault((run.setting, run.size, run.n), []).append(run)
    return groups


def corpus_tables(finished: Sequence[SweepRun]) -> str:
    """Head 1's held-out loss (nats per token), bits per byte and the tokens per forward of greedy self-speculative
    decoding with every head, by size and n, a table per setting; the loss's difference to n=1 beside it, and whether
    the seeds' ranges overlap (where each side has two seeds or more). A setting other than the one as configured (no
    override of its own: plain training) is set against every n of plain training of its size: a curriculum's n=4 and
    extra-head-free MTP's n=1 against plain n=1 and plain n=4 (what the lever costs, and what it wins back), n=1 trained
    as long as n=4 took against plain n=4; with no plain runs, against its own n=1."""
    groups = corpus_groups(finished)
    sizes = size_order(finished)
    common, labels = setting_labels({run.setting for run in finished})
    plain = next((setting for setting, label in labels.items() if label == "as configured"), None)
    plain_ns = sorted({run.n for run in finished if run.setting == plain})
    parts = [
        "Each cell: the mean over the seeds that finished, with the lowest and the highest seed's in brackets. The "
        "loss is head 1's (next-token) cross-entropy over the validation split of the training data; bits per byte "
        "divide its sum by the split's bytes; tokens per forward are those of greedy self-speculative decoding with "
        "every head of held-out prompts (1.00 for n=1), whose tokens equal autoregressive decoding's."
    ]
    if plain is not None and len(labels) > 1:
        parts[0] += " Each other setting's differences are to the runs as configured (plain) of the same size."
    if common:
        parts.append(f"Every run's other settings: `{' '.join(common)}`.")

    def metric(run: SweepRun, name: str) -> float:
        return run.results["decoding"]["tokens_per_forward"] if name == "tpf" else run.results["rows"][0][name]

    def difference(ours: list[float], theirs: list[float]) -> str:
        if not (ours and theirs):
            return ""
        gap = statistics.fmean(ours) - statistics.fmean(theirs)
        if min(len(ours), len(theirs)) < 2:  # one seed has no range to be apart from
            return f"{gap:+.3f} (one seed)"
        apart = max(ours) < min(theirs) or min(ours) > max(theirs)
        return f"{gap:+.3f} ({'ranges apart' if apart else 'ranges overlap'})"

    forms = {"loss": lambda v: f"{v:.3f}", "bits_per_byte": lambda v: f"{v:.3f}", "tpf": lambda v: f"{v:.2f}"}
    for setting in sorted(labels):
        ns = sorted({run.n for run in finished if run.setting == setting})
        if setting != plain and plain_ns:  # (its n, plain's n): each of its n against each of plain's
            pairs = [((setting, n), (plain, m)) for n in ns for m in plain_ns]
            named = {(plain, m): f"plain n={m}" for m in plain_ns}
        else:
            pairs = [((setting, n), (setting, 1)) for n in ns if n != 1 and 1 in ns]
            named = {(setting, 1): "n=1"}
        others = [key for key in named if key[0] != setting]
        counted = [f"n={n}" for n in ns] + [named[key] for key in others]
        if len(labels) > 1:
            parts.append(f"### {labels[setting]}")
        seeds = f"seeds ({'/'.join(counted)})" if len(counted) > 1 else "seeds"
        columns = [
            "size", "non-embedding parameters", "tokens", seeds,
            *(f"loss n={n}" for n in ns), *(f"n={ours[1]} - {named[theirs]}" for ours, theirs in pairs),
            *(f"bits/byte n={n}" for n in ns), *(f"tokens/forward n={n}" for n in ns if n != 1),
        ]  # fmt: skip
        lines = ["| " + " | ".join(columns) + " |", "|---|" + "---:|" * (len(columns) - 1)]
        for size in sizes:
            by_n = {n: groups.get((setting, size, n), []) for n in ns}
            present = [runs for runs in by_n.values() if runs]
            if not present:
                continue
            first = present[0][0].results

            def losses(key: tuple, size: str = size) -> list[float]:
                return [metric(run, "loss") for run in groups.get((key[0], size, key[1]), [])]

            counts = [len(by_n[n]) for n in ns] + [len(losses(key)) for key in others]
            cells = [spread(losses((setting, n)), forms["loss"]) if by_n[n] else "" for n in ns]
            cells += [difference(losses(ours), losses(theirs)) for ours, theirs in pairs]
            cells += [spread([metric(r, "bits_per_byte") for r in by_n[n]], forms["bits_per_byte"]) if by_n[n]
                      else "" for n in ns]  # fmt: skip
            cells += [spread([metric(r, "tpf") for r in by_n[n]], forms["tpf"]) if by_n[n] else ""
                      for n in ns if n != 1]  # fmt: skip
            tokens = f"{first['tokens'] / 1e6:.1f}M" if first.get("tokens") else ""
            parameters = f"{first.get('non_embedding_parameters', 0) / 1e6:.2f}M"
            row = [size, parameters, tokens, "/".join(map(str, counts)), *cells]
            lines.append("| " + " | ".join(row) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def sweep_title(finished: Sequence[SweepRun]) -> str:
    task = finished[0].results["task"]
    sizes = ", ".join(size_order(finished))
    ns = ", ".join(str(n) for n in sorted({run.n for run in finished}))
    seeds = ", ".join(str(s) for s in sorted({run.seed for run in finished}, key=str))
    return f"{TASK_TITLES.get(task, task)}, a sweep: {sizes}; n = {ns}; seeds {seeds}"


def sweep_provenance(finished: Sequence[SweepRun], page_command: str) -> dict[str, str]:
    """The page's header from its runs' own: the span of their dates, each distinct commit, machine and torch, and the
    sweep's command(s) followed by the page's."""

    def distinct(key: str) -> list[str]:
        return sorted({run.results.get("provenance", {}).get(key, "unknown") for run in finished})

    dates = distinct("date")
    header = {
        "date": dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}",
        "commit": ", ".join(distinct("commit")),
        "machine": "; ".join(distinct("machine")),
        "torch": ", ".join(distinct("torch")),
        "command": "\n".join([*distinct("command"), page_command]),
    }
    peaks = [run.results["provenance"]["peak memory"] for run in finished
             if "peak memory" in run.results.get("provenance", {})]  # fmt: skip
    if peaks:  # each run's training and scoring, in one process: the largest
        largest = max(peaks, key=lambda text: float(text.split()[0]))
        header["peak memory"] = f"{largest}: the largest of the {len(peaks)} of {len(finished)} runs that record it"
    return header
