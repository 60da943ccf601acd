"""A decoding method as one object: a way of drafting (the target's heads, a draft model, layer skip, prompt lookup,
or one of your own) is a :class:`DecodingMethod` subclass, registered by name with :func:`register`.

Its ``settings`` dataclass holds what it is asked (each field typed, with an attribute docstring, and checked by the
dataclass itself: a :class:`~mtp.errors.SettingError`); one field, ``selected_by``, chooses it where a run names who
drafts; :meth:`DecodingMethod.proposer` builds the :class:`~mtp.decode.proposal.Proposer` that drafts, and
:meth:`DecodingMethod.rows` its benchmark rows (labels, plans and proposers: data, not presentation). The commands
and the benchmark know methods only through :data:`REGISTRY`: they make each method's flags of its settings, its rows
of :meth:`~DecodingMethod.rows`, and choose how to show them by its name. So a method is one module (or one test
file): a Proposer, a settings dataclass, a DecodingMethod, ``@register``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import ClassVar, NamedTuple

import torch

from mtp.checkpoint.load import LoadedCheckpoint
from mtp.decode.proposal import DEFAULT_GAMMA, Proposer
from mtp.decode.settings import Drafted
from mtp.decode.tree_fit import FASTEST


def to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


@dataclass
class Target:
    """What a method's proposer is built for: the loaded target, the decoding plan with the drafts per step asked for
    (``config.gamma``), where and how it runs, and where a search or a fit reports its progress."""

    loaded: LoadedCheckpoint
    config: Drafted
    device: torch.device
    dtype: str = "auto"
    """The dtype the target was loaded with (a draft checkpoint is loaded the same way)."""
    compile: bool = False
    log: Callable[[str], None] = to_stderr
    """Where a search's or a fit's progress and choice are written (a line each)."""

    def drafting(self, gamma: int) -> Drafted:
        """The plan with a drafter instead of the heads, drafting ``gamma`` per step."""
        return replace(self.config, heads=1, gamma=gamma)


@dataclass
class DrafterSettings:
    gamma: int = DEFAULT_GAMMA
    """Drafts per step from a drafter (a draft model, layer skip, prompt lookup)."""


@dataclass
class Sweep:
    """What a benchmark runs a method at, a row per value, where it runs more than one (bench_decode's list flags)."""

    gammas: list[int] = field(default_factory=lambda: [DEFAULT_GAMMA])
    """A draft model's drafts per step, a row each."""
    sequences: list[int] = field(default_factory=lambda: [2, 4])
    """SpecTr's draft sequences per step, a row each."""
    skip_layers: list[str] = field(default_factory=lambda: ["auto"])
    """Layer skip's sets, a row each (auto: searched)."""
    tree: str = "auto"
    """The heads' tree: a JSON file, or auto (fitted per mode)."""
    tree_nodes: list[int | str] = field(default_factory=lambda: [FASTEST])
    """Node budgets of the fitted trees, a tree each."""


class BenchRow(NamedTuple):
    """A benchmark row of a method: its label (the method's name, or a variant's, such as 'draft spectr'), the plan it
    decodes with and the proposer that drafts (None: the heads)."""

    label: str
    plan: Drafted
    proposer: Proposer | None


class DecodingMethod:
    """A way of drafting, built from its settings."""

    name: ClassVar[str]
    """Its name: the statistics' ``method`` (its proposer's) and bench_decode's ``--methods`` entry."""
    settings: ClassVar[type]
    """Its settings dataclass: every field a flag (a type add_settings knows, a docstring below it)."""
    selected_by: ClassVar[str | None]
    """The field of ``settings`` that chooses it in place of the heads (its default is None); None: the heads
    themselves, whom a command chooses by its own flag."""
    beside_heads: ClassVar[bool] = False
    """Whether its drafts can be verified beside the heads' in one step (a hybrid)."""
    labels: ClassVar[tuple[str, ...]] = ()
    """bench_decode's --methods entries it answers for (empty: its name alone)."""
    predicted: ClassVar[tuple[str, ...]] = ()
    """Its rows' labels whose speed-up Leviathan et al.'s formula predicts from their acceptance and draft cost (a
    draft model's chain), reported beside the measured one."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return cls.labels or (cls.name,)

    def __init__(self, options: object) -> None:
        assert isinstance(options, self.settings), f"{self.name} is built from a {self.settings.__name__}"
        self.options = options
        """Its settings, as given."""

    def proposer(self, target: Target) -> Proposer:
        """The proposer that drafts for ``target`` (a search, a fit or a load happens here)."""
        raise NotImplementedError

    def drafter(self, target: Target) -> Proposer:
        """:meth:`proposer`, drafting the ``target.config.gamma`` tokens a step asked for."""
        return self.proposer(target).with_gamma(target.config.gamma)

    def most_drafts(self, gamma: int, sweep: Sweep) -> int:
        """The most drafts a step of its benchmark rows verifies at the drafters' ``gamma`` (their memory is checked
        before any runs)."""
        return gamma

    def rows(self, target: Target, mode: str, labels: list[str], sweep: Sweep) -> list[BenchRow]:
        """Its rows in a benchmark of ``labels`` (the --methods entries, its own among them), in ``mode`` (greedy or
        sampling): ``target.config`` is the heads' chain at the largest k with the drafters' gamma (a drafter's plan:
        :meth:`Target.drafting`). By default one row at that gamma."""
        config = target.drafting(target.config.gamma)
        return [BenchRow(self.name, config, self.drafter(replace(target, config=config)))]


REGISTRY: dict[str, type[DecodingMethod]] = {}
"""Every registered method by name, in the order registered (the built-in ones first: the heads, then the drafters)."""


def register(cls: type[DecodingMethod]) -> type[DecodingMethod]:
    """Register a method (as a class decorator); a second method of the same name, or whose settings share a field
    with another's, is refused (their flags would clash)."""
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise ValueError(f"a decoding method named {cls.name!r} is registered already")
    taken = {f.name: other.name for other in REGISTRY.values() if other is not cls for f in fields(other.settings)}
    clash = sorted(f.name for f in fields(cls.settings) if f.name in taken)
    if clash:
        raise ValueError(f"{cls.name}'s settings {', '.join(clash)} are {taken[clash[0]]}'s flags already")
    if cls.selected_by is not None and cls.selected_by not in {f.name for f in fields(cls.settings)}:
        raise ValueError(f"{cls.name}: selected_by={cls.selected_by!r} is not a field of its settings")
    REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    """Forget a method (a test's own, once it is done)."""
    REGISTRY.pop(name, None)


def drafters() -> list[type[DecodingMethod]]:
    """The registered methods that draft in place of the heads (each chosen by its ``selected_by``)."""
    return [cls for cls in REGISTRY.values() if cls.selected_by is not None]
