"""Results pages: a benchmark's results.json as a Markdown page under docs/results/, headed once by date, commit,
machine, torch version and the exact command, then the benchmark's own tables and plot. A rerun replaces the page."""

from __future__ import annotations

import datetime
import functools
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from mtp.benchmarks.memory import peak_resident_bytes

HEADER_FIELDS = ("date", "commit", "machine", "torch", "command")
OPTIONAL_FIELDS = ("peak memory",)
"""Shown in the header where results.json records them (pages of runs before they were recorded lack them)."""


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo; elsewhere what platform reports)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


RUN_FILES = ("mtp", "scripts", "conf", "pyproject.toml")
"""What a benchmark runs: a change to any other tracked file (the docs, the tests) leaves its figures the commit's."""


def git_commit(root: Path) -> str:
    """The checkout's commit, with ``+dirty`` when tracked files it runs (:data:`RUN_FILES`) differ from it;
    ``unknown`` outside git."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        paths = [f":(top){name}" for name in RUN_FILES]  # from the checkout's top, wherever root is within it
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", *paths], cwd=root).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


@functools.cache
def code_commit() -> str:
    """The commit of the code this process runs: :func:`git_commit` of mtp's checkout at the first call, which the
    commands make as they start (:func:`mtp.commands.cli.run_script`), so that a long run's results name the code it
    imported, not a later checkout."""
    return git_commit(Path(__file__).resolve().parents[2])


def provenance(argv: list[str] | None = None, device: str | None = None) -> dict[str, str]:
    """What a results page is headed by: when, at which commit, on what machine, with which torch, by which command.
    ``device``: the accelerator's name when the benchmark ran on one."""
    args = sys.argv[1:] if argv is None else argv
    script = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    machine = f"{cpu_model()}, {os.cpu_count()} cores"
    if device:
        machine = f"{device}; host {machine}"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": code_commit(),
        "machine": machine,
        "torch": torch.__version__,
        "command": shlex.join(["python", f"scripts/{script}", *args]),
        "peak memory": peak_memory(),
    }


def peak_memory() -> str:
    """The run's peak resident memory so far, as a results page's header shows it: ``3.2 GiB resident (high-water
    mark)``; what it means is the page's: everything the process did up to writing its results."""
    return f"{peak_resident_bytes() / 2**30:.1f} GiB resident (the kernel's high-water mark)"


def header(run: dict[str, str]) -> str:
    """The page's header: one table of the run's provenance."""
    missing = [field for field in HEADER_FIELDS if not run.get(field)]
    if missing:
        missed = ", ".join(missing)
        raise ValueError(f"results.json lacks {missed} in its 'provenance'; rerun the benchmark to record it")
    shown = [field for field in HEADER_FIELDS if field != "command"] + [f for f in OPTIONAL_FIELDS if run.get(f)]
    rows = "\n".join(f"| {field} | {run[field]} |" for field in shown)
    command = f"<!-- not run: the benchmark itself -->\n```bash\n{run['command']}\n```"
    return f"| | |\n|---|---|\n{rows}\n\nCommand:\n\n{command}"


HEADING_LENGTH = 80
"""A title longer than this is cut at its first ": " into the page's heading and a first paragraph of the rest."""


def heading(title: str) -> tuple[str, str]:
    """A benchmark's title as a page's heading and the paragraph under it: a long title (the setting, then the prompts,
    lengths and rounds) is cut at its first ": ", a short one is the heading alone."""
    head, colon, rest = title.partition(": ")
    if len(title) <= HEADING_LENGTH or not colon:
        return title, ""
    return head, rest[:1].upper() + rest[1:] + ("" if rest.endswith(".") else ".")


def page(results: dict[str, Any], title: str, tables: str, plot: str | None = None) -> str:
    """The whole page: heading (and the rest of a long title), provenance header, the benchmark's tables, then its plot
    (a path relative to the page)."""
    head, setting = heading(title)
    parts = [
        f"# {head}",
        "<!-- generated by scripts/results_page.py from the benchmark's results.json: rerun, don't edit -->",
        *([setting] if setting else []),
        header(results.get("provenance", {})),
        tables.strip(),
    ]
    if plot:
        parts.append(f"![{head}]({plot})")
    return "\n\n".join(parts) + "\n"
