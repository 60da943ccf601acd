"""A run's phases each say their own peak resident memory (the kernel's high-water mark since the phase began)."""

import re

import pytest

from mtp.benchmarks.memory import CLEAR_REFS, phase, reset_peak


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
