"""The int8 and int4 kernel benchmark runs every candidate and each computes the product it stands for (timings are not
asserted: benchmarks measure, tests assert behaviour)."""

import pytest
import torch

from mtp.benchmarks import int8_kernels


def bound(name: str) -> float:
    """The relative error each kind of candidate stays under: float32 exact up to rounding; the dynamic kernels also
    quantize the activations, per tensor, which at 3 rows of 96 inputs costs up to 12% (over seeds 0..24); the
    weight-only ones (and ``_int_mm`` with rows quantized one by one) stay under 1%, the int4 ones (16 levels per group
    of 32 inputs) under 15%. A wrong product is off by ~100%."""
    if name.startswith("float32"):
        return 1e-6
    if "int4" in name:
        return 0.15
    return 0.2 if "dynamic" in name else 0.02


@pytest.mark.slow  # every candidate at every size (~8 s)
def test_every_candidate_computes_the_product_within_its_precisions_error():
    torch.manual_seed(0)  # the inputs are random: the same ones every run
    results = int8_kernels.measure(64, 96, 3, rounds=1, calls=2)
    assert set(results) <= set(int8_kernels.CANDIDATES) and "fbgemm dynamic int8" in results
    for name, (microseconds, error) in results.items():
        assert microseconds > 0
        assert error < bound(name), (name, error)
