"""llama.cpp beside mtp on a CPU: its tools, built from the source PyPI's llama-cpp-python sdist vendors, decoding a
prompt plainly, with an EAGLE-3 draft (``--spec-type draft-eagle3``) or with its n-gram lookup.

PyPI is the one way to llama.cpp on machines that reach only package registries: ``llama-cpp-python``'s sdist
carries llama.cpp's whole tree (its ``convert_hf_to_gguf.py`` and ``gguf-py`` too). :meth:`LlamaCpp.at` downloads it
into a cache folder and builds the tools there once (cmake, Release, native CPU flags; the version and flags recorded
in ``build.json``); later calls find them. :meth:`LlamaCpp.convert` converts a Hugging Face directory (a target, or an
EAGLE-3 draft against its target) with that tree's converter, :meth:`LlamaCpp.quantize` quantizes a GGUF file with its
``llama-quantize``. :meth:`LlamaCpp.decode` runs one prompt greedily: ``llama-completion`` plainly,
``llama-speculative-simple`` with a draft or lookup, and reads what they print (the reply; the decoding's tokens and
seconds, the prompt's excluded; drafted and accepted tokens). :func:`llama_cpp_peers` readies the decoding benchmark's
:class:`LlamaCppPeer` of each target: the checkpoint's own weights as a GGUF file of each type asked for (or the file
given), each with the checkpoint's EAGLE-3 draft as a GGUF file; :func:`llama_cpp_table` sets their rows beside mtp's
at the same precision.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import torch

from mtp.checkpoint.load import LoadedCheckpoint, read_foreign_config
from mtp.errors import UserError
from mtp.interop.engines import carries
from mtp.pretrained.export import export_draft, export_hf

LLAMA_CPP_PYTHON = "0.3.36"
"""The llama-cpp-python release whose vendored llama.cpp is built (it has the eagle3 architecture)."""
TOOLS = ("llama-completion", "llama-speculative-simple", "llama-quantize")
END_OF_TEXT = " [end of text]"
"""What llama-completion prints after a reply that ended at the model's end of generation."""
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
)  # fmt: skip
CONTEXT = 2048
"""Positions each run holds: a benchmark prompt and its reply."""
GGUF_TYPES = ("f32", "q8_0", "q4_0")
"""The GGUF types of the checkpoint's own weights llama.cpp decodes beside mtp (--llama-cpp-types), in the tables'
order: f32 and q8_0 written by llama.cpp's converter, q4_0 by its llama-quantize from the f32 file."""
QUANTIZED_FROM_F32 = {"q4_0": "Q4_0"}
"""The types llama-quantize makes from the float32 GGUF (the converter writes no 4-bit type), by its name of each."""
FILE = "file"
"""The type of a target given as a file (--llama-cpp-target), decoded as it is: its precision is the file's."""
SAME_PRECISION = {"none": "f32", "int8": "q8_0", "int4": "q4_0"}
"""mtp's --quantize setting -> llama.cpp's target of the same precision (weight-only int8 beside Q8_0's 8-bit blocks,
4-bit groups of 32 beside Q4_0's 4-bit blocks of 32)."""


@dataclass
class LlamaCppRun:
    text: str
    """The reply, as the tool printed it."""
    tokens: int
    seconds: float
    """Decoding time, the prompt's processing excluded (as the tool measures it)."""
    drafted: int = 0
    accepted: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def same_reply(a: tuple[str, int], b: tuple[str, int], budget: int) -> bool:
    """Whether two greedy replies, each (text, tokens), are the same decoding: the same text (trailing whitespace
    aside: the tools print a reply's end differently), or, where both ran to the token ``budget``, one the other's
    start (a speculative step may pass the budget by the drafts it accepts at once; a cut reply ends mid-word). A
    reply that ended before the budget must be the other's whole text."""
    (x, x_tokens), (y, y_tokens) = a, b
    x, y = x.rstrip(), y.rstrip()
    if x == y:
        return True
    return min(x_tokens, y_tokens) >= budget and (x.startswith(y) or y.startswith(x))


@dataclass
class LlamaCpp:
    bin: Path
    source: Path
    version: str

    @classmethod
    def at(cls, cache: Path) -> LlamaCpp:
        """The tools in ``cache``, downloaded and built there the first time (a long build); a failed step
        is one sentence naming its log."""
        cache = Path(cache).expanduser()
        source = cache / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
        tools = cache / "build" / "bin"
        if not all((tools / tool).is_file() for tool in TOOLS):
            cache.mkdir(parents=True, exist_ok=True)
            if not source.is_dir():
                _step(
                    [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", "llama-cpp-python",
                     f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(cache)],  # its build tools as wheels
                    cache / "download.log", f"downloading llama-cpp-python {LLAMA_CPP_PYTHON}'s source from PyPI",
                )  # fmt: skip
                with tarfile.open(cache / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz") as archive:
                    archive.extractall(cache, filter="data")
            build = cache / "build"
            _step(["cmake", "-S", str(source), "-B", str(build), "-G", "Ninja", *CMAKE_FLAGS], cache / "cmake.log",
                  "configuring llama.cpp")  # fmt: skip
            jobs = str(os.cpu_count() or 1)
            _step(["cmake", "--build", str(build), "-j", jobs, "--target", *TOOLS], cache / "build.log",
                  "building llama.cpp's tools")  # fmt: skip
            record = {"llama_cpp_python": LLAMA_CPP_PYTHON, "cmake_flags": list(CMAKE_FLAGS), "tools": list(TOOLS)}
            (cache / "build.json").write_text(json.dumps(record, indent=2) + "\n")
        return cls(tools, source, LLAMA_CPP_PYTHON)

    def convert(self, model: Path, out: Path, target: Path | None = None, outtype: str = "f32") -> Path:
        """``model`` (a Hugging Face directory) as the GGUF file ``out``, with this tree's converter; an EAGLE-3 draft
        against its ``target``'s directory (its vocabulary and sizes)."""
        command = [sys.executable, str(self.source / "convert_hf_to_gguf.py"), str(model), "--outtype", outtype,
                   "--outfile", str(out)]  # fmt: skip
        if target is not None:
            command += ["--target-model-dir", str(target)]
        _step(command, out.with_suffix(".convert.log"), f"converting {model} to GGUF")
        return out

    def quantize(self, model: Path, out: Path, gguf_type: str) -> Path:
        """The GGUF file ``model`` quantized to ``gguf_type`` (llama-quantize's name of it, such as Q4_0) as the GGUF
        file ``out``, with this tree's llama-quantize."""
        _step([str(self.bin / "llama-quantize"), str(model), str(out), gguf_type], out.with_suffix(".quantize.log"),
              f"quantizing {model} to {gguf_type}")  # fmt: skip
        return out

    def decode(
        self,
        model: Path,
        prompt: str,
        max_new_tokens: int,
        threads: int,
        draft: Path | None = None,
        draft_max: int = 3,
        lookup: bool = False,
    ) -> LlamaCppRun:
        """``prompt`` (text: the chat template's special tokens are read as such) continued greedily by up to
        ``max_new_tokens`` tokens, stopping at the model's end of generation: plainly, with the EAGLE-3 ``draft``
        (``draft_max`` drafts a step) or with n-gram lookup."""
        common = ["-m", str(model), "-p", prompt, "-n", str(max_new_tokens), "--temp", "0", "-t", str(threads),
                  "-c", str(CONTEXT)]  # fmt: skip
        if draft is None and not lookup:
            result = self._run("llama-completion", [*common, "-no-cnv", "--no-display-prompt", "--no-warmup"])
            timing = re.search(r"eval time =\s*([\d.]+) ms /\s*(\d+) runs", result.stderr)
            if timing is None:
                raise UserError(f"llama-completion printed no eval time; its output ends: {result.stderr[-300:]}")
            # the first token comes from the prompt's processing: the runs decode the rest
            reply = result.stdout.rstrip().removesuffix(END_OF_TEXT)  # what it prints at the model's end of generation
            return LlamaCppRun(reply, int(timing.group(2)) + 1, float(timing.group(1)) / 1000)
        spec = (
            ["--spec-type", "draft-eagle3", "-md", str(draft)] if draft is not None else ["--spec-type", "ngram-simple"]
        )
        result = self._run("llama-speculative-simple", [*common, *spec, "--spec-draft-n-max", str(draft_max)])
        decoded = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", result.stderr)
        drafted, accepted = (re.search(rf"{name}\s*=\s*(\d+)", result.stderr) for name in ("n_drafted", "n_accept"))
        if decoded is None or drafted is None or accepted is None:
            raise UserError(f"llama-speculative-simple printed no statistics; its output ends: {result.stderr[-300:]}")
        echoed = result.stdout.removeprefix("\n\n")
        if not echoed.startswith(prompt):
            raise UserError("llama-speculative-simple echoed another prompt than it was given; its tokenizer differs")
        reply = echoed[len(prompt) :].removesuffix("\n\n")
        tokens, seconds = int(decoded.group(1)), float(decoded.group(2))
        return LlamaCppRun(reply, tokens, seconds, int(drafted.group(1)), int(accepted.group(1)))

    def _run(self, tool: str, arguments: list[str]) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [str(self.bin / tool), *arguments], capture_output=True, text=True, stdin=subprocess.DEVNULL
        )
        if result.returncode != 0:
            last = result.stderr.strip().splitlines()[-1:] or ["no output"]
            raise UserError(f"{tool} failed (exit {result.returncode}): {last[0]}")
        return result


def _step(command: list[str], log: Path, what: str) -> None:
    """Run one step of making the tools or files, its output in ``log``; a failure is one sentence naming it."""
    try:
        with log.open("w") as output:
            status = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT).returncode
    except FileNotFoundError as err:
        raise UserError(f"{what} needs {err.filename}, which is not installed; install it and run again.") from None
    if status != 0:
        raise UserError(f"{what} failed (exit {status}); see {log}.")


@dataclass
class LlamaCppMethod:
    """One way llama.cpp decodes the prompts: its runs (best round), and the replies of its last round."""

    name: str
    draft_max: int = 0
    runs: list[LlamaCppRun] | None = None

    @property
    def tokens(self) -> int:
        return sum(run.tokens for run in self.runs)

    @property
    def seconds(self) -> float:
        return sum(run.seconds for run in self.runs)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def row(self, plain: LlamaCppMethod, threads: int, budget: int) -> dict:
        """Its figures, its replies checked against plain decoding's prompt by prompt (:func:`same_reply`)."""
        drafted, accepted = sum(r.drafted for r in self.runs), sum(r.accepted for r in self.runs)
        steps = self.tokens - accepted  # a step emits its accepted drafts and one token of the target's
        return {
            "method": self.name,
            "draft_max": self.draft_max,
            "threads": threads,
            "tokens": self.tokens,
            "seconds": self.seconds,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_forward": self.tokens / steps if steps > 0 else 1.0,
            "acceptance_rate": accepted / drafted if drafted else None,
            "same_replies_as_plain": sum(
                same_reply((a.text, a.tokens), (b.text, b.tokens), budget)
                for a, b in zip(self.runs, plain.runs, strict=True)
            ),
        }


class LlamaCppPeer:
    """llama.cpp decoding the benchmark's prompts (as text, batch 1, greedy, at ``threads`` threads) with one target,
    the GGUF file ``target`` of type ``gguf_type`` (one of :data:`GGUF_TYPES`, or :data:`FILE`): plainly, with n-gram
    lookup, and with an EAGLE-3 ``draft`` GGUF at each of ``draft_max``; best of the same rounds as mtp's rows."""

    def __init__(
        self,
        tools: LlamaCpp,
        target: Path,
        prompts: list[str],
        max_new_tokens: int,
        threads: int,
        draft: Path | None = None,
        draft_max: tuple[int, ...] = (),
        gguf_type: str = FILE,
    ) -> None:
        self.tools, self.target, self.prompts, self.threads = tools, target, prompts, threads
        self.max_new_tokens, self.draft, self.gguf_type = max_new_tokens, draft, gguf_type
        self.methods = [LlamaCppMethod("plain"), LlamaCppMethod("lookup (ngram-simple)", 3)]
        self.methods += [LlamaCppMethod("EAGLE-3 draft", k) for k in draft_max if draft is not None]
        tools.decode(target, prompts[0], 4, threads)  # warm-up: the weights read into memory

    def run_round(self) -> None:
        for method in self.methods:
            runs = [
                self.tools.decode(
                    self.target,
                    prompt,
                    self.max_new_tokens,
                    self.threads,
                    draft=self.draft if method.name == "EAGLE-3 draft" else None,
                    draft_max=method.draft_max,
                    lookup=method.name.startswith("lookup"),
                )  # fmt: skip
                for prompt in self.prompts
            ]
            if method.runs is None or sum(r.seconds for r in runs) < method.seconds:
                method.runs = runs
        rates = ", ".join(f"{m.name} k={m.draft_max + 1} {m.tokens_per_s:.1f}" for m in self.methods)
        label = target_label({"type": self.gguf_type, "target": str(self.target)})
        print(f"   llama.cpp {label} ({self.threads} threads) tokens/s: {rates}", flush=True)

    def compare(self, ours: list[tuple[str, int]]) -> dict:
        """The rows, and plain decoding's replies checked against ``ours``: mtp autoregressive decoding's with the
        model's own weights, each (text without special tokens, tokens)."""
        plain = self.methods[0]
        return {
            "version": self.tools.version,
            "type": self.gguf_type,
            "target": str(self.target),
            "draft": str(self.draft) if self.draft is not None else None,
            "threads": self.threads,
            "prompts": len(self.prompts),
            "rows": [method.row(plain, self.threads, self.max_new_tokens) for method in self.methods],
            "plain_replies_equal_mtp": sum(
                same_reply((run.text, run.tokens), reply, self.max_new_tokens)
                for run, reply in zip(plain.runs, ours, strict=True)
            ),
            "replies": {
                method.name + f" k={method.draft_max + 1}": [r.text for r in method.runs] for method in self.methods
            },
        }


def target_ggufs(tools: LlamaCpp, model: Path, gguf_types: list[str], work: Path) -> dict[str, Path]:
    """The target ``model`` (a Hugging Face directory) as a GGUF file in ``work`` of each of ``gguf_types`` (of
    :data:`GGUF_TYPES`), by type in that order: f32 and q8_0 written by llama.cpp's converter, q4_0 by its
    llama-quantize from the f32 file (converted once where f32 is asked for too)."""
    made: dict[str, Path] = {}
    for gguf_type in sorted(gguf_types, key=GGUF_TYPES.index):
        out = work / f"target-{gguf_type}.gguf"
        if gguf_type in QUANTIZED_FROM_F32:
            f32 = made.get("f32") or tools.convert(model, work / "target-f32.gguf")
            made[gguf_type] = tools.quantize(f32, out, QUANTIZED_FROM_F32[gguf_type])
        else:
            made[gguf_type] = tools.convert(model, out, outtype=gguf_type)
    return made


def llama_cpp_peers(
    tools_dir: Path,
    target: Path | None,
    gguf_types: list[str],
    checkpoint: Path,
    loaded: LoadedCheckpoint,
    prompts: list[list[int]],
    heads: list[int],
    max_new_tokens: int,
    work: Path,
) -> list[LlamaCppPeer]:
    """llama.cpp (its tools in ``tools_dir``, :meth:`LlamaCpp.at`) on the benchmark's prompts (as text) at this
    process's thread count, a peer per target, each warmed up: the ``target`` GGUF as it is (--llama-cpp-target), or
    else the checkpoint's own weights as a GGUF file of each of ``gguf_types`` (:func:`target_ggufs`); every target
    with the eagle3 heads as its EAGLE-3 draft (exported and converted in float32 against the checkpoint's target,
    into ``work``) at each of ``heads`` above 1. A target of another vocabulary or width than the heads' is one
    sentence."""
    tools = LlamaCpp.at(tools_dir)
    target_hf = export_hf(checkpoint, work / "target-hf", force=True).directory
    config = loaded.config
    if target is not None:
        theirs = read_foreign_config(target)
        if (theirs.vocab_size, theirs.d_model) != (config.vocab_size, config.d_model):
            raise UserError(
                f"--llama-cpp-target {target} has a vocabulary of {theirs.vocab_size} and width {theirs.d_model}, the "
                f"checkpoint's heads {config.vocab_size} and {config.d_model}: another model; pass the GGUF the heads "
                "were trained on, or leave --llama-cpp-target out."
            )
    targets = {FILE: target} if target is not None else target_ggufs(tools, target_hf, gguf_types, work)
    draft = None
    if carries(config, "eagle3") and max(heads) > 1:
        export_draft(checkpoint, work / "draft", "eagle3", force=True)
        draft = tools.convert(work / "draft", work / "draft.gguf", target=target_hf)
    texts = [loaded.tokenizer.decode(prompt, skip_special_tokens=False) for prompt in prompts]
    draft_max, threads = tuple(k - 1 for k in heads if k > 1), torch.get_num_threads()
    return [
        LlamaCppPeer(tools, path, texts, max_new_tokens, threads, draft, draft_max, gguf_type)
        for gguf_type, path in targets.items()
    ]


def llama_cpp_results(value: list[dict] | dict) -> list[dict]:
    """results.json's ``llama_cpp``, a dict per target; an earlier run's one dict (a single target, its type not
    recorded: read as :data:`FILE`) as a list of it."""
    return [value] if isinstance(value, dict) else list(value)


def target_type(peer: dict) -> str:
    return peer.get("type", FILE)


def target_label(peer: dict) -> str:
    """What a target's rows are called by: its type as llama.cpp writes it (Q8_0), or a file's name."""
    return Path(peer["target"]).name if target_type(peer) == FILE else target_type(peer).upper()


def same_precision(peers: list[dict], quantize: str) -> dict | None:
    """The target whose plain decoding mtp's rows at ``quantize`` (its --quantize setting) are set against: llama.cpp's
    of the same precision (:data:`SAME_PRECISION`); for the model's own weights a file's, where a file is the one
    target (its precision the file's); None where neither ran."""
    found = next((peer for peer in peers if target_type(peer) == SAME_PRECISION[quantize]), None)
    if found is None and quantize == "none" and [target_type(peer) for peer in peers] == [FILE]:
        return peers[0]
    return found


def llama_cpp_table(peers: list[dict] | dict, mtp_rows: list[dict]) -> str:
    """llama.cpp's rows, each target's (results.json's ``llama_cpp``: :func:`llama_cpp_results`), beside mtp's greedy
    batch-1 rows of the same prompts, each set against llama.cpp's plain decoding at its own precision
    (:func:`same_precision`)."""
    peers = llama_cpp_results(peers)
    lines = [
        f"| greedy, batch 1, {peers[0]['threads']} threads | tokens/s | tokens/forward | acceptance | against "
        "llama.cpp plain (same precision) | same replies as llama.cpp plain |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for peer in peers:
        plain = peer["rows"][0]["tokens_per_s"]
        for row in peer["rows"]:
            acceptance = f"{row['acceptance_rate']:.2f}" if row["acceptance_rate"] is not None else ""
            k = f" (k={row['draft_max'] + 1})" if row["method"] != "plain" else ""
            lines.append(
                f"| llama.cpp {target_label(peer)} {row['method']}{k} | {row['tokens_per_s']:.1f} | "
                f"{row['tokens_per_forward']:.2f} | {acceptance} | {row['tokens_per_s'] / plain:.2f}x | "
                f"{row['same_replies_as_plain']}/{peer['prompts']} |"
            )
    for row in mtp_rows:
        quantize = row.get("quantize", "none")  # rows of runs before --quantize: the model's own weights
        precision = f"{quantize} " if quantize != "none" else ""
        name = f"mtp {precision}" + ("autoregressive" if row["heads"] == 1 else f"{row['method']} (k={row['heads']})")
        against = same_precision(peers, quantize)
        ratio = f"{row['tokens_per_s'] / against['rows'][0]['tokens_per_s']:.2f}x" if against is not None else ""
        lines.append(f"| {name} | {row['tokens_per_s']:.1f} | {row['tokens_per_forward']:.2f} | | {ratio} | |")
    lines.append("")
    for peer in peers:
        at = f"with {target_label(peer)}" if target_type(peer) == FILE else f"at {target_label(peer)}"
        lines.append(
            f"llama.cpp {peer['version']}'s plain replies {at} equal mtp autoregressive decoding's with the model's "
            f"own weights on {peer['plain_replies_equal_mtp']} of {peer['prompts']} prompts."
        )
    lines.append(
        "Another file's weights, or quantized ones, part from mtp's float replies where a near-tie falls the other way."
    )
    return "\n".join(lines)
