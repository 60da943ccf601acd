"""The synthetic tasks' metrics (Gloeckle et al. 2024, section 4), scored on a model in memory: what ``mtp eval-task``
reports for a checkpoint, and what a training run's curve (``callbacks=task_curve``,
:class:`mtp.training.callbacks.TaskCurve`) logs every N steps. Both call :data:`TASKS`, so a curve's point and the
evaluation command's score of the checkpoint written at the same step are the same numbers.

A task is a data source kind; :data:`TASKS` maps each to its scoring, ``(model, tokenizer, data, TaskSettings) ->
results``, where ``data`` is the training data's description (``MTPDataModule.description()``, as a checkpoint
records it) and the results hold ``metric``, ``group``, ``rows`` (one per group, e.g. per operation count:
``correct`` of ``problems``, their accuracy and Wilson 95% interval) and ``decoding`` (the decoder's totals, or None).

- ``polynomial`` (:mod:`mtp.data.polynomial`): each evaluation problem's prompt (``<problem>=``) decoded greedily;
  right when the reply up to its first newline is the answer (a reply without a newline is wrong). The evaluation
  sets are the data's own (its recorded evaluation seed), the ones its training never repeated.
- ``induction`` (:mod:`mtp.data.induction`): the fixed evaluation stories read teacher-forced; head 1's greedy
  accuracy on the second token of every repeated name (the paper's metric), beside the first token's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from tokenizers import Tokenizer

import mtp.data.polynomial as polynomial
from mtp.data.induction import Story, evaluation_stories, story_ids
from mtp.data.tokenizer import eot_id, prompt_ids
from mtp.decode import GenerationConfig, HeadsSettings, Plan, generate
from mtp.errors import SettingError, UserError
from mtp.model import MTPModel

Z95 = 1.959963984540054
"""The standard normal quantile of 0.975: a two-sided 95% interval."""


def wilson_interval(correct: int, total: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a proportion ``correct / total`` (``(0, 1)`` for no trials)."""
    assert 0 <= correct <= total
    if total == 0:
        return 0.0, 1.0
    p = correct / total
    denominator = 1 + z * z / total
    center = (p + z * z / (2 * total)) / denominator
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denominator
    return max(0.0, center - half), min(1.0, center + half)


def accuracy_row(correct: int, total: int, **group: Any) -> dict[str, Any]:
    low, high = wilson_interval(correct, total)
    return {**group, "problems": total, "correct": correct, "accuracy": correct / total if total else 0.0,
            "ci95": [low, high]}  # fmt: skip


def parse_ops(text: str) -> list[int]:
    """Operation counts: a count (``3``), a range (``1-10``) or a list of them (``1-5,8``), each count 1..10; a bad
    one is a :class:`~mtp.errors.SettingError` naming ``ops`` (:attr:`TaskSettings.ops`), which the evaluation
    command spells as its flag and a training run as its config's key."""
    counts: set[int] = set()
    try:
        for part in str(text).split(","):
            first, _, last = part.strip().partition("-")
            counts.update(range(int(first), int(last or first) + 1))
    except ValueError:
        raise SettingError("{ops} is not a count, a range such as 1-10 or a list such as 1-5,8.", ops=text) from None
    if not counts:
        raise SettingError("{ops} names no operation count; give a range such as 1-10.", ops=text)
    for ops in sorted(counts):
        polynomial.check_ops(ops, "ops")
    return sorted(counts)


@dataclass
class TaskSettings:
    """How a task is scored (the evaluation command's flags; a curve's settings)."""

    ops: list[int] = field(default_factory=lambda: list(range(1, polynomial.MAX_OPS + 1)))
    """polynomial: the operation counts scored."""
    problems: int | None = None
    """Problems (induction: stories) per group, the first of each evaluation set (None: the whole set)."""
    heads: int = 1
    """Heads decoding: 1 autoregressive, k > 1 self-speculative greedy (the same output)."""
    batch_size: int = 64
    """Problems decoded (or stories read) together."""


def is_right(reply: str, answer: str) -> bool:
    """Exact match: the reply's text up to its first newline is the answer, and the newline is there."""
    line, newline, _ = reply.partition("\n")
    return bool(newline) and line == answer


def score_polynomial(
    model: MTPModel, tokenizer: Tokenizer, data: dict[str, Any], settings: TaskSettings
) -> dict[str, Any]:
    source = data["source"]
    available = source.get("eval_problems", 2000)
    if settings.problems is not None and settings.problems > available:
        raise SettingError(
            f"{{problems}} is more than the {available} problems per count that training kept out of its data; use "
            f"at most {available}.",
            problems=settings.problems,
        )
    count = available if settings.problems is None else settings.problems
    plan = Plan(
        GenerationConfig(max_new_tokens=polynomial.DEGREE + 1, eos_id=eot_id(tokenizer)),
        HeadsSettings(heads=settings.heads),
    )
    training_ops = range(source.get("min_ops", 1), source.get("max_ops", 5) + 1)
    rows, forwards, tokens, seconds = [], 0, 0, 0.0
    for ops in settings.ops:
        problems = polynomial.evaluation_problems(ops, available, source.get("eval_seed", 0))[:count]
        correct, by_operator = 0, {op: [0, 0] for op in polynomial.OPERATORS}
        for start in range(0, len(problems), settings.batch_size):
            batch = problems[start : start + settings.batch_size]
            began = time.perf_counter()
            outputs, stats = generate(model, [prompt_ids(tokenizer, p.prompt) for p in batch], plan)
            seconds += time.perf_counter() - began
            forwards, tokens = forwards + stats.row_forwards, tokens + stats.tokens
            for ids, problem in zip(outputs, batch, strict=True):
                right = is_right(tokenizer.decode(ids), problem.answer)
                correct += right
                by_operator[problem.operator][0] += right
                by_operator[problem.operator][1] += 1
        row = accuracy_row(correct, len(problems), ops=ops, in_domain=ops in training_ops)
        row["operators"] = {op: {"correct": c, "problems": n} for op, (c, n) in by_operator.items()}
        rows.append(row)
    decoding = {"heads": settings.heads, "tokens": tokens, "row_forwards": forwards, "seconds": seconds,
                "tokens_per_forward": tokens / forwards if forwards else 0.0}  # fmt: skip
    return {"metric": "exact match", "group": "ops", "rows": rows, "decoding": decoding}


def name_repeat_accuracy(
    model: MTPModel, tokenizer: Tokenizer, stories: list[Story], batch_size: int = 32
) -> dict[str, Any]:
    """Head 1's teacher-forced greedy accuracy on the second piece of every repeated name in ``stories``.

    Returns a plain dict: ``accuracy``, ``correct``, ``total`` (repeated names), ``ci95`` (Wilson, [low, high]),
    ``first_piece_accuracy`` and ``first_piece_correct`` (the same at the repeated names' first pieces, which need the
    name recalled, not copied) and ``stories``."""
    if not stories:
        raise UserError("an induction evaluation needs at least 1 story, not 0.")
    device = next(model.parameters()).device
    correct = first_correct = total = 0
    for start in range(0, len(stories), batch_size):
        batch = stories[start : start + batch_size]
        rows = [story_ids(tokenizer, item) for item in batch]
        length = max(map(len, rows))
        if length > model.config.max_seq_len:
            raise UserError(
                f"an induction story of {length} tokens is longer than the model's {model.config.max_seq_len} "
                "positions; evaluate a model with a longer model.max_seq_len."
            )
        padded = torch.tensor([row + [row[0]] * (length - len(row)) for row in rows], device=device)  # (B, T)
        with torch.no_grad():
            predicted = model.next_token_logits(padded).argmax(-1).cpu()  # (B, T)
        for row, item, guesses in zip(rows, batch, predicted.tolist(), strict=True):
            for index in item.repeats:
                # row = [eot] + pieces: piece j is row[j + 1], predicted at position j
                correct += guesses[index] == row[index + 1]
                first_correct += guesses[index - 1] == row[index]
                total += 1
    if total == 0:
        raise UserError("the induction stories given hold no repeated name; evaluate on evaluation_stories().")
    low, high = wilson_interval(correct, total)
    return {
        "task": "induction",
        "accuracy": correct / total,
        "correct": correct,
        "total": total,
        "ci95": [low, high],
        "first_piece_accuracy": first_correct / total,
        "first_piece_correct": first_correct,
        "stories": len(stories),
    }


def score_induction(
    model: MTPModel, tokenizer: Tokenizer, data: dict[str, Any], settings: TaskSettings
) -> dict[str, Any]:
    """The induction task's evaluation stories (the first ``settings.problems`` of them; all by default): head 1's
    teacher-forced greedy accuracy on the second token of every repeated name, and on the first beside it."""
    stories = evaluation_stories()
    if settings.problems is not None:
        stories = stories[: settings.problems]
    scored = name_repeat_accuracy(model, tokenizer, stories, settings.batch_size)
    rows = [
        accuracy_row(scored["correct"], scored["total"], token="second", in_domain=True),
        accuracy_row(scored["first_piece_correct"], scored["total"], token="first", in_domain=True),
    ]
    return {"metric": "accuracy at a repeated name", "group": "token", "rows": rows, "decoding": None}


TASKS: dict[str, Callable[[MTPModel, Tokenizer, dict[str, Any], TaskSettings], dict[str, Any]]] = {
    "polynomial": score_polynomial,
    "induction": score_induction,
}
"""Task name (the data source kind a model trained on) -> its scoring."""


def row_metrics(results: dict[str, Any]) -> dict[str, float]:
    """Each row's accuracy under a name of its group and value (``task/ops_3``, ``task/token_second``): what a
    curve logs."""
    group = results["group"]
    return {f"task/{group}_{row[group]}": float(row["accuracy"]) for row in results["rows"]}
