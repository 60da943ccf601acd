"""Where a decoding step's time goes on the CPU (:mod:`mtp.benchmarks.step_profile`): a checkpoint decodes a prompt
three times (a warm-up, one timed, one under ``torch.profiler``), and the profiled forward's time is split into the
matrix products (and the rate they stream their matrices at), attention, norms, the cache's writes, the rest of
PyTorch's operations, compiled code, and what runs outside PyTorch's operations.

    python -m mtp.commands.profile_step CKPT                       # the autoregressive step, torch's threads
    python -m mtp.commands.profile_step CKPT --threads 2 --compile # compiled, 2 threads pinned to 2 CPUs
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
from mtp.benchmarks.threads import described, pin_threads
from mtp.checkpoint.load import load_checkpoint
from mtp.commands.cli import add_dtype_flag, run_script, settings_named_by_flags
from mtp.data.tokenizer import prompt_ids
from mtp.decode import GenerationConfig, HeadsSettings, Plan, StepSettings
from mtp.decode.quantize import QUANTIZE

PROMPT = 'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number, fibonacci(0) being 0."""\n'
"""The default prompt: code, as the benchmarks' HumanEval prompts are."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="a .ckpt written by scripts/pretrain.py")
    parser.add_argument("--prompt", default=PROMPT, help="the prompt text (default: a Python function's head)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens decoded per run (default: 64)")
    parser.add_argument("--heads", type=int, default=1, help="1: the autoregressive step; k: k heads' (default: 1)")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False, help="torch.compile it")
    parser.add_argument("--quantize", choices=QUANTIZE, default="none", help="the target's weights (default: none)")
    parser.add_argument("--threads", type=int, default=0, help="pin N threads to N CPUs (default 0: torch's own)")
    parser.add_argument("--json", type=Path, default=None, help="also write the profile to this JSON file")
    add_dtype_flag(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with settings_named_by_flags():
        pin_threads(args.threads)
        plan = Plan(
            GenerationConfig(max_new_tokens=args.max_new_tokens),
            HeadsSettings(heads=args.heads),
            step=StepSettings(compile=args.compile, quantize=args.quantize),
        )
        device = torch.device("cpu")
        loaded = load_checkpoint(args.checkpoint, device, args.dtype)
        plan.step.check_model(loaded.config, device, loaded.model.tok_embeddings.weight.dtype)
        prompt = prompt_ids(loaded.tokenizer, args.prompt)
        measured = profile_step(loaded.model, [prompt], plan)
    step = "autoregressive" if args.heads == 1 else f"{args.heads} heads"
    print(
        f"{args.checkpoint}: {step}, {'compiled' if args.compile else 'eager'}, quantize={args.quantize}, "
        f"{described()}, {measured.tokens} tokens in {measured.forwards} forwards"
    )
    print(measured.table())
    if args.json is not None:
        args.json.write_text(json.dumps(measured.to_dict() | {"threads_used": described()}, indent=2))
    return 0


def entry_point() -> NoReturn:
    run_script(main)


if __name__ == "__main__":
    entry_point()
