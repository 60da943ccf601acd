"""A run's phases each say their own peak resident memory (the kernel's high-water mark since the phase began)."""

import logging
import re
from pathlib import Path

import pytest

from mtp.benchmarks.memory import CLEAR_REFS, in_own_process, peak_resident_bytes, phase, reset_peak
from mtp.errors import SettingError, UserError


def touched(mib: int) -> bytearray:
    held = bytearray(mib * 2**20)
    held[::4096] = b"x" * len(held[::4096])
    return held


@pytest.mark.skipif(not CLEAR_REFS.exists(), reason="the kernel's high-water mark is reset through Linux's /proc")
def test_a_phase_says_its_own_peak_not_an_earlier_ones(caplog):
    caplog.set_level("INFO", logger="mtp.benchmarks.memory")
    assert reset_peak()
    peaks = {}
    with phase("big", peaks):
        held = touched(512)
        del held
    with phase("small", peaks):
        held = touched(128)
        del held
    assert peaks["big"] >= 512 * 2**20
    assert 128 * 2**20 <= peaks["small"] < peaks["big"] - 256 * 2**20  # the big phase's memory is not counted again
    lines = [record.getMessage() for record in caplog.records]
    assert [line.split(":")[1].strip() for line in lines] == ["big", "small"]
    pattern = r"^memory: small: \d+\.\d GiB resident at most \(its own peak\), \d+\.\d GiB at its end; \d+\.\d min$"
    assert re.match(pattern, lines[1])


def test_a_phase_that_fails_still_says_its_peak(caplog):
    caplog.set_level("INFO", logger="mtp.benchmarks.memory")
    peaks = {}
    with pytest.raises(RuntimeError), phase("failing", peaks):
        raise RuntimeError("boom")
    assert peaks["failing"] > 0 and "memory: failing: " in caplog.text


def phases_big_then_small() -> int:
    """A phase holding 768 MiB, then one holding nothing, in a small process: the run's peak after them."""
    with phase("big"):
        held = touched(768)
        del held
    with phase("small"):
        pass
    return peak_resident_bytes()


@pytest.mark.skipif(not CLEAR_REFS.exists(), reason="the kernel's high-water mark is reset through Linux's /proc")
def test_the_runs_peak_keeps_the_mark_a_phase_cleared():
    """Resetting the mark for a phase restarts the kernel's own count of the process's peak (ru_maxrss): the run's peak,
    which a results page's header shows, still counts what the phases before held."""
    assert in_own_process(phases_big_then_small) >= 768 * 2**20


def held_apart(mib: int) -> int:
    """What a process of its own runs: it holds ``mib`` MiB and says its own mark."""
    held = touched(mib)
    return len(held)


def refused(kind: str) -> None:
    if kind == "setting":
        raise SettingError("{heads} exceeds the model's 4 heads; use {heads:1}..4.", heads=5)
    raise RuntimeError("a defect, with its traceback")


def phase_apart() -> tuple[int, int, int, str]:
    """A phase that runs a process of its own holding 640 MiB, in a small process (the test's own may hold more than
    that already): the phase's peak, the run's after it, this process's mark, and the phase's line."""
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logger = logging.getLogger("mtp.benchmarks.memory")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    peaks: dict[str, int] = {}
    with phase("apart", peaks):
        assert in_own_process(held_apart, 640) == 640 * 2**20
    status = Path("/proc/self/status").read_text()
    this = int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) * 1024
    return peaks["apart"], peak_resident_bytes(), this, said[-1]


@pytest.mark.skipif(not CLEAR_REFS.exists(), reason="the kernel's high-water mark is reset through Linux's /proc")
def test_a_phase_run_in_its_own_process_hands_its_memory_back_and_counts_its_peak():
    phase_peak, run_peak, this, line = in_own_process(phase_apart)
    assert phase_peak >= 640 * 2**20 and run_peak >= 640 * 2**20
    assert this < phase_peak - 384 * 2**20  # the phase's process never held the other's memory
    pattern = r"^memory: apart: \d+\.\d GiB resident at most \(its own process's peak\); this process held "
    assert re.search(pattern, line)


def test_an_error_in_a_process_of_its_own_is_raised_here():
    with pytest.raises(UserError) as user:
        in_own_process(refused, "setting")
    assert type(user.value) is UserError and str(user.value) == "heads=5 exceeds the model's 4 heads; use heads=1..4."
    with pytest.raises(RuntimeError, match="a defect, with its traceback") as defect:
        in_own_process(refused, "defect")
    assert "in refused" in str(defect.value.__cause__)  # the other process's traceback
