"""The decoding methods' benchmark parts, one module each in this folder, each registered under its method's name
(:mod:`.base`): the target's heads (their chain and its variants), a draft model, layer skip, prompt lookup. Every
module here is imported with the package, so a method's benchmark part is one new module: a
:class:`~mtp.benchmarks.methods.base.MethodBench` subclass with ``@register_bench`` gets bench_decode's flags, its
--methods entries, its rows and its plot markers (a test file may register one the same way)."""

import importlib
import pkgutil

from mtp.benchmarks.methods.base import (
    BENCH_REGISTRY,
    BenchRow,
    BenchTarget,
    MethodBench,
    bench_drafters,
    gamma_series,
    predicted_labels,
    register_bench,
    row_markers,
    unregister_bench,
)

for _module in ("heads", *sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name not in ("base", "heads"))):
    importlib.import_module(f"{__name__}.{_module}")  # each registers its benchmark part on import: the heads first

__all__ = [
    "BENCH_REGISTRY",
    "BenchRow",
    "BenchTarget",
    "MethodBench",
    "bench_drafters",
    "gamma_series",
    "predicted_labels",
    "register_bench",
    "row_markers",
    "unregister_bench",
]
