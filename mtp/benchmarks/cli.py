"""What the benchmark commands share: argument types, the plotting extra, a training step in a fresh process."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import mtp
from mtp.benchmarks.train_step import StepSpec
from mtp.errors import UserError


def int_list(text: str) -> list[int]:
    """A comma-separated list of positive integers, e.g. 1,2,4,8."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers, e.g. 1,2,4,8") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} has a value below 1; every entry must be a positive integer")
    return values


def require_plotting() -> None:
    """The benchmarks' plots need matplotlib (the benchmarks extra): checked before a benchmark runs, not after."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError(
            "the benchmarks plot with matplotlib, which is not installed; install their extra: "
            "pip install -e '.[benchmarks]'."
        ) from None


def step_in_fresh_process(spec: StepSpec) -> dict:
    """Peak memory and step time of ``spec`` measured by ``python -m mtp.benchmarks.train_step`` in a fresh process
    that imports this process's mtp; a failed run is a row whose status says why."""
    package_parent = str(Path(mtp.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([package_parent, os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-m", "mtp.benchmarks.train_step", json.dumps(asdict(spec))],
        capture_output=True,
        text=True,
        env=env,
    )
    if result.returncode != 0:
        reason = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return {**asdict(spec), "status": f"failed: {reason}"}
    return json.loads(result.stdout.strip().splitlines()[-1])
