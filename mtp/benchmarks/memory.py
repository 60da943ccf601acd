"""Resident memory as the kernel counts it: a process's high-water mark (its peak resident set), over the whole run or
over one phase of it (the phase's own peak: Linux lets a process reset its mark, ``/proc/self/clear_refs``)."""

from __future__ import annotations

import logging
import os
import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")

log = logging.getLogger(__name__)


def peak_resident_bytes() -> int:
    """The kernel's high-water mark of resident memory over the whole run: this process's, or its largest finished
    child's where that is larger (a peer run in a child process), in bytes (Linux reports KiB; macOS bytes)."""
    scale = 1 if sys.platform == "darwin" else 1024
    usage = (resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return max(usage) * scale


def _status_bytes(key: str) -> int | None:
    """A ``/proc/self/status`` size (``VmHWM``, ``VmRSS``) in bytes; None where there is none (not Linux)."""
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def reset_peak() -> bool:
    """Start a new high-water mark of this process's resident set at its current size; False where the kernel does not
    let it (then a phase's peak is the run's so far)."""
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"


@contextmanager
def phase(name: str, peaks: dict[str, int] | None = None) -> Iterator[None]:
    """Say (logged: a training run's console and pretrain.log), at the end of the phase ``name``, its peak resident
    memory (the kernel's high-water mark since it began, where the kernel can reset the mark; else the run's so far),
    the resident memory left at its end and its minutes; and record the peak in ``peaks`` under ``name``."""
    own = reset_peak()
    started = time.perf_counter()
    try:
        yield
    finally:
        peak = (_status_bytes("VmHWM") if own else None) or peak_resident_bytes()
        now = _status_bytes("VmRSS")
        if peaks is not None:
            peaks[name] = peak
        left = f", {gib(now)} at its end" if now is not None else ""
        scope = "its own peak" if own else "the run's peak so far"
        minutes = (time.perf_counter() - started) / 60
        if os.environ.get("RANK", "0") == "0" and os.environ.get("LOCAL_RANK", "0") == "0":  # the first process says
            log.info(f"memory: {name}: {gib(peak)} resident at most ({scope}){left}; {minutes:.1f} min")
