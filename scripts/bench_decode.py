"""Decoding benchmark: self-speculative vs autoregressive decoding of a checkpoint on held-out prompts.

    python scripts/bench_decode.py CKPT                       # k = 1..n, greedy and sampling, batch 1 and 8
    python scripts/bench_decode.py CKPT --device cuda --prompts 32 --max-new-tokens 256

Prompts are the openings of validation documents of the checkpoint's own training data (the split is
recomputed from the source and validation fraction stored in the checkpoint). For every k, mode and
batch size it reports tokens per forward, per-position acceptance, tokens/s and the speed-up over
autoregressive decoding (k = 1, same mode and batch). Writes results.json, results.md and decode.png.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mtp.benchmarks.cli import int_list  # noqa: E402
from mtp.benchmarks.report import decode_table, plot_decode  # noqa: E402
from mtp.checkpoint import load_checkpoint  # noqa: E402
from mtp.cli import run_script  # noqa: E402
from mtp.data.sources import SourceConfig, iter_texts, load_documents, split_documents  # noqa: E402
from mtp.data.tokenizer import eot_id  # noqa: E402
from mtp.decode import DecodeStats, GenerationConfig, generate  # noqa: E402
from mtp.errors import UserError  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--heads", type=int_list, default=None, help="k values (default 1..n)")
    parser.add_argument("--batch-sizes", type=int_list, default=[1, 8])
    parser.add_argument("--modes", default="greedy,sampling", help="greedy and/or sampling")
    parser.add_argument("--temperature", type=float, default=0.8, help="for sampling")
    parser.add_argument("--top-p", type=float, default=0.95, help="for sampling")
    parser.add_argument("--prompts", type=int, default=8, help="held-out prompts")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto", help="auto: bf16 on cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_decode")
    args = parser.parse_args(argv)
    args.modes = args.modes.split(",")
    if not set(args.modes) <= {"greedy", "sampling"}:
        parser.error(f"--modes {','.join(args.modes)}: each mode must be greedy or sampling")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda was asked for but PyTorch sees no CUDA device; use --device cpu")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    for name in ("prompts", "prompt_tokens", "max_new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def held_out_prompts(data: dict, tokenizer, count: int, length: int) -> list[list[int]]:
    """The first ``length`` tokens of ``count`` validation documents (after end-of-text, as in training)."""
    if not data:
        data = {"source": {"kind": "stdlib"}, "val_fraction": 0.05}
        print("note: the checkpoint does not record its training data; using the default corpus's validation split")
    validation = split_documents(load_documents(SourceConfig(**data["source"])), data["val_fraction"])["validation"]
    eot = eot_id(tokenizer)
    prompts = []
    for texts in iter_texts(validation):
        for text in texts:
            ids = tokenizer.encode(text, add_special_tokens=False).ids
            if len(ids) >= length:
                prompts.append([eot] + ids[:length])
            if len(prompts) == count:
                return prompts
    if not prompts:
        raise UserError(f"no validation document has {length} tokens; lower --prompt-tokens.")
    return prompts


def run(model, prompts: list[list[int]], config: GenerationConfig, batch_size: int) -> DecodeStats:
    """Decode all prompts in batches of ``batch_size``; statistics summed over the batches."""
    total = DecodeStats(rows=0, drafted=[0] * (config.heads - 1), accepted=[0] * (config.heads - 1))
    for start in range(0, len(prompts), batch_size):
        _, stats = generate(model, prompts[start : start + batch_size], config)
        total.rows += stats.rows
        total.forwards += stats.forwards
        total.row_forwards += stats.row_forwards
        total.tokens += stats.tokens
        total.wall_time_s += stats.wall_time_s
        total.drafted = [a + b for a, b in zip(total.drafted, stats.drafted, strict=True)]
        total.accepted = [a + b for a, b in zip(total.accepted, stats.accepted, strict=True)]
    return total


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    loaded = load_checkpoint(args.checkpoint, device, args.dtype)  # the dtype policy of scripts/decode.py
    model, n = loaded.model, loaded.config.n_future
    heads = args.heads or list(range(1, n + 1))
    if max(heads) > n:
        raise UserError(f"--heads {max(heads)} exceeds the checkpoint's {n} heads.")
    if 1 not in heads:
        heads = [1, *heads]  # the baseline speed-ups are measured against
    prompts = held_out_prompts(loaded.data, loaded.tokenizer, args.prompts, args.prompt_tokens)
    generate(model, prompts[:1], GenerationConfig(max_new_tokens=4, heads=max(heads)))  # warm-up

    rows = []
    for mode in args.modes:
        sampling = {"temperature": args.temperature, "top_p": args.top_p} if mode == "sampling" else {}
        for batch_size in args.batch_sizes:
            baseline_tps = None
            for k in sorted(heads):
                config = GenerationConfig(max_new_tokens=args.max_new_tokens, heads=k, seed=args.seed, **sampling)
                stats = run(model, prompts, config, batch_size)
                baseline_tps = baseline_tps or stats.tokens_per_s
                row = {
                    "mode": mode,
                    "batch_size": batch_size,
                    "heads": k,
                    "tokens": stats.tokens,
                    "forwards": stats.forwards,
                    "tokens_per_forward": stats.tokens_per_forward,
                    "acceptance": stats.acceptance,
                    "tokens_per_s": stats.tokens_per_s,
                    "wall_time_s": stats.wall_time_s,
                    "speedup": stats.tokens_per_s / baseline_tps,
                }
                rows.append(row)
                print(f"{mode:>8} batch={batch_size} k={k}: {stats.line()} speedup={row['speedup']:.2f}x", flush=True)

    device_name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    setup = {
        "checkpoint": str(args.checkpoint),
        "device": device_name,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "n_future": n,
        "parameters": sum(p.numel() for p in model.parameters()),
        "prompts": len(prompts),
        "prompt_tokens": args.prompt_tokens,
        "max_new_tokens": args.max_new_tokens,
        "sampling": {"temperature": args.temperature, "top_p": args.top_p},
    }
    title = (
        f"Decoding {args.checkpoint.name} (n={n}, {setup['dtype']}) on {device_name}: {len(prompts)} held-out "
        f"prompts of {args.prompt_tokens} tokens, {args.max_new_tokens} new tokens each"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"setup": setup, "results": rows}, indent=2))
    table = decode_table(rows)
    (args.out / "results.md").write_text(f"{title}\n\n{table}\n")
    plot_decode(rows, args.out / "decode.png", title)
    print(f"\n{title}\n\n{table}\n\nwrote {args.out}/results.json, results.md, decode.png")


if __name__ == "__main__":
    run_script(main)
