"""A decoding method as one object: a way of drafting (the target's heads, a draft model, layer skip, prompt lookup,
or one of your own) is a :class:`DecodingMethod` subclass, registered by name with :func:`register`.

Its ``settings`` dataclass holds what it is asked (each field typed, with an attribute docstring, and checked by the
dataclass itself: a :class:`~mtp.errors.SettingError`); one field, ``selected_by``, chooses it where a run names who
drafts. :meth:`DecodingMethod.proposer` builds the :class:`~mtp.decode.plan.Proposer` that drafts (the method's own
class, in its module); a plan holds the method of its settings until it is built (:class:`~mtp.decode.plan.Drafting`),
and asks the method's refusals of it (:meth:`DecodingMethod.check_plan`) before that. The decoding command knows
methods only through :data:`REGISTRY`: it makes each method's flags of its settings. So a method is one module here
(or one test file): a Proposer, a settings dataclass, a DecodingMethod, ``@register``; the layers above may add a part
of their own, registered under the same name.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

import torch

from mtp.checkpoint.load import LoadedCheckpoint
from mtp.decode.plan import DEFAULT_GAMMA, Plan, Proposer
from mtp.decode.settings import DraftSettings, GenerationConfig, HeadsSettings, StepSettings


def to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


@dataclass
class Target:
    """What a method's proposer is built for: the loaded target and where it runs; the parts of the run's plan that
    the proposer joins (:meth:`plan`, :meth:`drafting`); the drafts per step asked of a drafter; where a search or a
    fit reports its progress."""

    loaded: LoadedCheckpoint
    device: torch.device
    sampling: GenerationConfig = field(default_factory=GenerationConfig)
    heads: HeadsSettings = field(default_factory=HeadsSettings)
    """The heads' settings of the run (where several methods' runs are compared: their chain at the largest k)."""
    drafts: DraftSettings = field(default_factory=DraftSettings)
    step: StepSettings = field(default_factory=StepSettings)
    gamma: int = DEFAULT_GAMMA
    """Drafts per step asked of a drafter (the run's ``gamma``)."""
    dtype: str = "auto"
    """The dtype the target was loaded with (a draft checkpoint is loaded the same way)."""
    log: Callable[[str], None] = to_stderr
    """Where a search's or a fit's progress and choice are written (a line each)."""

    @classmethod
    def of(cls, loaded: LoadedCheckpoint, plan: Plan, device: torch.device, **values: Any) -> Target:
        """The target of ``plan``'s parts and its drafter's gamma (the drafter is not carried: a method builds its
        own)."""
        values = {"gamma": plan.gamma or DEFAULT_GAMMA, **values}
        return cls(loaded, device, plan.sampling, plan.heads, plan.drafts, plan.step, **values)

    @property
    def compile(self) -> bool:
        return self.step.compile

    def plan(self, drafter: Proposer | None = None) -> Plan:
        """The run's plan with ``drafter`` (beside heads that draft too: a hybrid step; None: the heads alone)."""
        return Plan(self.sampling, self.heads, drafter, self.drafts, self.step)

    def drafting(self, drafter: Proposer) -> Plan:
        """The run's plan with ``drafter`` drafting instead of the heads."""
        return Plan(self.sampling, replace(self.heads, heads=1), drafter, self.drafts, self.step)


@dataclass
class DrafterSettings:
    gamma: int = DEFAULT_GAMMA
    """Drafts per step from a drafter (a draft model, layer skip, prompt lookup)."""


class DecodingMethod:
    """A way of drafting, built from its settings."""

    name: ClassVar[str]
    """Its name: the statistics' ``method`` (its proposer's), and the name a part of it in a layer above registers
    under."""
    settings: ClassVar[type]
    """Its settings dataclass: every field a flag (a type add_settings knows, a docstring below it)."""
    selected_by: ClassVar[str | None]
    """The field of ``settings`` that chooses it in place of the heads (its default is None); None: the heads
    themselves, whom a command chooses by its own flag."""
    beside_heads: ClassVar[bool] = False
    """Whether its drafts can be verified beside the heads' in one step (a hybrid)."""

    def __init__(self, options: object) -> None:
        assert isinstance(options, self.settings), f"{self.name} is built from a {self.settings.__name__}"
        self.options = options
        """Its settings, as given."""

    def proposer_class(self) -> type[Proposer]:
        """The class of the proposer it builds of its settings (what :meth:`check_plan` asks)."""
        return Proposer

    def check_plan(self, plan: Plan) -> None:
        """Its refusals of ``plan``, before anything is built: its proposer class's
        (:meth:`~mtp.decode.plan.Proposer.check_plan`)."""
        self.proposer_class().check_plan(plan)

    def proposer(self, target: Target) -> Proposer:
        """The proposer that drafts for ``target`` (a search, a fit or a load happens here)."""
        raise NotImplementedError

    def drafter(self, target: Target) -> Proposer:
        """:meth:`proposer`, drafting the ``target.gamma`` tokens a step asked for."""
        return self.proposer(target).with_gamma(target.gamma)


REGISTRY: dict[str, type[DecodingMethod]] = {}
"""Every registered method by name, in the order registered (the built-in ones first: the heads, then the drafters)."""


def flag_fields(cls: type[DecodingMethod]) -> set[str]:
    """The names of the flags a method's settings make."""
    return {f.name for f in fields(cls.settings)}


def register(cls: type[DecodingMethod]) -> type[DecodingMethod]:
    """Register a method (as a class decorator); a second method of the same name, or whose settings share a field with
    another's, is refused (their flags would clash)."""
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise ValueError(f"a decoding method named {cls.name!r} is registered already")
    taken = {name: other.name for other in REGISTRY.values() if other is not cls for name in flag_fields(other)}
    clash = sorted(name for name in flag_fields(cls) if name in taken)
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
