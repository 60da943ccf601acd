"""Where a decoding step's time goes on the CPU (:mod:`mtp.benchmarks.step_profile`): a checkpoint decodes a prompt
three times (a warm-up, one timed, one under ``torch.profiler``), and the profiled forward's time is split into the
matrix products (and the rate they stream their matrices at), attention, norms, the cache's writes, the rest of
PyTorch's operations, compiled code, and what runs outside PyTorch's operations.

    python -m mtp.commands.profile_step CKPT                       # the compiled autoregressive step, torch's threads
    python -m mtp.commands.profile_step CKPT --threads 2 --no-compile  # eager, 2 threads pinned to 2 CPUs
    python -m mtp.commands.profile_step CKPT --heads 3             # the self-speculative step: verifying 3 rows
    python -m mtp.commands.profile_step CKPT --quantize int8 --json profile.json

Decoding runs greedy to --max-new-tokens, past an end of text; compare its products' rate with this machine's read
bandwidth (python -m mtp.commands.bandwidth).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import NoReturn

import torch

from mtp.benchmarks.step_profile import profile_step
from mtp.benchmarks.threads import pin_threads
from mtp.checkpoint.load import load_checkpoint
from mtp.commands.cli import Placement, add_settings, run_script, settings_named_by_flags
from mtp.commands.schema import add_parts, compiled, decoding_parts, decoding_schema
from mtp.data.tokenizer import prompt_ids
from mtp.decode import Plan

DECODING = decoding_schema(
    ("max_new_tokens", "heads", "compile", "quantize"),
    {"compile": "default: compiled, as decode.py's on a CPU; --no-compile: eager"},
    max_new_tokens=64,
    compile=None,
)
"""The decoding settings a profiled step takes, as flags (greedy: the sampling's other settings at their defaults)."""
PROMPT = 'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number, fibonacci(0) being 0."""\n'
"""The default prompt: code, as the benchmarks' HumanEval prompts are."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="a .ckpt written by scripts/pretrain.py")
    parser.add_argument("--prompt", default=PROMPT, help="the prompt text (default: a Python function's head)")
    add_parts(parser, DECODING)
    add_settings(parser, Placement, ("dtype", "threads"))
    parser.add_argument("--json", type=Path, default=None, help="also write the profile to this JSON file")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    device = torch.device("cpu")
    plan = Plan(**decoding_parts(DECODING, vars(args), compile=compiled(args.compile, device)))
    with settings_named_by_flags():
        pin_threads(args.threads)
        loaded = load_checkpoint(args.checkpoint, device, args.dtype)
        plan.step.check_model(loaded.config, device, loaded.model.tok_embeddings.weight.dtype)
        prompt = prompt_ids(loaded.tokenizer, args.prompt)
        measured = profile_step(loaded.model, [prompt], plan)
    step = "autoregressive" if args.heads == 1 else f"{args.heads} heads"
    print(
        f"{args.checkpoint}: {step}, {'compiled' if plan.step.compile else 'eager'}, quantize={args.quantize}, "
        f"{measured.threads}, {measured.tokens} tokens in {measured.forwards} forwards"
    )
    print(measured.table())
    if args.json is not None:
        args.json.write_text(json.dumps(measured.to_dict(), indent=2))
    return 0


def entry_point() -> NoReturn:
    run_script(main)


if __name__ == "__main__":
    entry_point()
