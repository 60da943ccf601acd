"""Score a checkpoint on what it was trained on (python scripts/eval_task.py, or mtp eval-task).

    python scripts/eval_task.py CKPT                        # every operation count, 1-10, the whole sets
    python scripts/eval_task.py CKPT --ops 1-5 --problems 200 --heads 2 --out results/poly_mtp2
    python scripts/eval_task.py CKPT --prompts 32 --out results/stdlib_mtp4   # a model of the default corpus

The evaluation follows the data source the checkpoint records. A synthetic task (polynomial: experiment=
paper_polynomial; induction: experiment=paper_induction) is scored by its metric (mtp/training/task_scores.py):
polynomial problems decoded greedily (--heads k > 1: self-speculatively with the model's heads, the same output) and
scored by exact match per operation count, induction stories read teacher-forced; each row with a Wilson 95%
interval. A model of a text corpus (the default stdlib corpus, files, a hub dataset) is scored by head 1's loss on
the validation split of its own data (nats per token, bits per byte) and by greedy self-speculative decoding of held-out
prompts with its heads (tokens per forward, acceptance). A checkpoint whose training recorded a task curve
(callbacks=task_curve) carries it into the results. Writes results.json and results.md into --out.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NoReturn

from mtp.benchmarks.results_page import provenance
from mtp.benchmarks.task_eval import CorpusSettings, evaluate, results_table
from mtp.checkpoint.load import load_checkpoint
from mtp.commands.cli import (
    Placement,
    pick_device,
    require_at_least,
    run_script,
    settings_named_by_flags,
)
from mtp.commands.schema import Part, add_parts, node_values
from mtp.errors import settings_named_by_keys
from mtp.files import write_whole
from mtp.model import MTPModel
from mtp.training.task_scores import TaskSettings, parse_ops


@dataclass
class EvalTaskFlags:
    """What the command is asked: its flags, and the keys of a training run's ``eval_task`` node (one schema,
    :mod:`mtp.commands.schema`); :func:`settings_of` makes the library's settings of them."""

    checkpoint: str = field(metadata={"positional": True})
    """A checkpoint written by scripts/pretrain.py (its last.ckpt)."""
    ops: str = "1-10"
    """polynomial: the operation counts, e.g. 1-10 or 1-5,8."""
    problems: int | None = None
    """A task: problems per count, or stories; default: the whole set."""
    heads: int | None = None
    """Heads that decode: 1 autoregressive, k > 1 heads 2..k draft (the same output); default: 1 for a task, every head
    for a corpus model (the default)."""
    batch_size: int = 64
    """Problems, windows or prompts together."""
    windows: int | None = None
    """A corpus model: validation windows scored; default: all."""
    prompts: int = 16
    """A corpus model: held-out prompts decoded."""
    prompt_tokens: int = 64
    """A corpus model: tokens of each prompt."""
    new_tokens: int = 128
    """A corpus model: tokens decoded per prompt."""
    out: Path = Path("results/eval_task")
    """The folder of results.json and results.md."""


SCHEMA = (Part(EvalTaskFlags), Part(Placement, ("device",)))
"""The command's flags, and its node's keys in a training config."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_parts(parser, SCHEMA)
    return parser


@dataclass
class Evaluation:
    """A checkpoint's evaluation as this command runs it: the library's settings of a task and of a corpus model
    (whichever the checkpoint's data calls for), where the results go and on which device."""

    checkpoint: str
    task: TaskSettings
    corpus: CorpusSettings
    out: Path
    device: str
    """auto, cpu or cuda."""
    argv: list[str] | None = None
    """The command results.json is headed by (None: this process's own arguments)."""
    node: str | None = None
    """The training config's node that asked for it (None: the command line): a setting's error names its key there
    (``eval_task.problems=5000``), or else its flag (``--problems 5000``)."""


def settings_named_where(node: str | None) -> AbstractContextManager[None]:
    """The library's errors naming a setting by field, spelled as ``node``'s keys of a training config, or as the
    flags."""
    return settings_named_by_flags() if node is None else settings_named_by_keys(node)


def settings_of(values: Mapping[str, Any], argv: list[str] | None = None, node: str | None = None) -> Evaluation:
    """The evaluation of the flags' values by name (the parsed flags, or a training run's ``eval_task`` node over
    their defaults), checked before any checkpoint is loaded (a training run that scores itself at its end learns of a
    bad setting before it trains)."""
    args = SimpleNamespace(**values)
    at_least_1 = ("problems", "heads", "batch_size", "windows", "prompts", "prompt_tokens", "new_tokens")
    require_at_least(args, 1, *at_least_1, node=node)
    ops = ",".join(map(str, args.ops)) if isinstance(args.ops, list | tuple) else str(args.ops)  # a config's [1, 6]
    with settings_named_where(node):
        task = TaskSettings(parse_ops(ops), args.problems, args.heads or 1, args.batch_size)
    corpus = CorpusSettings(
        args.windows, args.prompts, args.prompt_tokens, args.new_tokens, args.heads, args.batch_size
    )
    pick_device(args.device, node)
    return Evaluation(str(args.checkpoint), task, corpus, Path(args.out), args.device, argv, node)


def checked_args(argv: list[str] | None = None) -> Evaluation:
    """The evaluation of a command line (:func:`settings_of`)."""
    return settings_of(vars(build_parser().parse_args(argv)), argv)


def settings_of_config(checkpoint: str, node: Mapping[str, Any]) -> Evaluation:
    """The evaluation a training run's ``eval_task`` node asks for (keys: the flags' names) of the checkpoint it will
    write, every flag it leaves out at its default."""
    return settings_of(node_values(SCHEMA, node, "eval_task", checkpoint=checkpoint), node="eval_task")


def main(argv: list[str] | None = None) -> None:
    run(checked_args(argv))


def run(evaluation: Evaluation) -> dict[str, Any]:
    """Score the checkpoint of ``evaluation``: results.json and results.md in its out folder (each written whole or not
    at all: a finished sweep job is one whose results.json exists). Returns the results."""
    loaded = load_checkpoint(evaluation.checkpoint, pick_device(evaluation.device), "float32")
    with settings_named_where(evaluation.node):  # the decoder's checks (e.g. more heads than trained) name --heads
        scored = evaluate(loaded, evaluation.task, evaluation.corpus)
    parameters = sum(p.numel() for p in loaded.model.parameters())
    results = {"provenance": provenance(evaluation.argv), "task": scored.pop("task"),
               "checkpoint": str(evaluation.checkpoint), "step": loaded.global_step,
               "n_future": loaded.config.n_future, "parameters": parameters,
               "non_embedding_parameters": parameters - embedding_parameters(loaded.model), **scored}  # fmt: skip
    if loaded.tokens_per_step:
        results["tokens"] = loaded.global_step * loaded.tokens_per_step
    if loaded.train_seconds is not None:
        results["train_seconds"] = loaded.train_seconds
        results["train_threads"] = loaded.train_threads
    if loaded.curve:
        results["curve"] = loaded.curve
    evaluation.out.mkdir(parents=True, exist_ok=True)
    task = results["task"]
    title = f"{task}: {Path(evaluation.checkpoint).name}, step {loaded.global_step}, n_future {loaded.config.n_future}"
    markdown = f"# {title}\n\n{results_table(results)}"
    write_whole(evaluation.out / "results.md", lambda f: f.write(markdown.encode()))
    text = json.dumps(results, indent=2) + "\n"
    write_whole(evaluation.out / "results.json", lambda f: f.write(text.encode()))  # last: it marks the run finished
    print(results_table(results), end="")
    print(f"wrote {evaluation.out / 'results.json'}")
    return results


def embedding_parameters(model: MTPModel) -> int:
    """The parameters of the input embedding and of the unembeddings (the paper's sizes count neither)."""
    return sum(p.numel() for part in (model.tok_embeddings, model.heads.outputs) for p in part.parameters())


def entry_point() -> NoReturn:
    """scripts/eval_task.py."""
    run_script(main)
