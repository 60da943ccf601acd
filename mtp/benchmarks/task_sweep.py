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

A job that finishes also keeps a summary (:func:`~mtp.benchmarks.sweep_runs.write_summary`; that module reads the
runs back): one folder per job under the repository's results folder
(``results/experiments/<experiment>/<job>/results.json``: its scores and learning curve, budget, provenance, its
settings and the resolved config; no checkpoint, no event file), committed, so that its page is made again on any
machine without the job folders (a results folder is read as a sweep folder is) and a rerun of the sweep skips it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mtp.benchmarks.sweep_runs import SweepGroup, SweepRun, aggregate, setting_labels, size_order
from mtp.benchmarks.task_eval import CORPUS

TASK_TITLES = {"polynomial": "Polynomial arithmetic", "induction": "Induction", CORPUS: "Next-token loss and drafts"}


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
