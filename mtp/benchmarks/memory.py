"""Resident memory as the kernel counts it: a process's high-water mark (its peak resident set), over the whole run or
over one phase of it (the phase's own peak: Linux lets a process reset its mark, ``/proc/self/clear_refs``); and a
phase run in a process of its own (:func:`in_own_process`), whose memory is handed back when it ends."""

from __future__ import annotations

import logging
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any, TypeVar

from mtp.errors import UserError

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")

log = logging.getLogger(__name__)
T = TypeVar("T")

_cleared = 0
"""The highest mark :func:`reset_peak` cleared: the kernel's own count (``ru_maxrss``) restarts with the mark."""
_processes: list[int] = []
"""The peak of each process :func:`in_own_process` ran, in the order they ended."""


def peak_resident_bytes() -> int:
    """The kernel's high-water mark of resident memory over the whole run, in bytes (Linux reports KiB; macOS bytes):
    this process's (the highest of its marks, where :func:`reset_peak` began new ones), or its largest finished child's
    where that is larger (a peer run in a child process, a phase :func:`in_own_process` ran)."""
    scale = 1 if sys.platform == "darwin" else 1024
    usage = (resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return max(max(usage) * scale, _cleared, *_processes)


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
    let it (then a phase's peak is the run's so far). The mark it clears still counts in :func:`peak_resident_bytes`."""
    global _cleared
    mark = _status_bytes("VmHWM")
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    _cleared = max(_cleared, mark or 0)
    return True


def gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"


@contextmanager
def phase(name: str, peaks: dict[str, int] | None = None) -> Iterator[None]:
    """Say (logged: a training run's console and pretrain.log), at the end of the phase ``name``, its peak resident
    memory (the kernel's high-water mark since it began, where the kernel can reset the mark; else the run's so far),
    the resident memory left at its end and its minutes; and record the peak in ``peaks`` under ``name``. A process of
    its own that the phase ran (:func:`in_own_process`) counts in its peak where it held more than this one did."""
    own = reset_peak()
    ran = len(_processes)
    started = time.perf_counter()
    try:
        yield
    finally:
        here = (_status_bytes("VmHWM") if own else None) or peak_resident_bytes()
        apart = max(_processes[ran:], default=0)
        peak = max(here, apart)
        now = _status_bytes("VmRSS")
        if peaks is not None:
            peaks[name] = peak
        left = f", {gib(now)} at its end" if now is not None else ""
        scope = "its own peak" if own else "the run's peak so far"
        if apart > here:
            scope = "its own process's peak"
            left = f"; this process held {gib(here)} at most" + (f", {gib(now)} at its end" if now is not None else "")
        minutes = (time.perf_counter() - started) / 60
        if os.environ.get("RANK", "0") == "0" and os.environ.get("LOCAL_RANK", "0") == "0":  # the first process says
            log.info(f"memory: {name}: {gib(peak)} resident at most ({scope}){left}; {minutes:.1f} min")


@dataclass(frozen=True)
class _Refused:
    """A UserError's sentence, sent back from the process it was raised in."""

    sentence: str


def _call(function: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, int]:
    try:
        result = function(*args)
    except UserError as err:  # its sentence, whatever its class's own arguments (a SettingError's fields)
        result = _Refused(str(err))
    return result, peak_resident_bytes()


def in_own_process(function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` in a Python process of its own, spawned (nothing of this one's memory is inherited) and
    ended when the call returns: what it allocates is never resident beside this process's memory in one process, and
    all of it is handed back to the system at its end. Its peak resident memory (its children's included) counts from
    then on in :func:`peak_resident_bytes` and in the :func:`phase` that ran it. A UserError it raises is raised here
    with the same sentence; another error is raised here with that process's traceback as its cause. ``function``, its
    arguments and its result travel pickled: a module's function, and values of the library's classes."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        result, peak = pool.submit(_call, function, args).result()
    _processes.append(peak)
    if isinstance(result, _Refused):
        raise UserError(result.sentence)
    return result
