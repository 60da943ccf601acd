"""A drafting method as one object: a way of drafting that replaces the heads' drafts (a draft model, layer skip,
prompt lookup, or one of your own) is a :class:`DraftingMethod` subclass, registered by name with :func:`register`.

Its ``settings`` dataclass is its flags (each field, typed and with an attribute docstring, is a flag of
``decode`` and ``bench_decode``: :func:`mtp.commands.cli.add_settings`); one of them, ``selected_by``, chooses it on
decode's command line; :meth:`DraftingMethod.proposer` builds the :class:`~mtp.decode.proposers.Proposer` that drafts,
and :meth:`DraftingMethod.bench_rows` the benchmark's rows of it. The commands know methods only through the registry,
so a method is one module (or one test file): a Proposer, a settings dataclass, a DraftingMethod, ``@register``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import ClassVar

import torch

from mtp.checkpoint.load import LoadedCheckpoint
from mtp.commands.cli import add_settings, flag_of, settings_from
from mtp.decode.proposal import DEFAULT_GAMMA, Proposer
from mtp.decode.settings import Drafted
from mtp.errors import UserError


@dataclass
class Target:
    """What a method's proposer is built for: the loaded target, the decoding settings with the drafts per step asked
    for (``config.gamma``), where and how it runs."""

    loaded: LoadedCheckpoint
    config: Drafted
    device: torch.device
    dtype: str = "auto"
    """The --dtype the target was loaded with (a draft checkpoint is loaded the same way)."""
    compile: bool = False


@dataclass
class DrafterSettings:
    gamma: int = DEFAULT_GAMMA
    """Drafts per step from a drafter (a draft model, layer skip, prompt lookup)."""


BenchRow = tuple[str, Drafted, Proposer]
"""A benchmark row of a method: its label (the method's name, or a variant's, such as 'draft spectr'), the decoding
settings it runs with and the proposer that drafts."""


class DraftingMethod:
    """A way of drafting that replaces the heads' drafts, built from the flags its ``settings`` make."""

    name: ClassVar[str]
    """Its name: the statistics' ``method`` (its proposer's) and bench_decode's ``--methods`` entry."""
    settings: ClassVar[type]
    """Its settings dataclass: every field a flag (a type add_settings knows, a docstring below it)."""
    selected_by: ClassVar[str]
    """The field of ``settings`` whose flag chooses the method on decode's command line (its default is None)."""
    beside_heads: ClassVar[bool] = False
    """Whether its drafts can be verified beside the heads' in one step (a hybrid, with --self-speculative)."""
    bench_names: ClassVar[tuple[str, ...]] = ()
    """bench_decode's --methods entries it answers for (empty: its name alone)."""
    markers: ClassVar[dict[str, str]] = {}
    """The benchmark plot's matplotlib marker of each of its rows' labels (a label without one gets a spare)."""
    gamma_series: ClassVar[dict[str, str]] = {}
    """Its rows' labels plotted as a line over gamma (one per drafts-per-step setting), each with its legend text."""
    predicted: ClassVar[tuple[str, ...]] = ()
    """Its rows' labels whose speed-up Leviathan et al.'s formula predicts from their acceptance and draft cost (a
    draft model's chain), reported beside the measured one."""

    @classmethod
    def flag(cls) -> str:
        return flag_of(cls.selected_by)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return cls.bench_names or (cls.name,)

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser, bench: bool = False) -> None:
        """Its flags on decode's (``bench`` False) or bench_decode's parser: one flag per setting by default."""
        summary = (cls.__doc__ or cls.name).split("\n\n")[0].rstrip(".")  # the docstring's first paragraph
        add_settings(parser.add_argument_group(f"{cls.name}: {' '.join(summary.split())}"), cls.settings)

    @classmethod
    def selected(cls, args: argparse.Namespace) -> bool:
        """Whether decode's flags choose it."""
        return getattr(args, cls.selected_by, None) is not None

    @classmethod
    def check(cls, args: argparse.Namespace, chosen: bool) -> None:
        """Its flags' ranges and combinations, before anything is loaded (``chosen``: it drafts in this run; a flag of
        its own given without it is refused here). A UserError names the flag."""
        if chosen:
            settings_from(args, cls.settings)  # the settings check themselves

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.options = settings_from(args, self.settings)
        """Its settings, as given."""

    def proposer(self, target: Target) -> Proposer:
        """The proposer that drafts for ``target`` (a search, a fit or a load happens here)."""
        raise NotImplementedError

    def drafter(self, target: Target) -> Proposer:
        """:meth:`proposer`, drafting the ``target.config.gamma`` tokens a step the flags ask for."""
        return self.proposer(target).with_gamma(target.config.gamma)

    def bench_gamma(self) -> int:
        """The most drafts a step of its benchmark rows verifies (their memory is checked before any runs)."""
        return self.args.gamma

    def bench_rows(self, target: Target, methods: list[str], drafted: Callable[[int], Drafted]) -> list[BenchRow]:
        """Its rows in a benchmark of ``methods`` (the --methods entries, its own among them): ``drafted(gamma)`` is
        the mode's decoding settings drafting ``gamma`` per step with a drafter (its proposer drafts as many: give it
        ``gamma``, or :meth:`~mtp.decode.proposers.Proposer.with_gamma`). By default one row at --gamma."""
        config = drafted(self.args.gamma)
        return [(self.name, config, self.drafter(Target(target.loaded, config, target.device, target.dtype,
                                                          target.compile)))]  # fmt: skip


REGISTRY: dict[str, type[DraftingMethod]] = {}
"""Every registered method by name, in the order registered (the built-in ones first)."""


def register(cls: type[DraftingMethod]) -> type[DraftingMethod]:
    """Register a method (as a class decorator); a second method of the same name, or whose settings share a field
    with another's, is refused (their flags would clash)."""
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise ValueError(f"a drafting method named {cls.name!r} is registered already")
    taken = {f.name: other.name for other in REGISTRY.values() if other is not cls for f in fields(other.settings)}
    clash = sorted(f.name for f in fields(cls.settings) if f.name in taken)
    if clash:
        raise ValueError(f"{cls.name}'s settings {', '.join(clash)} are {taken[clash[0]]}'s flags already")
    if cls.selected_by not in {f.name for f in fields(cls.settings)}:
        raise ValueError(f"{cls.name}: selected_by={cls.selected_by!r} is not a field of its settings")
    REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    """Forget a method (a test's own, once it is done)."""
    REGISTRY.pop(name, None)


def chosen_methods(args: argparse.Namespace) -> list[type[DraftingMethod]]:
    """The methods decode's flags choose (at most one may be)."""
    chosen = [cls for cls in REGISTRY.values() if cls.selected(args)]
    if len(chosen) > 1:
        flags = " and ".join(cls.flag() for cls in chosen)
        raise UserError(f"{flags} each choose who drafts; give one of them.")
    return chosen


def method_flags(conjunction: str = "and") -> str:
    """Every method's selecting flag, as a list in a sentence: '--draft, --skip-layers and --prompt-lookup'."""
    flags = [cls.flag() for cls in REGISTRY.values()]
    return flags[0] if len(flags) == 1 else f"{', '.join(flags[:-1])} {conjunction} {flags[-1]}"
