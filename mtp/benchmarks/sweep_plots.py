"""A sweep's figures (mtp/benchmarks/sweep_runs.py reads its runs, task_sweep.py tabulates them): the paper's figure
(accuracy against the number of operations, or against model size), the learning curves, and a corpus sweep's loss and
drafts against the non-embedding parameters. Each needs matplotlib (the ``benchmarks`` extra)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mtp.benchmarks.common import require_plotting, save_figure
from mtp.benchmarks.sweep_runs import SweepRun, aggregate, setting_labels, size_order
from mtp.benchmarks.task_eval import CORPUS
from mtp.benchmarks.task_sweep import corpus_groups, curve_groups


def pyplot() -> Any:
    """matplotlib's pyplot, drawing to files (the ``benchmarks`` extra; a UserError names it when it is missing)."""
    require_plotting()
    import matplotlib  # optional (the benchmarks extra): imported only when a plot is asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_sweep(finished: Sequence[SweepRun], path: Path, title: str) -> None:
    """The paper's figure: accuracy against the results' numeric rows (operation counts) when they are numbers, one
    line per n and setting with the seeds' range as a band and the rows beyond training shaded; otherwise accuracy
    against size (parameters), at the results' first row (induction: the second token), with the range as error
    bars. Models of a corpus: :func:`plot_corpus`."""
    if finished[0].results.get("task") == CORPUS:
        plot_corpus(finished, path, title)
        return
    plt = pyplot()
    groups = aggregate(finished)
    results = finished[0].results
    numeric = all(isinstance(row[results["group"]], int) for row in results["rows"]) and len(results["rows"]) > 1
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    ns = sorted({g.n for g in groups})
    lines = sorted({(g.setting, g.size) for g in groups}, key=lambda key: (key[0], size_order(finished).index(key[1])))
    labels = setting_labels({g.setting for g in groups})[1]
    styles = ["-", "--", ":", "-."]
    if numeric:
        for index, (setting, size) in enumerate(lines):
            for n in ns:
                series = [g for g in groups if (g.setting, g.size, g.n) == (setting, size, n)]
                xs = [g.group for g in series]
                color = colors[ns.index(n) % len(colors)]
                label = f"n={n}" + (f", {size}" if len({size for _, size in lines}) > 1 else "")
                label += f", {labels[setting]}" if len(labels) > 1 else ""
                ax.plot(xs, [g.mean for g in series], marker="o", color=color, linestyle=styles[index % 4], label=label)
                ax.fill_between(xs, [g.low for g in series], [g.high for g in series], color=color, alpha=0.15)
        outside = [g.group for g in groups if not g.in_domain]
        if outside:
            ax.axvspan(min(outside) - 0.5, max(outside) + 0.5, color="grey", alpha=0.1, label="out of domain")
        ax.set_xlabel(f"number of operations ({results['group']})")
        ax.set_xticks(sorted({g.group for g in groups}))
    else:
        headline = results["rows"][0][results["group"]]
        sizes = size_order(finished)
        settings = sorted({g.setting for g in groups})
        for n in ns:
            for index, setting in enumerate(settings):
                series = [g for g in groups if g.n == n and g.setting == setting and g.group == headline]
                xs = [sizes.index(g.size) for g in series]
                means = [g.mean for g in series]
                spread = [[g.mean - g.low for g in series], [g.high - g.mean for g in series]]
                label = f"n={n}" + (f", {labels[setting]}" if len(labels) > 1 else "")
                ax.errorbar(xs, means, yerr=spread, marker="o", capsize=4, color=colors[ns.index(n) % len(colors)],
                            linestyle=styles[index % 4], label=label)  # fmt: skip
        ax.set_xticks(range(len(sizes)), sizes)
        ax.set_xlabel("model size")
        ax.set_title(f"{results['group']}: {headline}", fontsize=9)
    _save_accuracy(fig, ax, results["metric"], title, path)


def _save_accuracy(fig, ax, ylabel: str, title: str, path: Path) -> None:
    """An accuracy axis (0 to 100%, gridded, with its legend), then the figure saved."""
    from matplotlib.ticker import PercentFormatter  # matplotlib: imported by pyplot() before any figure, optional

    ax.set_ylabel(ylabel)
    ax.set_ylim(-0.02, 1.02)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, title, path)


def plot_curves(finished: Sequence[SweepRun], path: Path, title: str) -> None:
    """The learning curves: the results' first row's accuracy against tokens trained, one line per n (color) and size
    and setting (style), the seeds' mean with their lowest-to-highest as a band."""
    plt = pyplot()
    groups = curve_groups(finished)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    ns = sorted({g.n for g in groups})
    sizes = [size for size in size_order(finished) if any(g.size == size for g in groups)]
    labels = setting_labels({g.setting for g in groups})[1]
    styles = ["-", "--", ":", "-."]
    # per size, the runs as configured (the empty setting, sorted first) solid, other settings (a control) their own
    variants = sorted({(sizes.index(g.size), g.setting) for g in groups})
    for group in groups:
        tokens, means, lows, highs = group.band()
        xs = [t / 1e6 for t in tokens]
        color = colors[ns.index(group.n) % len(colors)]
        label = f"n={group.n}, {group.size}" + (f", {labels[group.setting]}" if len(labels) > 1 else "")
        label += f" ({len(group.runs)} seeds)" if len(group.runs) > 1 else ""
        style = styles[variants.index((sizes.index(group.size), group.setting)) % 4]
        ax.plot(xs, means, color=color, linestyle=style, label=label)
        ax.fill_between(xs, lows, highs, color=color, alpha=0.15)
    ax.set_xlabel("tokens trained (millions)")
    _save_accuracy(fig, ax, f"{finished[0].results['metric']}, {finished[0].headline}", title, path)


def plot_corpus(finished: Sequence[SweepRun], path: Path, title: str) -> None:
    """The size trend: head 1's held-out loss and the tokens per forward of self-speculative decoding against the
    non-embedding parameters (ticked at the sizes run), one line per n (color) and setting (marker and style), the
    seeds' range as error bars."""
    plt = pyplot()
    groups = corpus_groups(finished)
    fig, (loss_ax, draft_ax) = plt.subplots(1, 2, figsize=(10, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    ns = sorted({run.n for run in finished})
    labels = setting_labels({run.setting for run in finished})[1]
    styles, markers = ["-", "--", ":", "-."], ["o", "s", "^", "D", "v", "P", "X", "*"]
    sizes = size_order(finished)
    ticks = sorted({run.results.get("non_embedding_parameters", 0) / 1e6 for run in finished})
    for index, setting in enumerate(sorted(labels)):
        for n in ns:
            series = [groups[(setting, size, n)] for size in sizes if (setting, size, n) in groups]
            if not series:
                continue
            xs = [runs[0].results.get("non_embedding_parameters", 0) / 1e6 for runs in series]
            label = f"n={n}" + (f", {labels[setting]}" if len(labels) > 1 else "")
            style = {"color": colors[ns.index(n) % len(colors)], "linestyle": styles[index % 4],
                     "marker": markers[index % len(markers)], "capsize": 4, "label": label}  # fmt: skip
            for ax, value in (
                (loss_ax, lambda r: r.results["rows"][0]["loss"]),
                (draft_ax, lambda r: r.results["decoding"]["tokens_per_forward"]),
            ):
                values = [[value(r) for r in runs] for runs in series]
                means = [statistics.fmean(v) for v in values]
                pairs = list(zip(means, values, strict=True))
                bars = [[m - min(v) for m, v in pairs], [max(v) - m for m, v in pairs]]
                ax.errorbar(xs, means, yerr=bars, **style)
    for ax, name in ((loss_ax, "head 1's held-out loss (nats per token)"), (draft_ax, "tokens per forward, greedy")):
        ax.set_xscale("log")
        ax.set_xticks(ticks, [f"{tick:.3g}" for tick in ticks])  # the sizes run, not a log axis' powers of ten
        ax.minorticks_off()
        ax.set_xlabel("non-embedding parameters (millions)")
        ax.set_ylabel(name)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    save_figure(fig, title, path)
