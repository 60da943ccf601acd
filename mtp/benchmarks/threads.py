"""The threads a CPU benchmark decodes with, fixed rather than left to the runtime: as llama.cpp's ``-t N`` with a CPU
mask, ``threads=N`` sets PyTorch's thread count to N and pins the process to N of the CPUs it may run on (the first N
of its affinity), so that a step's speed depends neither on the count PyTorch picked at start nor on the scheduler
moving its threads over more CPUs than it runs; the results say which were used (:func:`described`).
"""

from __future__ import annotations

import os

import torch

from mtp.errors import SettingError


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on (all of them where the system cannot say)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def pin_threads(threads: int) -> None:
    """PyTorch's threads set to ``threads`` and this process pinned to the first ``threads`` CPUs it may run on (where
    the system pins: Linux); 0 leaves both as they are. A count below 0 or above the CPUs allowed is a
    :class:`~mtp.errors.SettingError` naming how many there are, before anything changes."""
    if threads == 0:
        return
    cpus = allowed_cpus()
    if threads < 0 or threads > len(cpus):
        raise SettingError(
            f"{{threads}} is not a thread count this process can pin: it may run on {len(cpus)} CPU(s); give 1 to "
            f"{len(cpus)}, or 0 to leave PyTorch's count ({torch.get_num_threads()}).",
            threads=threads,
        )
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus[:threads])
    torch.set_num_threads(threads)


def cpu_ranges(cpus: list[int]) -> str:
    """CPU numbers as ranges: [0, 1, 2, 5] -> '0-2,5'."""
    spans: list[list[int]] = []
    for cpu in sorted(cpus):
        if spans and cpu == spans[-1][1] + 1:
            spans[-1][1] = cpu
        else:
            spans.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def described() -> str:
    """The threads decoding runs with and the CPUs it may run on: '2 threads on CPUs 0-1'."""
    threads = torch.get_num_threads()
    return f"{threads} thread{'s' if threads != 1 else ''} on CPUs {cpu_ranges(allowed_cpus())}"
