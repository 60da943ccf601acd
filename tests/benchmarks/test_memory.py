"""A run's phases each say their own peak resident memory (the kernel's high-water mark since the phase began)."""

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


@pytest.mark.skipif(not CLEAR_REFS.exists(), reason="the kernel's high-water mark is reset through Linux's /proc")
def test_the_runs_peak_keeps_the_mark_a_phase_cleared():
    """Resetting the mark for a phase restarts the kernel's own count of the process's peak (ru_maxrss): the run's peak,
    which a results page's header shows, still counts what the phases before held."""
    with phase("big"):
        held = touched(768)
        del held
    with phase("small"):
        pass
    assert peak_resident_bytes() >= 768 * 2**20


def held_apart(mib: int) -> int:
    """What a process of its own runs: it holds ``mib`` MiB and says its own mark."""
    held = touched(mib)
    return len(held)


def refused(kind: str) -> None:
    if kind == "setting":
        raise SettingError("{heads} exceeds the model's 4 heads; use {heads:1}..4.", heads=5)
    raise RuntimeError("a defect, with its traceback")


@pytest.mark.skipif(not CLEAR_REFS.exists(), reason="the kernel's high-water mark is reset through Linux's /proc")
def test_a_phase_run_in_its_own_process_hands_its_memory_back_and_counts_its_peak(caplog):
    caplog.set_level("INFO", logger="mtp.benchmarks.memory")
    peaks = {}
    with phase("apart", peaks):
        assert in_own_process(held_apart, 640) == 640 * 2**20
        here = peak_resident_bytes()
    status = Path("/proc/self/status").read_text()
    this = int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) * 1024
    assert peaks["apart"] >= 640 * 2**20 and here >= 640 * 2**20
    assert this < peaks["apart"] - 384 * 2**20  # this process never held the other's memory
    assert re.search(r"^memory: apart: \d+\.\d GiB resident at most \(its own process's peak\); this process held ",
                     caplog.records[-1].getMessage())  # fmt: skip


def test_an_error_in_a_process_of_its_own_is_raised_here():
    with pytest.raises(UserError) as user:
        in_own_process(refused, "setting")
    assert type(user.value) is UserError and str(user.value) == "heads=5 exceeds the model's 4 heads; use heads=1..4."
    with pytest.raises(RuntimeError, match="a defect, with its traceback") as defect:
        in_own_process(refused, "defect")
    assert "in refused" in str(defect.value.__cause__)  # the other process's traceback
