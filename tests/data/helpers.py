"""Real processes preparing one data cache: the child script, a start barrier and a record of who built."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The child loads mtp.data's modules without the package's __init__ (which imports Lightning: ~5 s on two cores),
# slows the build down so that other processes arrive while it runs, and appends its pid to a file each time it
# builds (monkeypatching cannot reach across processes).
CHILD = """
import logging, os, sys, time, types
from pathlib import Path
import mtp
package = types.ModuleType("mtp.data")
package.__path__ = [str(Path(mtp.__file__).parent / "data")]
sys.modules["mtp.data"] = package
from mtp.data import packing
from mtp.data.sources import SourceConfig

cache, pattern, builds, ready, go, slow_step, delay = sys.argv[1:8]
logging.basicConfig(level=logging.INFO, format="%(message)s")

def record_then_wait():
    with open(builds, "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(float(delay))

real_build, real_shard = packing._build, packing._write_shard

def slow_build(*args):
    record_then_wait()
    return real_build(*args)

def slow_shard(*args):  # the first shard is on disk, meta.json is not: a builder caught in the middle
    result = real_shard(*args)
    record_then_wait()
    return result

if slow_step == "build":
    packing._build = slow_build
else:
    packing._write_shard = slow_shard
Path(ready).touch()
while not Path(go).exists():
    time.sleep(0.002)
packed = packing.prepare(
    SourceConfig(kind="files", paths=[pattern]), packing.TokenizerConfig(kind="byte"), 0.25, cache
)
print(packed.path)
"""


def write_corpus(folder: Path, n: int = 8) -> str:
    """A few small documents; returns their glob pattern."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"doc{i}.txt").write_text(f"document {i}: " + "some words of text, " * (20 + i))
    return str(folder / "*.txt")


def start_preparers(
    n: int, cache: Path, pattern: str, work: Path, slow_step: str = "build", delay: float = 1.0
) -> list[subprocess.Popen]:
    """Start ``n`` processes that call ``prepare`` at the same moment (once all have imported); their pids land in
    ``work/builds`` as they build."""
    work.mkdir(parents=True, exist_ok=True)
    go = work / "go"
    readies = [work / f"ready{i}" for i in range(n)]
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(cache), pattern, str(work / "builds"), str(ready), str(go)]
            + [slow_step, str(delay)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for ready in readies
    ]
    wait_for(lambda: all(r.exists() for r in readies) or any(p.poll() is not None for p in processes), 60)
    go.touch()
    return processes


def builders(work: Path) -> list[int]:
    """The pids that entered a build, in order."""
    path = work / "builds"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def wait_for(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
