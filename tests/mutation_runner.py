"""Run pytest on several mutated copies of the project from one process that imports torch once.

    python tests/mutation_runner.py '[["/tmp/copy1", ["tests/x.py::test_a"]], ...]'

Each job runs in a child forked from this process (which has imported torch and pytest but nothing of the
project), inside its copy, with the copy first on sys.path; its output goes to <copy>/pytest.log. Prints one
line per job: pytest's exit code. Importing torch in every job's own interpreter cost about 4 s a job.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch  # noqa: F401  the import every child shares

HERE = Path(__file__).resolve().parent


def run_job(project: str, tests: list[str]) -> int:
    pid = os.fork()
    if pid == 0:  # the child: this copy's pytest, output to its log
        code = 3
        try:
            os.chdir(project)
            sys.path[:] = [project] + [p for p in sys.path if p and Path(p).resolve() != HERE]
            log = os.open(Path(project) / "pytest.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(log, 1)
            os.dup2(log, 2)
            code = int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", "--no-header", "-o", "addopts=", *tests]))
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    for project, tests in json.loads(sys.argv[1]):
        print(run_job(project, tests), flush=True)
