"""A decoding method's benchmark part: what bench_decode asks of a method beside decoding with it, registered under
the name of its decoding part (:mod:`mtp.decode.methods`, whose registry it reads and never writes).

A method is then one module per layer: its decoding part (a :class:`~mtp.decode.methods.DecodingMethod`: settings,
proposer, ``selected_by``, ``beside_heads``) in ``mtp/decode/methods/``, and its benchmark part (a :class:`MethodBench`
with ``@register_bench``) in ``mtp/benchmarks/methods/``: its ``sweep`` dataclass (how the benchmark runs its rows:
the values it sweeps, a row each), its settings' benchmark defaults, its ``--methods`` entries (``labels``), its rows
(labels and plans: data, not presentation), the rows given Leviathan et al.'s predicted speed-up, the drafts per step
whose memory is checked before any runs, and how the plot shows its rows (a marker per label, lines over gamma). The
benchmark and its command know methods only through :data:`BENCH_REGISTRY` (a test file may register both parts).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar, NamedTuple

from mtp.decode.methods import REGISTRY, DecodingMethod, Target
from mtp.decode.plan import Plan, Proposer


@dataclass
class BenchTarget(Target):
    """What a method's rows are built for: the decoding :class:`~mtp.decode.methods.Target` (its parts the heads'
    chain at the largest k, its gamma the drafters' --gamma) and SpecTr's sequences per step."""

    sequences: list[int] = field(default_factory=lambda: [2, 4])
    """SpecTr's draft sequences per step the rows run at, a row each (bench_decode's --sequences)."""


class BenchRow(NamedTuple):
    """A benchmark row of a method: its label (the method's name, or a variant's, such as 'draft spectr'), the plan it
    decodes with (its drafter in it; None: the heads), and what its drafter's drafts are, for the twins the benchmark
    adds (:mod:`mtp.benchmarks.decode_settings`)."""

    label: str
    plan: Plan
    drafts_with_a_model: bool = True
    """Its drafter's drafts come out of a model's forward (a draft model, layer skip), so their precision
    (``draft_dtype``) can change them: int8 twins; False: a lookup in the tokens."""
    draws_drafts: bool = True
    """When sampling, its drafter draws its drafts from laws it computes, so ``draft_choice`` can draw them otherwise:
    draft-choice twins; False: its drafts are chosen another way (looked up, or decoded by an inner speculative
    step)."""


class MethodBench:
    """A decoding method's benchmark part, built from the method's settings and its sweep."""

    method: ClassVar[type[DecodingMethod]]
    """Its decoding part (registered in :data:`~mtp.decode.methods.REGISTRY`): its name is this part's too."""
    name: ClassVar[str]
    """Its decoding part's name (set from ``method``)."""
    sweep: ClassVar[type | None] = None
    """Its sweep dataclass: how the benchmark runs its rows (bench_decode's flags, a docstring below each field); a
    list field is a row per value. A field named as a setting takes that setting's flag on bench_decode (layer skip's
    ``skip_layers``: several sets). None: its rows sweep nothing."""
    bench_defaults: ClassVar[dict[str, object]] = {}
    """Defaults of its settings on bench_decode where they differ from decode's (prompt lookup's n-gram: a benchmark
    asked for lookup's rows runs them without a flag)."""
    labels: ClassVar[tuple[str, ...]] = ()
    """bench_decode's --methods entries it answers for (empty: its name alone)."""
    predicted: ClassVar[tuple[str, ...]] = ()
    """Its rows' labels whose speed-up Leviathan et al.'s formula predicts from their acceptance and draft cost (a
    draft model's chain), reported beside the measured one."""
    markers: ClassVar[dict[str, str]] = {}
    """The decoding plot's matplotlib marker of its rows, by label (a label without one gets a spare)."""
    series: ClassVar[dict[str, str]] = {}
    """Its row labels plotted as a line over gamma (one point per drafts-per-step setting), each with its legend
    text."""
    drafts_with_a_model: ClassVar[bool] = True
    """Its rows' drafts come out of a model (:attr:`BenchRow.drafts_with_a_model`), unless a row says otherwise."""
    draws_drafts: ClassVar[bool] = True
    """Its rows' drafts are drawn from laws its drafter computes (:attr:`BenchRow.draws_drafts`), unless a row says
    otherwise."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "method" in cls.__dict__:
            cls.name = cls.method.name

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return cls.labels or (cls.name,)

    @classmethod
    def bench_settings(cls, values: dict[str, object], sweep: object | None) -> object:
        """Its settings on bench_decode, of the values of their flags there (each setting a sweep field takes the flag
        of has none: its value is the method's to derive from ``sweep``; None: its rows are not benchmarked)."""
        return cls.method.settings(**values)

    def __init__(self, options: object, sweep: object | None = None) -> None:
        self.decoding = self.method(options)
        """Its decoding part, of its settings."""
        self.options = options
        """Its settings, as given."""
        self.sweep_values = sweep if sweep is not None or self.sweep is None else self.sweep()
        """Its sweep (the defaults where none is given)."""

    def drafter(self, target: Target) -> Proposer:
        """Its decoding part's proposer, drafting the ``target.gamma`` tokens a step asked for."""
        return self.decoding.drafter(target)

    def row(self, label: str, plan: Plan, **drafts: bool) -> BenchRow:
        """A row of ``plan`` labelled ``label``, its drafts as the class says (``drafts``: a row's own, by name)."""
        kinds = {"drafts_with_a_model": self.drafts_with_a_model, "draws_drafts": self.draws_drafts, **drafts}
        return BenchRow(label, plan, **kinds)

    def most_drafts(self, gamma: int) -> int:
        """The most drafts a step of its rows verifies at the drafters' ``gamma`` (their memory is checked before any
        runs)."""
        return gamma

    def rows(self, target: BenchTarget, mode: str, labels: list[str]) -> list[BenchRow]:
        """Its rows in a benchmark of ``labels`` (the --methods entries, its own among them), in ``mode`` (greedy or
        sampling): ``target``'s parts are the heads' chain at the largest k (a drafter's plan: :meth:`Target.drafting`),
        its gamma the drafters'. By default one row at that gamma."""
        return [self.row(self.name, target.drafting(self.drafter(target)))]


BENCH_REGISTRY: dict[str, type[MethodBench]] = {}
"""Every registered benchmark part by its method's name, in the order registered (the built-in ones first: the
heads, then the drafters)."""


def flag_names(cls: type[MethodBench]) -> set[str]:
    """The names of the flags a method's settings and sweep make on bench_decode (a sweep field named as a setting:
    one)."""
    return {f.name for part in (cls.method.settings, cls.sweep) if part is not None for f in fields(part)}


def register_bench(cls: type[MethodBench]) -> type[MethodBench]:
    """Register a benchmark part (as a class decorator) under its decoding part's name, which must be registered; a
    second part of the same name, one whose settings or sweep share a field with another's, or whose --methods
    entries another answers for, is refused (their flags or entries would clash)."""
    name = cls.method.name
    if REGISTRY.get(name) is not cls.method:
        raise ValueError(f"{cls.__name__}: its method {name!r} is not registered; register its decoding part first")
    if name in BENCH_REGISTRY and BENCH_REGISTRY[name] is not cls:
        raise ValueError(f"a benchmark part of the method {name!r} is registered already")
    others = [other for other in BENCH_REGISTRY.values() if other is not cls]
    taken = {flag: other.name for other in others for flag in flag_names(other)}
    clash = sorted(flag for flag in flag_names(cls) if flag in taken)
    if clash:
        raise ValueError(f"{name}'s settings and sweep {', '.join(clash)} are {taken[clash[0]]}'s flags already")
    entries = {entry: other.name for other in others for entry in other.names()}
    clash = sorted(entry for entry in cls.names() if entry in entries)
    if clash:
        raise ValueError(f"{name}'s --methods entries {', '.join(clash)} are {entries[clash[0]]}'s already")
    BENCH_REGISTRY[name] = cls
    return cls


def unregister_bench(name: str) -> None:
    """Forget a benchmark part (a test's own, once it is done)."""
    BENCH_REGISTRY.pop(name, None)


def bench_drafters() -> list[type[MethodBench]]:
    """The registered parts of methods that draft in place of the heads (each chosen by its ``selected_by``)."""
    return [cls for cls in BENCH_REGISTRY.values() if cls.method.selected_by is not None]


def row_markers() -> dict[str, str]:
    """The plot's marker of every registered part's row labels."""
    return {label: marker for cls in BENCH_REGISTRY.values() for label, marker in cls.markers.items()}


def gamma_series() -> dict[str, str]:
    """The row labels plotted as lines over gamma, with their legend text, of every registered part."""
    return {label: legend for cls in BENCH_REGISTRY.values() for label, legend in cls.series.items()}


def predicted_labels() -> set[str]:
    """The row labels given Leviathan et al.'s predicted speed-up, of every registered part."""
    return {label for cls in BENCH_REGISTRY.values() for label in cls.predicted}
