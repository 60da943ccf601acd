"""The int8 kernel benchmark runs every candidate and each computes the product it stands for (timings are not
asserted: benchmarks measure, tests assert behaviour)."""

import pytest

from mtp.benchmarks import int8_kernels


@pytest.mark.slow  # every candidate at every size (~8 s)
def test_every_candidate_computes_the_product_within_int8_error():
    results = int8_kernels.measure(64, 96, 3, rounds=1, calls=2)
    assert set(results) <= set(int8_kernels.CANDIDATES) and "fbgemm dynamic int8" in results
    for name, (microseconds, error) in results.items():
        assert microseconds > 0
        assert error < (1e-6 if name.startswith("float32") else 0.05), name
