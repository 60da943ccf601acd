"""The runs of a sweep of an experiment, read back: each job's settings and, once it scored itself, its results, from
its job folder (Hydra's record in ``.hydra/`` and ``eval_task/results.json``) or from the summary it keeps in the
repository's results folder (:func:`write_summary`: ``results/experiments/<experiment>/<job>/results.json``, its scores
and learning curve, budget, provenance, settings and resolved config; no checkpoint, no event file); and grouped by
setting, size and n over the seeds (:mod:`mtp.benchmarks.task_sweep` makes their page).
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
