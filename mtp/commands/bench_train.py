"""Training efficiency: peak memory and step time of sequential vs naive multi-head loss across n and vocabulary.

    python scripts/bench_train.py                 # full grid, sized for the device it runs on
    python scripts/bench_train.py --quick         # tiny grid, under a minute on CPU
    python scripts/bench_train.py --device cuda --d-model 2048 --n-layers 16 --seq-len 4096
    python scripts/bench_train.py --tensor-parallel 1,2 --vocab 32768,131072 --modes sequential   # per process

Every configuration runs in a fresh process (see mtp/benchmarks/train_step.py). Writes results.json,
results.md (Markdown table with ratios to n=1) and memory.png to --out.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
from pathlib import Path
from typing import NoReturn

import torch

from mtp.benchmarks.common import require_plotting, step_in_fresh_process
from mtp.benchmarks.report import add_ratios_to_n1, markdown_table, write_results
from mtp.benchmarks.results_page import provenance
from mtp.benchmarks.train_step import StepSpec
from mtp.commands.cli import add_device_flag, int_list, pick_device, run_script
from mtp.model.config import HEAD_TYPES, ModelConfig
from mtp.model.heads import HEADS
from mtp.training.loss_config import HEAD_LOSSES, LossConfig
from mtp.training.parallel import check_tensor_parallel

# Defaults per device: a CPU grid small enough for a laptop; a GPU one large enough to keep a large GPU busy.
DEFAULTS = {
    "cpu": dict(d_model=256, n_layers=9, n_heads=4, n_kv_heads=2, seq_len=128, batch_size=4, steps=3, warmup=1),
    "cuda": dict(d_model=2048, n_layers=16, n_heads=16, n_kv_heads=8, seq_len=2048, batch_size=4, steps=5, warmup=2),
}
QUICK = dict(d_model=64, n_layers=9, n_heads=4, n_kv_heads=2, seq_len=64, batch_size=2, steps=2, warmup=1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int_list, default=None, help="heads to compare (default 1,2,4,8)")
    parser.add_argument("--vocab", type=int_list, default=None, help="vocabulary sizes (default 256,32768,131072)")
    parser.add_argument("--modes", default="sequential,naive", help="loss modes, comma-separated")
    parser.add_argument("--head-type", choices=list(HEAD_TYPES), default="transformer", help="what heads 2..n are")
    add_device_flag(parser)
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None, help="default: on for cuda")
    for name in ("d-model", "n-layers", "n-heads", "n-kv-heads", "seq-len", "batch-size", "steps", "warmup"):
        parser.add_argument(f"--{name}", type=int, default=None)
    parser.add_argument("--loss-chunk", type=int, default=0, help="sequential: positions per unembedding chunk")
    parser.add_argument(
        "--head-loss", choices=HEAD_LOSSES, default="ce", help="what heads 2..n learn from (loss.head_loss)"
    )
    parser.add_argument(
        "--head1-targets",
        type=int,
        default=None,
        help="head 1 also scored against tokens t+2..t+K (loss.head1_targets: MTP without extra heads)",
    )
    parser.add_argument("--activation-checkpointing", action="store_true", help="recompute each block in backward")
    parser.add_argument("--compile", action="store_true", help="torch.compile each block (warm-up steps compile)")
    parser.add_argument(
        "--tensor-parallel",
        type=int_list,
        default=[1],
        help="processes to split each step across (tensor parallelism, as trainer=tp), comma-separated; the memory "
        "is per process (default 1)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny grid (n 1,2; vocab 256,2048) for a smoke test")
    parser.add_argument("--out", type=Path, default=Path("results") / "bench_train")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    if not set(modes) <= {"sequential", "naive"}:
        parser.error(f"--modes {args.modes!r}: each mode must be sequential or naive")
    args.modes = modes
    args.device = pick_device(args.device).type
    if args.bf16 is None:
        args.bf16 = args.device == "cuda"
    sizes = dict(QUICK if args.quick else DEFAULTS[args.device])
    for key in sizes:
        if getattr(args, key) is not None:
            sizes[key] = getattr(args, key)
    args.sizes = sizes
    shape = ("seq_len", "batch_size", "steps", "warmup")
    args.model_sizes = {name: value for name, value in sizes.items() if name not in shape}
    args.step_shape = {name: value for name, value in sizes.items() if name in shape}
    args.n = args.n or ([1, 2] if args.quick else [1, 2, 4, 8])
    args.vocab = args.vocab or ([256, 2048] if args.quick else [256, 32768, 131072])
    if sizes["n_layers"] <= max(args.n):
        parser.error(f"--n-layers {sizes['n_layers']} leaves no trunk layer for n={max(args.n)}; use more layers")
    return args


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return (
        f"{platform.processor() or platform.machine()} CPU, {os.cpu_count()} cores, {torch.get_num_threads()} threads"
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    require_plotting()
    args.out.mkdir(parents=True, exist_ok=True)  # an unwritable --out fails before the benchmark runs
    rows, loss_chunk = [], args.loss_chunk
    for vocab, mode, tp, n in itertools.product(args.vocab, args.modes, args.tensor_parallel, args.n):
        spec = StepSpec(
            ModelConfig(vocab_size=vocab, n_future=n, head_type=args.head_type, **args.model_sizes),
            LossConfig(
                mode,
                loss_chunk=loss_chunk if mode == "sequential" else 0,
                head_loss=args.head_loss,
                head1_targets=args.head1_targets,
            ),
            device=args.device,
            bf16=args.bf16,
            activation_checkpointing=args.activation_checkpointing,
            compile=args.compile,
            tensor_parallel=tp,
            **args.step_shape,
        )
        if tp > 1:  # one sentence, before any process starts, for a model the processes cannot split
            check_tensor_parallel(spec.model_config(), tp, HEADS[args.head_type])
        row = step_in_fresh_process(spec)
        rows.append(row)
        shown = f"{row['peak_memory_bytes'] / 2**20:,.0f} MiB, {row['step_time_s'] * 1000:,.0f} ms"
        split = f" TP={tp}" if tp > 1 else ""
        print(f"V={vocab:>6} {mode:>10}{split} n={n}: {shown if row['status'] == 'ok' else row['status']}", flush=True)
    add_ratios_to_n1(rows)
    s = args.sizes
    setup = {
        "device": device_name(args.device),
        "torch": torch.__version__,
        "dtype": "bf16 autocast" if args.bf16 else "fp32",
        "head_type": args.head_type,
        "loss_chunk": args.loss_chunk,
        "head_loss": args.head_loss,
        "head1_targets": args.head1_targets,
        "activation_checkpointing": args.activation_checkpointing,
        "compile": args.compile,
        **s,
    }
    title = (
        f"Training step, {setup['device']}, {setup['dtype']}: d_model={s['d_model']}, n_layers={s['n_layers']} "
        f"(all heads included), {args.head_type} heads, batch {s['batch_size']} x {s['seq_len']} tokens"
        + (f", loss_chunk={args.loss_chunk}" if args.loss_chunk else "")
        + (f", head_loss={args.head_loss}" if args.head_loss != "ce" else "")
        + (f", head 1 scored against t+1..t+{args.head1_targets}" if args.head1_targets else "")
        + (", activation checkpointing" if args.activation_checkpointing else "")
        + (", compiled blocks" if args.compile else "")
        + (f", tensor parallel {'/'.join(map(str, args.tensor_parallel))} (memory per process)"
           if args.tensor_parallel != [1] else "")
    )  # fmt: skip
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else None
    write_results(args.out, rows, setup, title, provenance(argv, gpu))
    print(f"\n{title}\n\n{markdown_table(rows)}\n\nwrote {args.out}/results.json, results.md, memory.png")


def entry_point() -> NoReturn:
    """mtp-bench-train and scripts/bench_train.py."""
    run_script(main)


if __name__ == "__main__":
    entry_point()
