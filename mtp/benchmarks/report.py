"""Tables and plots from benchmark results."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mtp.benchmarks.common import require_plotting, save_figure
from mtp.benchmarks.methods.heads import CHAIN

MIB = 2**20


def add_ratios_to_n1(rows: list[dict[str, Any]]) -> None:
    """Give each row memory and time ratios to the n_future=1 row of the same vocabulary, loss mode and tensor-parallel
    size, and (a split step's) its memory's ratio to the same step on one process."""

    def key(r: dict[str, Any]) -> tuple:
        return r["vocab_size"], r["loss"], r.get("tensor_parallel", 1)

    base = {key(r): r for r in rows if r["n_future"] == 1 and r["status"] == "ok"}
    whole = {(r["vocab_size"], r["loss"], r["n_future"]): r for r in rows
             if r.get("tensor_parallel", 1) == 1 and r["status"] == "ok"}  # fmt: skip
    for row in rows:
        one = whole.get((row["vocab_size"], row["loss"], row["n_future"]))
        ok = row["status"] == "ok" and one is not None
        row["memory_ratio_to_tp1"] = row["peak_memory_bytes"] / one["peak_memory_bytes"] if ok else None
        ref = base.get(key(row))
        if row["status"] != "ok" or ref is None:
            row["memory_ratio_to_n1"] = row["time_ratio_to_n1"] = None
            continue
        row["memory_ratio_to_n1"] = row["peak_memory_bytes"] / ref["peak_memory_bytes"]
        row["time_ratio_to_n1"] = row["step_time_s"] / ref["step_time_s"]


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """One row per step measured; with split steps (tensor parallelism), their size and memory per process beside its
    ratio to the same step on one process."""
    split = any(r.get("tensor_parallel", 1) > 1 for r in rows)
    lines = [
        "| vocab | loss | " + ("TP | " if split else "") + "n | peak memory (MiB) | memory / n=1 | "
        + ("memory / TP=1 | " if split else "") + "step (ms) | time / n=1 | tokens/s |",
        "|---:|---|" + ("---:|" if split else "") + "---:|---:|---:|" + ("---:|" if split else "") + "---:|---:|---:|",
    ]  # fmt: skip
    order = sorted(rows, key=lambda r: (r["vocab_size"], r["loss"], r.get("tensor_parallel", 1), r["n_future"]))
    for r in order:
        tp = f"{r.get('tensor_parallel', 1)} | " if split else ""
        if r["status"] != "ok":
            lines.append(
                f"| {r['vocab_size']} | {r['loss']} | {tp}{r['n_future']} | {r['status']} |"
                + " |" * (5 if split else 4)
            )
            continue
        to_tp1 = f"{_ratio(r.get('memory_ratio_to_tp1'))} | " if split else ""
        lines.append(
            f"| {r['vocab_size']} | {r['loss']} | {tp}{r['n_future']} | {r['peak_memory_bytes'] / MIB:,.0f} | "
            f"{_ratio(r['memory_ratio_to_n1'])} | {to_tp1}{r['step_time_s'] * 1000:,.0f} | "
            f"{_ratio(r['time_ratio_to_n1'])} | {r['tokens_per_s']:,.0f} |"
        )
    return "\n".join(lines)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def plot_memory(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    require_plotting()
    import matplotlib  # optional (the benchmarks extra): imported only when a plot is asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (memory_ax, time_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    vocabs = sorted({r["vocab_size"] for r in rows})
    colors = dict(zip(vocabs, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for (vocab, mode, tp), series in _series(rows).items():
        ns = [r["n_future"] for r in series]
        style = dict(
            color=colors[vocab], linestyle="-" if mode == "sequential" else "--", marker="o" if tp == 1 else "s"
        )
        label = f"{mode}, V={vocab}" + (f", TP={tp} (per process)" if tp > 1 else "")
        memory_ax.plot(ns, [r["peak_memory_bytes"] / MIB for r in series], label=label, **style)
        time_ax.plot(ns, [r["step_time_s"] * 1000 for r in series], label=label, **style)
    for ax, ylabel in ((memory_ax, "peak memory of a training step (MiB)"), (time_ax, "median step time (ms)")):
        ax.set_xlabel("heads n")
        ax.set_ylabel(ylabel)
        ax.set_xticks(sorted({r["n_future"] for r in rows}))
        low, high = ax.get_ylim()
        if low > 0 and high / low > 20:  # vocabularies far apart: log scale keeps every line readable
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    memory_ax.legend(fontsize=8)
    save_figure(fig, title, path)


def _series(rows: list[dict[str, Any]]) -> dict[tuple[int, str, int], list[dict[str, Any]]]:
    series: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: r["n_future"]):
        if r["status"] == "ok":
            series.setdefault((r["vocab_size"], r["loss"], r.get("tensor_parallel", 1)), []).append(r)
    return series


def write_results(
    out: Path, rows: list[dict[str, Any]], setup: dict[str, Any], title: str, provenance: dict[str, str]
) -> None:
    """results.json (headed by the run's ``provenance``: see :mod:`mtp.benchmarks.results_page`), results.md and
    memory.png under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    table = markdown_table(rows)
    results = {"provenance": provenance, "setup": setup, "results": rows}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "results.md").write_text(f"{title}\n\n{table}\n")
    plot_memory(rows, out / "memory.png", title)


def method_label(r: dict[str, Any]) -> str:
    """A row's method with its parameters: 'chain', 'tree (16 nodes)', 'draft (gamma 4)', 'layerskip (gamma 4, skip
    2,5)', 'lookup (gamma 4, ngram 3)', 'chain (int8 drafts)', 'chain (int4 weights)'."""
    method = r.get("method", CHAIN)
    params = [f"{r['sequences']} sequences"] if r.get("sequences", 1) > 1 else []
    params += [f"{r['tree_nodes']} nodes"] if r.get("tree_nodes") and not params else []
    params += [f"gamma {r['gamma']}"] if r.get("gamma") else []
    params += [f"{key} {value}" for key, value in r.get("drafter", {}).items() if key != "gamma"]
    params += ["lossy"] if r.get("lossy") else []
    params += [f"{r['draft_dtype']} drafts"] if r.get("draft_dtype", "auto") != "auto" else []
    params += [f"{r['quantize']} weights"] if r.get("quantize", "none") != "none" else []
    params += [f"{r['draft_choice']} drafts"] if r.get("draft_choice", "auto") != "auto" else []
    params += [f"drafts over the first {r['draft_first_ids']} ids"] if r.get("draft_first_ids") else []
    params += ["CUDA graphs"] if r.get("cuda_graphs") else []
    return method + (f" ({', '.join(params)})" if params else "")


def pass_cell(checks: dict[str, Any]) -> str:
    """A method's HumanEval pass@1 with the count it stands for, '0.250 (2/8)'; blank without one."""
    if "pass_at_1" not in checks:
        return ""
    prompts = checks["prompts"]
    return f"{checks['pass_at_1']:.3f} ({round(checks['pass_at_1'] * prompts)}/{prompts})"


def same_cell(checks: dict[str, Any]) -> str:
    """The prompts whose tokens equal autoregressive decoding's, '7/8'; blank without output checks."""
    return f"{checks['identical_outputs']}/{checks['prompts']}" if "identical_outputs" in checks else ""


def decode_table(rows: list[dict[str, Any]]) -> str:
    """One line per row; with output checks (greedy, batch 1), the prompts whose tokens equal autoregressive
    decoding's (at the row's precision), with quantized rows the prompts whose tokens equal autoregressive decoding's
    with the model's own weights, and with HumanEval prompts, pass@1. The draft side's time per step (a drafter's
    proposals, or the heads' part of a step) is shown with its ratio to the same setting's float drafts on an int8
    row."""
    same = any("identical_outputs" in r for r in rows)
    as_float = any("identical_to_float" in r for r in rows)
    scored = any("pass_at_1" in r for r in rows)
    extra_head = (" same tokens as k=1 |" if same else "") + (" same tokens as float k=1 |" if as_float else "")
    extra_head += " pass@1 |" if scored else ""
    lines = [
        "| mode | batch | method | k | tokens/forward | acceptance by draft position / depth | ms/forward "
        "| forward cost / k=1 | draft share | draft ms/step | tokens/s | speed-up | predicted |" + extra_head,
        "|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * (same + as_float + scored),
    ]
    for r in rows:
        accept = ", ".join(f"{a:.2f}" for a in r["acceptance"]) or "-"
        drafts = bool(r.get("gamma")) or r["heads"] > 1
        share = f"{r['draft_share']:.0%}" if drafts else ""
        draft_ms = f"{r['draft_ms_per_step']:.3f}" if drafts and "draft_ms_per_step" in r else ""
        draft_ms += f" ({r['draft_time_vs_auto']:.2f}x)" if "draft_time_vs_auto" in r else ""
        predicted = f"{r['predicted_speedup']:.2f}x" if "predicted_speedup" in r else ""
        float_cell = f"{r['identical_to_float']}/{r['prompts']}" if "identical_to_float" in r else ""
        extra = (f" {same_cell(r)} |" if same else "") + (f" {float_cell} |" if as_float else "")
        extra += f" {pass_cell(r)} |" if scored else ""
        lines.append(
            f"| {r['mode']} | {r['batch_size']} | {method_label(r)} | {r['heads']} | {r['tokens_per_forward']:.2f} | "
            f"{accept} | {r['ms_per_forward']:.2f} | {r['forward_cost']:.2f}x | {share} | {draft_ms} | "
            f"{r['tokens_per_s']:,.1f} | "
            f"{r['speedup']:.2f}x | {predicted} |" + extra
        )
    return "\n".join(lines)


def captured_summary(rows: list[dict[str, Any]]) -> str:
    """A paragraph on the rows whose steps were captured as CUDA graphs: what capturing cost, and each one's tokens/s
    against its eager twin (the same setting, steps launched kernel by kernel)."""
    captured = [r for r in rows if r.get("cuda_graphs")]
    shapes, seconds = sum(r["captures"] for r in captured), sum(r["capture_s"] for r in captured)

    def setting(r: dict[str, Any]) -> tuple:
        return tuple((key, str(value)) for key, value in sorted(r.items()) if key in TWIN_KEYS)

    eager = {setting(r): r for r in rows if not r.get("cuda_graphs")}
    against = []
    for r in captured:
        twin = eager.get(setting(r))
        if twin is not None:
            k = f" k={r['heads']}" if r["method"] == CHAIN else ""
            speed = r["tokens_per_s"] / twin["tokens_per_s"]
            same = ""
            if "identical_to_eager" in r:  # greedy, batch 1: token for token
                same = f", its tokens on {r['identical_to_eager']}/{r['prompts']} prompts"
            against.append(f"{r['mode']} batch {r['batch_size']} {method_label(twin)}{k} {speed:.2f}x{same}")
    return (
        f"Captured steps (CUDA graphs): {shapes} step shapes captured in {seconds:.2f} s, in the warm-up (every prompt "
        "once, in full) and the rounds, whose rates leave the time spent capturing out"
        + (f"; tokens/s against the same setting's eager steps: {'; '.join(against)}." if against else ".")
    )


TWIN_KEYS = (
    "mode",
    "batch_size",
    "method",
    "heads",
    "tree_nodes",
    "gamma",
    "sequences",
    "drafter",
    "draft_dtype",
    "draft_choice",
    "draft_first_ids",
)
"""What makes a captured row the twin of an eager one."""


def parted(checks: dict[str, Any]) -> str:
    """Where a greedy method's tokens left autoregressive decoding's, with head 1's top-2 logit margin there."""
    found = checks.get("parted", [])
    where = ", ".join(f"prompt {d['prompt']} at token {d['token']} ({d['top2_margin']:.2g})" for d in found)
    return f", parting at {where} (head 1's top-2 logit margin)" if found else ""


def exactness_entries(rows: list[dict[str, Any]], peer: dict[str, Any] | None) -> list[tuple[str, dict[str, Any]]]:
    """(label, output checks) of every greedy method at batch 1, mtp's and (with --hf) Hugging Face's."""
    entries = [
        (method_label(r) + (f" k={r['heads']}" if r["method"] == CHAIN else ""), r)
        for r in rows
        if "identical_outputs" in r
    ]
    if peer is not None:
        entries += [("HF generate", peer["hf_generate_checks"]), ("HF prompt lookup", peer["hf_prompt_lookup_checks"])]
        if "hf_static_checks" in peer:
            entries.append(("HF generate, static cache", peer["hf_static_checks"]))
    return entries


def exactness_summary(entries: list[tuple[str, dict[str, Any]]]) -> str:
    """One paragraph on the greedy methods at batch 1, all exact (their tokens are autoregressive decoding's up to
    floating-point rounding): which decode mtp autoregressive decoding's tokens on every prompt, and their pass@1 (the
    same for all when their outputs are), naming each method that differs. ``entries``: (label, output checks)."""
    prompts = entries[0][1]["prompts"]
    same = [label for label, checks in entries if checks["identical_outputs"] == prompts]
    differ = [(label, checks) for label, checks in entries if checks["identical_outputs"] != prompts]
    scores = {checks["pass_at_1"] for _, checks in entries if "pass_at_1" in checks}
    if not differ:
        text = f"All {len(entries)} greedy methods at batch 1 (every one exact) decode mtp autoregressive's tokens on "
        text += f"all {prompts} prompts"
        return text + (f": pass@1 {scores.pop():.3f} for every exact method." if len(scores) == 1 else ".")
    text = (
        f"Greedy methods at batch 1 (all exact, so their tokens can part only where floating-point rounding breaks a "
        f"near-tie): {len(same)} of {len(entries)} decode mtp autoregressive's tokens on all {prompts} prompts; the "
        "others on fewer: "
    )
    text += "; ".join(
        f"{label} on {checks['identical_outputs']} of {prompts}"
        + (f" (pass@1 {checks['pass_at_1']:.3f})" if "pass_at_1" in checks else "")
        + parted(checks)
        for label, checks in differ
    )
    if len(scores) == 1:
        return text + f". pass@1 {scores.pop():.3f} for every exact method."
    if scores:
        reference = next(checks["pass_at_1"] for _, checks in entries if checks["identical_outputs"] == prompts)
        return text + f". pass@1 {reference:.3f} for mtp autoregressive and every method with its tokens."
    return text + "."


def plot_decode(
    rows: list[dict[str, Any]],
    path: Path,
    title: str,
    markers: Mapping[str, str] | None = None,
    gamma_series: Mapping[str, str] | None = None,
) -> None:
    """Speed-up and tokens per forward against the most tokens a step can emit: the heads' chain and each method of
    ``gamma_series`` (label -> legend text; a draft model's over gamma) as lines (one colour per mode and batch size),
    the other methods as points in that colour with their ``markers`` (label -> matplotlib marker; a spare for a
    label without one), one legend entry per line and per method. The methods' benchmark parts say both
    (:func:`~mtp.benchmarks.methods.row_markers`, :func:`~mtp.benchmarks.methods.gamma_series`)."""
    require_plotting()
    import matplotlib  # optional (the benchmarks extra): imported only when a plot is asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    choices = {"top": "1", "sampled": "2", "tempered": "3"}  # rows of another draft_choice than auto
    markers = {"int8": "P", "draft vocab": "4", **choices, **(markers or {})}
    lines = dict(gamma_series or {})  # label -> legend text
    fig, (speed_ax, tpf_ax) = plt.subplots(1, 2, figsize=(11, 5.2))
    colors = {}  # (mode, batch size) -> the colour of its chain line, which its other methods share
    handles = []

    def x_of(r: dict[str, Any]) -> float:
        return r["gamma"] + 1 if r.get("gamma") else r["heads"]

    def line(mode: str, batch_size: int, method: str) -> list[dict[str, Any]]:  # int8 drafts apart, as points
        return sorted(
            (
                r
                for r in rows
                if (r["mode"], r["batch_size"], r.get("method", CHAIN)) == (mode, batch_size, method)
                and r.get("draft_dtype", "auto") == "auto"
                and r.get("draft_choice", "auto") == "auto"
                and not r.get("draft_first_ids")
                and not r.get("cuda_graphs")
            ),
            key=x_of,
        )

    for mode, batch_size in sorted({(r["mode"], r["batch_size"]) for r in rows}):
        series = line(mode, batch_size, CHAIN)
        style = dict(marker="o", linestyle="-" if mode == "greedy" else "--")
        (chain,) = speed_ax.plot([x_of(r) for r in series], [r["speedup"] for r in series], **style)
        color = colors[mode, batch_size] = chain.get_color()
        tpf_ax.plot([x_of(r) for r in series], [r["tokens_per_forward"] for r in series], **style, color=color)
        handles.append(Line2D([], [], color=color, **style, label=f"heads' chain, {mode}, batch {batch_size}"))
        for method in lines:
            drafted = line(mode, batch_size, method)
            if drafted:
                style = dict(marker=markers.get(method, "D"), markersize=5, linestyle=":", color=color)
                speed_ax.plot([x_of(r) for r in drafted], [r["speedup"] for r in drafted], **style)
                tpf_ax.plot([x_of(r) for r in drafted], [r["tokens_per_forward"] for r in drafted], **style)
    spare = iter("<8+|_X")  # methods of no marker of their own (one added later, or your own): one each, in turn
    shown = set()
    for r in rows:  # the other methods, int8 and top drafts: one point each, beside the chain's
        method = "int8" if r.get("draft_dtype", "auto") == "int8" else r.get("method", CHAIN)
        choice = r.get("draft_choice", "auto")
        method = choice if method != "int8" and choice != "auto" else method
        method = "draft vocab" if r.get("draft_first_ids") and method == CHAIN else method
        method = "captured" if r.get("cuda_graphs") and method == CHAIN else method
        if method == CHAIN or method in lines:
            shown.add(method)
            continue
        marker = markers[method] if method in markers else markers.setdefault(method, next(spare, "."))
        style = dict(marker=marker, markersize=9, linestyle="none")
        color = colors.get((r["mode"], r["batch_size"]), "black")
        speed_ax.plot([x_of(r) + 0.08], [r["speedup"]], **style, color=color)
        tpf_ax.plot([x_of(r) + 0.08], [r["tokens_per_forward"]], **style, color=color)
        if method not in shown:
            shown.add(method)
            label = {"int8": "int8 drafts (any method)"}.get(method)
            label = label or (f"{method} drafts (any method)" if method in choices else None)
            label = label or method_label({**r, "drafter": {}, "gamma": 0, "tree_nodes": 0})  # one marker, every size
            handles.append(Line2D([], [], color="black", **style, label=label))
    for method, legend in lines.items():
        if method in shown:
            style = dict(marker=markers.get(method, "D"), markersize=5, linestyle=":")
            handles.append(Line2D([], [], color="black", **style, label=legend))
    for ax, ylabel in ((speed_ax, "speed-up over autoregressive (tokens/s)"), (tpf_ax, "tokens per forward")):
        ax.set_xlabel("tokens a step can emit: heads used k, or gamma + 1")
        ax.set_ylabel(ylabel)
        ax.set_xticks(sorted({x_of(r) for r in rows}))
        ax.grid(True, alpha=0.3)
    speed_ax.axhline(1.0, color="grey", linewidth=0.8)
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    save_figure(fig, title, path, rect=(0, 0.02 + 0.05 * -(-len(handles) // 4), 1, 1))  # room for the legend rows
