"""The decoding benchmark: its settings (:mod:`~mtp.benchmarks.decode_settings`) warmed up, then timed in rounds
beside the peers (Hugging Face generate, llama.cpp), the best round of each counting; a row per setting with its
speed-up over autoregressive decoding (k = 1, same mode, batch size and step mode), the greedy batch-1 rows' outputs
checked against autoregressive decoding's (and, on HumanEval prompts, run against its tests); results.json,
results.md and decode.png written."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from tokenizers import Tokenizer

from mtp.benchmarks.common import benchmark_prompts, describe_prompts, prompt_problems
from mtp.benchmarks.decode_runs import decode_prompts, output_checks
from mtp.benchmarks.decode_settings import BenchSetting, Variations, bench_settings
from mtp.benchmarks.hf_peer import HFPeer, first_divergence, peer_table, top2_margin
from mtp.benchmarks.humaneval import HumanEvalScorer, sandbox_description
from mtp.benchmarks.llama_cpp import LlamaCppPeer, llama_cpp_peers, llama_cpp_table
from mtp.benchmarks.methods import (
    BENCH_REGISTRY,
    BenchRow,
    BenchTarget,
    MethodBench,
    gamma_series,
    predicted_labels,
    row_markers,
)
from mtp.benchmarks.methods.heads import CHAIN
from mtp.benchmarks.report import (
    captured_summary,
    decode_table,
    exactness_entries,
    exactness_summary,
    plot_decode,
)
from mtp.benchmarks.results_page import provenance
from mtp.benchmarks.threads import described, pin_threads
from mtp.benchmarks.vllm_peer import VllmPeer, vllm_table
from mtp.checkpoint.load import LoadedCheckpoint, load_checkpoint, model_chat
from mtp.data.prompts import HumanEvalProblem
from mtp.decode import DecodeStats
from mtp.decode.loop import generate
from mtp.decode.plan import Drafting, Plan
from mtp.decode.settings import GenerationConfig, StepSettings
from mtp.interop import mimo
from mtp.interop.chat import ChatTemplate, ModelChat
from mtp.interop.engines import carries


@dataclass
class DecodeBenchSettings:
    """Everything a decoding benchmark is asked, checked before anything is loaded: bench_decode's flags, or a training
    run's ``bench_decode`` node, as the command reads them (:func:`mtp.commands.bench_decode.settings_of`)."""

    checkpoint: Path
    out: Path
    """Where results.json, results.md and decode.png are written (llama.cpp's files in its llama_cpp/)."""
    heads: list[int] | None
    """The chain's k values (None: 1..n; k = 1 always runs, the speed-ups' baseline)."""
    batch_sizes: list[int]
    modes: list[str]
    """greedy and/or sampling."""
    methods: list[str]
    """The --methods entries, the heads' chain first."""
    sampling: GenerationConfig
    """The sampling mode's settings (the greedy mode's are the same at temperature 0)."""
    step: StepSettings
    gamma: int
    """Drafts per step of the drafting methods' rows."""
    sequences: list[int]
    """SpecTr's draft sequences per step, a row each."""
    method_settings: dict[str, object]
    """Each registered method's settings by name (the heads': their adaptive cut, their trees' sibling draws)."""
    method_sweeps: dict[str, object]
    """Each registered method's sweep by name (None: it sweeps nothing)."""
    variations: Variations
    prompt_set: str
    prompts: int
    prompt_tokens: int
    prompt_format: str
    """chat or raw (made definite before anything is loaded)."""
    fixed_length: bool
    """In the chat format, every prompt decoded to max_new_tokens past the model's end of turn."""
    device: str
    """cpu or cuda."""
    dtype: str
    threads: int
    """CPU threads pinned to as many CPUs (:func:`mtp.benchmarks.threads.pin_threads`; 0: PyTorch's own, unpinned)."""
    repeats: int
    """Rounds over all settings; the best round counts."""
    hf: bool
    hf_static: bool | None
    """Also HF's static cache (None: on CUDA)."""
    llama_cpp: Path | None
    """The folder of llama.cpp's tools (None: no llama.cpp)."""
    llama_cpp_target: Path | None
    """The target GGUF llama.cpp decodes as it is (None: the checkpoint's own weights, at each of llama_cpp_types)."""
    llama_cpp_types: list[str]
    """The GGUF types of the checkpoint's own weights llama.cpp decodes, a target each
    (:data:`~mtp.benchmarks.llama_cpp.GGUF_TYPES`)."""
    vllm: Path | None
    """The python of vLLM's own environment (tools/vllm_cpu.sh), checked to import vLLM (None: no vLLM)."""
    sandbox: str
    """Where HumanEval's tests run: jail, or guards."""
    argv: list[str] | None = None
    """The command line a results page is headed by (None: this process's own arguments)."""

    @property
    def max_new_tokens(self) -> int:
        return self.sampling.max_new_tokens

    @property
    def compile(self) -> bool:
        return self.step.compile


@dataclass
class RowLabels:
    """What the benchmark says and shows of the methods' rows, by the rows' labels."""

    predicted: set[str] = field(default_factory=predicted_labels)
    """Labels whose rows carry Leviathan et al.'s predicted speed-up (a draft model's: the methods say which)."""
    markers: dict[str, str] = field(default_factory=row_markers)
    """The plot's matplotlib marker of each label (the methods' benchmark parts say them)."""
    series: dict[str, str] = field(default_factory=gamma_series)
    """Labels drawn as lines over gamma in the plot, with their legend text."""


@dataclass
class Timing:
    """A setting's measurements over the warm-up and the rounds."""

    best: DecodeStats | None = None
    """Its best round's statistics."""
    outputs: list[list[int]] | None = None
    """Its best round's tokens, kept where they are checked (greedy, batch 1)."""
    captures: int = 0
    """Step shapes captured as CUDA graphs over every round and the warm-up."""
    capture_s: float = 0.0
    """The seconds those captures took."""


def end_of_turn_id(tokenizer: Tokenizer, chat: ModelChat, stops: bool) -> int | None:
    """The token a reply stops at where replies ``stops`` (in the chat format, unless --fixed-length): the model's end
    of turn, which its chat settings declare; None (every prompt decoded to --max-new-tokens) otherwise."""
    if not stops or not chat.eos_token:
        return None
    return tokenizer.token_to_id(chat.eos_token)


def length_words(max_new_tokens: int, stops: bool) -> str:
    """``128 new tokens each``, or ``up to 128 new tokens each (a reply ends at its end of turn)``."""
    if stops:
        return f"up to {max_new_tokens} new tokens each (a reply ends at its end of turn)"
    return f"{max_new_tokens} new tokens each"


@dataclass
class DecodeBench:
    """One decoding benchmark: a loaded checkpoint, its prompts (their ``names``; HumanEval's ``problems``, or None
    for held-out prompts), the k of the chain's rows (``heads``; llama.cpp's EAGLE-3 draft runs at the same) and
    where a reply stops (``end_of_turn``; None: at max_new_tokens)."""

    options: DecodeBenchSettings
    loaded: LoadedCheckpoint
    prompts: list[list[int]]
    names: list[str]
    problems: list[HumanEvalProblem] | None
    heads: list[int]
    end_of_turn: int | None

    def run(self, settings: list[BenchSetting], labels: RowLabels) -> None:
        """Time ``settings`` beside the peers the options ask for; write results.json, results.md and decode.png."""
        options, model, prompts = self.options, self.loaded.model, self.prompts
        timings = warm_up(model, prompts, settings)
        hf, cpp = self.peers()
        time_rounds(model, prompts, settings, timings, options.repeats, [*([hf] if hf is not None else []), *cpp])
        rows = result_rows(settings, timings, labels.predicted)
        scorer = None
        if self.problems is not None:
            scorer = HumanEvalScorer(
                self.loaded.tokenizer, self.problems, prompts, options.sandbox, options.prompt_format
            )
        reference = check_outputs(model, prompts, settings, timings, rows, scorer)
        hf_results = hf.compare(rows, reference, scorer) if hf is not None else None
        cpp_results = None
        if cpp:  # mtp autoregressive decoding's replies as text, as llama.cpp prints its own
            replies = [(self.loaded.tokenizer.decode(out, skip_special_tokens=True), len(out)) for out in reference]
            cpp_results = [peer.compare(replies) for peer in cpp]
        vllm_results = self.vllm().compare(reference) if options.vllm is not None else None
        if scorer is not None:
            print(
                f"HumanEval: ran the tests of {len(scorer.evaluations)} distinct output set(s) of {len(prompts)} "
                "problems"
            )
        self.write(rows, hf_results, cpp_results, reference, scorer, labels, vllm_results)

    def vllm(self) -> VllmPeer:
        """vLLM (--vllm) on the same prompts and threads: plain, and the checkpoint's draft heads where vLLM runs them
        (EAGLE-3, Medusa at the chain's k; causal heads as MiMo's MTP layer at k=2)."""
        config = self.loaded.config
        method = next((layout for layout in ("eagle3", "medusa") if carries(config, layout)), None)
        if method is None and not mimo.refusal(config):
            method = "mimo"
        return VllmPeer(
            self.options.vllm, self.options.checkpoint, method, self.heads, self.prompts,
            self.options.max_new_tokens, self.end_of_turn, self.options.out / "vllm", torch.get_num_threads(),
        )  # fmt: skip

    def peers(self) -> tuple[HFPeer | None, list[LlamaCppPeer]]:
        """Hugging Face generate (--hf) and llama.cpp (--llama-cpp, a peer per target) on the same prompts, warmed up;
        None and none where not asked for."""
        options, loaded = self.options, self.loaded
        on_cuda = next(loaded.model.parameters()).device.type == "cuda"
        static = options.hf_static if options.hf_static is not None else on_cuda
        hf = None
        if options.hf:
            hf = HFPeer(loaded.model, self.prompts, options.max_new_tokens, static, self.end_of_turn)
        cpp = []
        if options.llama_cpp:
            cpp = llama_cpp_peers(
                options.llama_cpp,
                options.llama_cpp_target,
                options.llama_cpp_types,
                options.checkpoint,
                loaded,
                self.prompts,
                self.heads,
                options.max_new_tokens,
                options.out / "llama_cpp",
            )
        return hf, cpp

    def setup(self, device_name: str, scored: bool) -> dict:
        """results.json's setup: the checkpoint, machine, prompts and decoding settings (``scored``: pass@1 was run,
        and the sandbox it ran in is named)."""
        options, model, tokenizer = self.options, self.loaded.model, self.loaded.tokenizer
        held_out = self.problems is None
        setup = {
            "checkpoint": str(options.checkpoint),
            "device": device_name,
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "compile": options.compile,
            "repeats": options.repeats,
            "n_future": self.loaded.config.n_future,
            "parameters": sum(p.numel() for p in model.parameters()),
            "prompts": len(self.prompts),
            "prompt_set": options.prompt_set,
            "prompt_format": options.prompt_format if not held_out else None,
            "prompt_tokens": options.prompt_tokens if held_out else None,
            "prompt_lengths": [len(prompt) for prompt in self.prompts],
            "max_new_tokens": options.max_new_tokens,
            "stops_at": tokenizer.id_to_token(self.end_of_turn) if self.end_of_turn is not None else None,
            "sampling": {"temperature": options.sampling.temperature, "top_p": options.sampling.top_p},
        }
        if scored:
            setup["pass_at_1_sandbox"] = sandbox_description(options.sandbox)
        return setup

    def title(self, setup: dict) -> str:
        """The results' heading: the checkpoint, machine, prompts, reply lengths and rounds."""
        options = self.options
        prompt_set = describe_prompts(
            self.prompts, self.names, self.problems, options.prompt_tokens, options.prompt_format
        )
        return (
            f"Decoding {options.checkpoint.name} (n={setup['n_future']}, {setup['dtype']}"
            f"{', compiled' if options.compile else ''}) on {setup['device']}: {prompt_set}, "
            f"{length_words(options.max_new_tokens, self.end_of_turn is not None)}, best of {options.repeats} rounds"
        )

    def write(
        self,
        rows: list[dict],
        hf: dict | None,
        cpp: list[dict] | None,
        reference: list[list[int]] | None,
        scorer: HumanEvalScorer | None,
        labels: RowLabels,
        vllm: dict | None = None,
    ) -> None:
        """results.json, results.md and decode.png in --out, and the tables printed."""
        out, on_cuda = self.options.out, next(self.loaded.model.parameters()).device.type == "cuda"
        device_name = torch.cuda.get_device_name() if on_cuda else f"CPU ({described()})"
        setup = self.setup(device_name, scorer is not None and bool(scorer.evaluations))
        title = self.title(setup)
        run_provenance = provenance(self.options.argv, torch.cuda.get_device_name() if on_cuda else None)
        results = {"provenance": run_provenance, "setup": setup, "results": rows, "hf": hf, "llama_cpp": cpp,
                   "vllm": vllm}  # fmt: skip
        if self.problems is not None and reference is not None:  # what the exact methods complete, for the outcomes
            results["humaneval_completions"] = {
                name: scorer.completion(prompt, output)
                for name, prompt, output in zip(self.names, self.prompts, reference, strict=True)
            }
        (out / "results.json").write_text(json.dumps(results, indent=2))
        table = decode_table(rows) + (f"\n\n{peer_table(hf)}" if hf else "")
        chain1 = [  # the chain's greedy batch-1 rows at every precision: llama.cpp's targets are set at theirs
            r
            for r in rows
            if (r["mode"], r["batch_size"], r["method"], r["draft_dtype"]) == ("greedy", 1, CHAIN, "auto")
        ]
        greedy1 = [r for r in chain1 if r["quantize"] == "none"]
        if cpp is not None:
            table += f"\n\n{llama_cpp_table(cpp, chain1)}"
        if vllm is not None:
            table += f"\n\n{vllm_table(vllm, greedy1)}"
        if any(r["cuda_graphs"] for r in rows):
            table += f"\n\n{captured_summary(rows)}"
        if reference is not None:
            table += f"\n\n{exactness_summary(exactness_entries(rows, hf))}"
        (out / "results.md").write_text(f"{title}\n\n{table}\n")
        plot_decode(rows, out / "decode.png", title, labels.markers, labels.series)
        print(f"\n{title}\n\n{table}\n\nwrote {out}/results.json, results.md, decode.png")


def warm_up(model, prompts: list[list[int]], settings: list[BenchSetting]) -> list[Timing]:
    """Every setting's step shapes warmed up (and compiled): a captured setting decodes every prompt in full, so that
    the steps of every shape the rounds meet are captured here; an eager or compiled one 4 tokens of its first batch
    (the compiled settings' time said on stderr: what compiling took, outside every timed round)."""
    timings, started = [], time.perf_counter()
    for setting in settings:
        timing = Timing()
        if setting.plan.step.cuda_graphs:
            stats = decode_prompts(model, prompts, setting.plan, setting.batch_size)[1]
            timing.captures, timing.capture_s = stats.captures, stats.capture_s
        else:
            generate(model, prompts[: setting.batch_size], setting.plan.changed(max_new_tokens=4))
        timings.append(timing)
    if any(setting.plan.step.compile for setting in settings):
        print(f"compiled the settings' decoding steps in {time.perf_counter() - started:.1f} s (their warm-up, before "
              "the timed rounds; --no-compile decodes eagerly)", file=sys.stderr, flush=True)  # fmt: skip
    return timings


def time_rounds(
    model,
    prompts: list[list[int]],
    settings: list[BenchSetting],
    timings: list[Timing],
    repeats: int,
    peers: list[HFPeer | LlamaCppPeer],
) -> None:
    """``repeats`` rounds, each over every setting and then every peer (rounds interleave the settings, so that a slow
    spell hits all of them), each round's line printed; every setting's best round into its timing."""
    for round_ in range(repeats):
        for setting, timing in zip(settings, timings, strict=True):
            plan = setting.plan
            decoded, stats = decode_prompts(model, prompts, plan, setting.batch_size)
            timing.captures, timing.capture_s = timing.captures + stats.captures, timing.capture_s + stats.capture_s
            if timing.best is None or stats.decoding_s < timing.best.decoding_s:
                timing.best = stats
                if setting.checked:
                    timing.outputs = decoded
            print(
                f"round {round_ + 1} {setting.mode:>8} batch={setting.batch_size} {setting.method} "
                f"k={plan.heads.heads}: {stats.line()}",
                flush=True,
            )
        for peer in peers:  # the peers in the same rounds
            peer.run_round()


def result_rows(settings: list[BenchSetting], timings: list[Timing], predicted: set[str]) -> list[dict]:
    """A row per setting (:func:`result_row`) with its speed-up and forward cost against k = 1 of the same mode, batch
    size, step mode and precision; Leviathan et al.'s predicted speed-up on the rows labelled in ``predicted``; an int8
    drafts row's draft time per step against its float twin's."""
    rows = [result_row(s, t.best, t.captures, t.capture_s) for s, t in zip(settings, timings, strict=True)]
    for setting, row in zip(settings, rows, strict=True):
        baseline = next(
            r
            for r in rows
            if (r["mode"], r["batch_size"], r["heads"], r["method"], r["cuda_graphs"], r["quantize"])
            == (row["mode"], row["batch_size"], 1, CHAIN, row["cuda_graphs"], row["quantize"])
        )
        row["speedup"] = row["tokens_per_s"] / baseline["tokens_per_s"]
        row["forward_cost"] = row["ms_per_forward"] / baseline["ms_per_forward"]
        if row["method"] in predicted:
            row["predicted_speedup"] = predicted_speedup(row, baseline)
        if row["draft_dtype"] != "auto":  # the draft side's time per step against the same setting's in float
            float_row = rows[settings.index(setting.twin(draft_dtype="auto"))]
            row["draft_time_vs_auto"] = row["draft_ms_per_step"] / float_row["draft_ms_per_step"]
    return rows


def check_outputs(
    model,
    prompts: list[list[int]],
    settings: list[BenchSetting],
    timings: list[Timing],
    rows: list[dict],
    scorer: HumanEvalScorer | None,
) -> list[list[int]] | None:
    """Every greedy batch-1 row's outputs checked against mtp autoregressive decoding's at the same precision
    (identical prompts, and pass@1 with a ``scorer``), where each parts from them with how near the tie was there, a
    quantized row's also against autoregressive decoding's with the model's own weights (``identical_to_float``:
    measured, never assumed), and a captured row's against its eager twin's; autoregressive decoding's outputs with
    the model's own weights returned (None: no greedy batch-1 row)."""
    checked = [i for i, setting in enumerate(settings) if setting.checked]
    if not checked:
        return None

    def autoregressive(quantize: str) -> list[list[int]]:
        return next(
            timings[i].outputs
            for i in checked
            if (settings[i].method, settings[i].plan.heads.heads, settings[i].plan.step.quantize)
            == (CHAIN, 1, quantize)
        )

    float_reference = autoregressive("none")
    for i in checked:
        outputs, quantize = timings[i].outputs, settings[i].plan.step.quantize
        reference = autoregressive(quantize)
        rows[i].update(output_checks(outputs, reference, scorer))
        if quantize != "none":
            rows[i]["identical_to_float"] = sum(a == b for a, b in zip(outputs, float_reference, strict=True))
        rows[i]["parted"] = [  # where its tokens leave autoregressive decoding's, and how near the tie was there
            {"prompt": p, "token": j, "top2_margin": top2_margin(model, prompts[p], reference[p][:j])}
            for p, j in first_divergence(outputs, reference)
        ]
        if settings[i].plan.step.cuda_graphs:  # captured steps against the same setting's eager ones, token for token
            eager = timings[settings.index(settings[i].twin(cuda_graphs=False))].outputs
            rows[i]["identical_to_eager"] = sum(a == b for a, b in zip(outputs, eager, strict=True))
    return float_reference


def predicted_speedup(row: dict, baseline: dict) -> float:
    """Leviathan et al.'s expected speed-up (1 - a^(g+1)) / ((1 - a)(g c + 1)): a, the drafts' acceptance rate
    (accepted over verified drafts, all positions), c, a draft forward's time over an autoregressive step's."""
    a, g = min(row["acceptance_rate"], 1 - 1e-9), row["gamma"]
    c = row["draft_ms_per_forward"] / baseline["ms_per_forward"]
    return (1 - a ** (g + 1)) / ((1 - a) * (g * c + 1))


def result_row(setting: BenchSetting, stats: DecodeStats, captures=0, capture_s=0.0) -> dict:
    """A setting's row from its best round's statistics; ``captures`` and ``capture_s``: the step shapes captured as
    CUDA graphs over every round (and its warm-up), and the seconds that took (outside the best round, mostly)."""
    plan, drafter = setting.plan, setting.plan.drafter
    heads, drafts = plan.heads, plan.drafts
    return {
        "mode": setting.mode,
        "batch_size": setting.batch_size,
        "method": setting.method,
        "tree_nodes": stats.tree_nodes,
        "heads": heads.heads,
        "tokens": stats.tokens,
        "forwards": stats.forwards,
        "tokens_per_forward": stats.tokens_per_forward,
        "acceptance": stats.acceptance,
        "tokens_per_s": stats.tokens_per_s,
        "ms_per_forward": stats.ms_per_forward,
        "wall_time_s": stats.wall_time_s,
        "gamma": drafter.gamma if drafter is not None else 0,
        "sequences": drafts.drafts_per_step,
        "lossy": plan.sampling.typical,  # typical acceptance: not the target's distribution
        "drafter": stats.method_params,
        "draft_dtype": drafts.draft_dtype,
        "draft_choice": drafts.draft_choice,
        "draft_first_ids": heads.draft_first_ids,
        "draft_share": stats.draft_share,
        "draft_ms_per_step": 1000 * stats.draft_s / stats.forwards,
        "draft_ms_per_forward": 1000 * stats.draft_s / stats.draft_forwards if stats.draft_forwards else 0.0,
        "acceptance_rate": sum(stats.accepted) / sum(stats.drafted) if sum(stats.drafted) else 0.0,
        "cuda_graphs": plan.step.cuda_graphs,
        "quantize": plan.step.quantize,
        "captures": captures,
        "capture_s": capture_s,
    }


def run_decode_bench(settings: DecodeBenchSettings) -> None:
    """The benchmark ``settings`` ask for, on the checkpoint: every setting (:func:`bench_settings`: the heads' chain
    at each k, the methods' rows, their twins) timed beside the peers; results.json, results.md and decode.png in
    ``settings.out``. A setting a model cannot decode (more heads than it has, prompts beyond its context) is a
    :class:`~mtp.errors.SettingError` before any decoding; the command renders it under its flags."""
    device = torch.device(settings.device)
    pin_threads(settings.threads)
    settings.out.mkdir(parents=True, exist_ok=True)  # an unwritable out fails before the benchmark runs
    loaded = load_checkpoint(settings.checkpoint, device, settings.dtype)
    heads = sorted({1, *(settings.heads or range(1, loaded.config.n_future + 1))})  # 1: the speed-ups' baseline
    problems = prompt_problems(settings.prompt_set, settings.prompts)
    chat, model_settings = None, model_chat(settings.checkpoint, loaded.tokenizer)
    if settings.prompt_format == "chat":  # the model's own template (resolve_prompt_format saw that it declares one)
        chat = ChatTemplate(model_settings, settings.checkpoint)
    prompts, names = benchmark_prompts(loaded, problems, settings.prompts, settings.prompt_tokens, chat)
    stops = settings.prompt_format == "chat" and not settings.fixed_length  # a reply ends at the model's end of turn
    end_of_turn = end_of_turn_id(loaded.tokenizer, model_settings, stops)
    chain_heads = replace(settings.method_settings["heads"], heads=max(heads), draft_p_min=0.0)
    chain = Plan(replace(settings.sampling, eos_id=end_of_turn), chain_heads, step=settings.step)
    methods = benchmarked(settings)
    # the heads and every drafter's widest steps fit, before trees fit or searches run: the plans' checks, widest first
    drafters = [method for method in methods if method.method.selected_by is not None]
    drafting = sorted((Drafting(m.decoding, m.most_drafts(settings.gamma)) for m in drafters), key=lambda d: -d.gamma)
    for plan in [chain, *(Plan(chain.sampling, drafter=spec, step=chain.step) for spec in drafting)]:
        plan.check(loaded.config, prompts)
    settings.variations.check_for(loaded.config, device, next(loaded.model.parameters()).dtype)

    def method_rows(mode_chain: Plan, mode: str) -> list[BenchRow]:
        """The rows of the methods other than the chain, at its largest k, for one mode: the heads' variants' (their
        trees fitted or read once a mode; a fit's summary on stdout), then the drafters' (at the gamma asked for)."""
        rows = []
        for method in methods:
            shown = {"log": print} if method.method.selected_by is None else {}  # fits on stdout, searches on stderr
            target = BenchTarget.of(
                loaded, mode_chain, device, gamma=settings.gamma, sequences=settings.sequences, dtype=settings.dtype,
                **shown,
            )  # fmt: skip
            rows += method.rows(target, mode, settings.methods)
        return rows

    rows = bench_settings(settings.modes, settings.batch_sizes, heads, chain, method_rows, settings.variations)
    DecodeBench(settings, loaded, prompts, names, problems, heads, end_of_turn).run(rows, RowLabels())


def benchmarked(settings: DecodeBenchSettings) -> list[MethodBench]:
    """The benchmark parts of the methods of ``settings.methods``, each built from its settings and sweep (the heads'
    whenever a variant of theirs is asked for)."""
    chosen = [cls for cls in BENCH_REGISTRY.values() if (set(cls.names()) - {CHAIN}) & set(settings.methods)]
    return [cls(settings.method_settings[cls.name], settings.method_sweeps.get(cls.name)) for cls in chosen]
