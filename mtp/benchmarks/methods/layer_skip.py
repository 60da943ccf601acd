"""Layer skip's benchmark part (:class:`~mtp.decode.methods.layer_skip.LayerSkip`): a row per skip set swept, and per
search where a set is searched for."""

from __future__ import annotations

from dataclasses import dataclass, field

from mtp.benchmarks.methods.base import BenchRow, BenchTarget, MethodBench, register_bench
from mtp.decode.methods.layer_skip import LayerSkip, LayerSkipSettings, skip_layers_drafter


@dataclass
class LayerSkipSweep:
    skip_layers: list[str] = field(default_factory=lambda: ["auto"])
    """Sets to skip, a row each: blocks (2,4,5), sublayers (3a,5m: attention, MLP), or auto: searched per mode (with
    skip_sublayers, a row for the block search and one for the sublayer search)."""


@register_bench
class LayerSkipBench(MethodBench):
    """Layer skip's rows: one per set to skip."""

    method = LayerSkip
    sweep = LayerSkipSweep
    markers = {"layerskip": "^"}

    @classmethod
    def bench_settings(cls, values: dict[str, object], sweep: LayerSkipSweep | None) -> LayerSkipSettings:
        """On a benchmark the sets are the sweep's; the setting ``skip_layers`` is auto where one is searched (the
        search's own settings need it), else the first; None where its rows are not benchmarked (a search's settings
        then ask for them)."""
        sets = sweep.skip_layers if sweep is not None else [None]
        return cls.method.settings(**values, skip_layers="auto" if "auto" in sets else sets[0])

    def rows(self, target: BenchTarget, mode: str, labels: list[str]) -> list[BenchRow]:
        """A row per set of the sweep's; an auto set searched over blocks, and with skip_sublayers over sublayers too
        (a row each)."""
        options, rows = self.options, []
        for spec in self.sweep_values.skip_layers:
            for sublayers in (False, True) if spec == "auto" and options.skip_sublayers else (False,):
                drafter = skip_layers_drafter(
                    spec, target, target.drafting, sublayers, options.search_trials, options.search_seconds
                )
                rows.append(self.row(self.name, target.drafting(drafter)))
        return rows
