"""One schema for a command's settings: dataclasses whose fields are both its flags and the keys of the training
config's node that runs it (``eval_task:``, ``bench_decode:``, ``distill:`` in conf/), so that a setting is declared
once, with its type, default and help (its attribute docstring), and a config's node reaches the command's settings
without going through argparse.

A command's schema is a sequence of :class:`Part`: a settings dataclass, the fields of it the command takes (None:
every field whose metadata does not say ``flag=False``), their defaults on that command and notes for their help.
:func:`add_parts` makes the flags (:func:`mtp.commands.cli.add_settings` for each part), and :func:`node_values` reads
a config's node of the same fields, typed as the fields are (a list from a list or its comma-separated text, a path
from text, a choice among its choices), every key it leaves out at its default: either way the command gets the same
values by name. A key that is no field of the schema, or a value of the wrong type, is one sentence naming the key as
the config spells it (``eval_task.problem=5``).
"""

from __future__ import annotations

import argparse
import difflib
import typing
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from mtp.commands.cli import add_settings, choices_of, listed, plain_type, settings_named_by_flags
from mtp.decode.plan import PART_NAMES
from mtp.decode.settings import PARTS, owner_of
from mtp.errors import UserError


@dataclass(frozen=True)
class Part:
    """A settings dataclass as a command takes it: ``names`` (None: every field with a flag), their ``defaults`` there
    (over the fields' own), ``notes`` added to their help, and the ``title`` of their group in --help (None: none)."""

    cls: type
    names: tuple[str, ...] | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)
    notes: Mapping[str, str] = field(default_factory=dict)
    title: str | None = None

    def fields(self) -> list[Field]:
        """The fields of ``cls`` this part takes, in their order."""
        if self.names is None:
            return [f for f in fields(self.cls) if f.metadata.get("flag", True)]
        return [f for f in fields(self.cls) if f.name in self.names]

    def default(self, f: Field) -> Any:
        """The field's default in this part: its given default, or its own (MISSING: it has none)."""
        if f.name in self.defaults:
            return self.defaults[f.name]
        if f.default_factory is not MISSING:
            return f.default_factory()
        return f.default


def add_parts(parser: argparse.ArgumentParser, parts: Sequence[Part]) -> None:
    """The flags of every part, each in its group where it has a title (parts of the same title share one group)."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for part in parts:
        if part.title and part.title not in groups:
            groups[part.title] = parser.add_argument_group(part.title)
        where = groups[part.title] if part.title else parser
        add_settings(where, part.cls, part.names, dict(part.notes), **part.defaults)


def decoding_schema(
    names: Sequence[str] | None = None,
    notes: Mapping[str, str] | None = None,
    title: str | None = None,
    **defaults: Any,
) -> tuple[Part, ...]:
    """The parts of a decoding run's settings a command takes (:data:`mtp.decode.settings.PARTS`: the sampling and
    acceptance settings, the heads', the drafts', the step's): those of ``names``, or every flag of every part, in
    one group ``title``; ``notes`` and ``defaults`` by field, whichever part owns it (the schema's form of
    :func:`add_parts` makes their flags; :func:`decoding_parts` makes the parts of their values."""
    notes = notes or {}
    chosen = []
    for cls in PARTS:
        own = {f.name for f in fields(cls)}
        picked = None if names is None else tuple(name for name in names if name in own)
        if picked == ():
            continue
        mine = {k: v for k, v in defaults.items() if k in own}
        chosen.append(Part(cls, picked, mine, {k: v for k, v in notes.items() if k in own}, title))
    unknown = (set(names or ()) | set(defaults) | set(notes)) - {f.name for cls in PARTS for f in fields(cls)}
    if unknown:
        raise TypeError(f"no decoding setting is named {', '.join(sorted(unknown))}")
    return tuple(chosen)


COMPILED_BY_DEFAULT = (
    "default: compiled on a CPU (a short warm-up decode compiles it before anything is timed, its time said on "
    "stderr; --no-compile decodes eagerly at once), eager on CUDA (where --cuda-graphs captures the steps)"
)
"""The note of a decoding command's --compile, whose default (None) :func:`compiled` resolves."""
COMPILED_ON = ("cpu",)
"""The device types whose decoding step the commands compile unless told not to: a CPU's compiled step decodes faster
than its eager one; on CUDA, captured steps (``cuda_graphs``) are the fast path."""


def compiled(asked: bool | None, device: torch.device) -> bool:
    """The step's ``compile`` of --compile or --no-compile (``asked``), or, with neither (None), of the device: compiled
    on the device types of :data:`COMPILED_ON`."""
    return device.type in COMPILED_ON if asked is None else asked


def decoding_parts(parts: Sequence[Part], values: Mapping[str, Any], **given: Any) -> dict[str, Any]:
    """The parts of a decoding run's plan (:class:`~mtp.decode.plan.Plan`'s ``sampling``, ``heads``, ``drafts``,
    ``step``) made of the values (``values``: the parsed flags, or :func:`node_values`') of the fields ``parts``
    (:func:`decoding_schema`'s) take, and ``given`` (each to the part that owns it, over its value), each checked by
    itself, its errors named by the flags; the plan is made of them and its drafter once the checkpoint is read
    (``Plan(**parts, drafter=...)``), and checks where they meet."""
    made = {}
    with settings_named_by_flags():
        for cls in PARTS:
            own = {name: value for name, value in given.items() if owner_of(name) is cls}
            made[PART_NAMES[cls]] = cls(**(part_values(parts, cls, values) | own))
    return made


def part_values(parts: Sequence[Part], cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """The values by name (``values``: the parsed flags, or :func:`node_values`') of the fields of ``cls`` that
    ``parts`` take: what a command makes ``cls`` of (``cls(**part_values(SCHEMA, cls, values))``), its other fields
    at their own defaults."""
    return {f.name: values[f.name] for part in parts if part.cls is cls for f in part.fields()}


def node_values(parts: Sequence[Part], node: Mapping[str, Any], where: str, **given: Any) -> dict[str, Any]:
    """The settings of every part by name as a training config's ``node`` (its name ``where``: ``eval_task``) sets
    them, each read as its field is typed, over the parts' defaults; ``given``: values the config does not choose (the
    checkpoint the run will write). A key that is no field's, or that names one of ``given``, is a UserError."""
    values: dict[str, Any] = dict(given)
    owners: dict[str, tuple[Part, Field]] = {}
    for part in parts:
        for f in part.fields():
            owners[f.name] = (part, f)
            if f.name not in given:
                values[f.name] = part.default(f)
    for key in node:
        if key not in owners or key in given:
            known = sorted(set(owners) - set(given))
            near = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {where}.{near[0]}?" if near else f"its keys are {', '.join(known)}."
            raise UserError(f"{where}.{key} is not a setting of {where}; {hint}")
    for key, value in node.items():
        part, f = owners[key]
        values[key] = read_value(value, typing.get_type_hints(part.cls)[key], f, f"{where}.{key}")
    missing = [name for name, value in values.items() if value is MISSING]
    if missing:
        raise UserError(f"{where}.{missing[0]} is not set; set {where}.{missing[0]}=VALUE in the config.")
    return values


def read_value(value: Any, hint: Any, f: Field, key: str) -> Any:
    """A config's ``value`` of the field ``f`` (annotated ``hint``, its key ``key``) as the field is typed; one that
    does not read is a UserError naming ``key`` and what it takes."""
    optional = plain_type(hint) is not hint
    if value is None:
        if optional or f.default is None:
            return None
        raise UserError(f"{key} cannot be null; give it a value or leave it out for its default.")
    hint = plain_type(hint)
    if typing.get_origin(hint) is list:  # a list, or its comma-separated text (``X | None``: an X, or null)
        return listed(value, hint, f.name, f.metadata.get("separator"), given=f"{key}={value}")
    choices = choices_of(hint, f.metadata)
    if choices is not None:
        if value not in choices:
            raise UserError(f"{key}={value} is not one of {', '.join(map(str, choices))}; choose one of them.")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise UserError(f"{key}={value} is not true or false; write {key}=true or {key}=false.")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{key}={value} is not a whole number; give one, such as {key}=8.")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UserError(f"{key}={value} is not a number; give one, such as {key}=0.5.")
        return float(value)
    if hint is Path:
        if not isinstance(value, str | Path):
            raise UserError(f"{key}={value} is not a path; give a file or folder name.")
        return Path(value)
    if hint is str:
        if isinstance(value, list | tuple):  # a config's list for comma-separated text: [1, 5] for 1,5
            return ",".join(map(str, value))
        if isinstance(value, dict | Mapping):
            raise UserError(f"{key} is a mapping; give it text.")
        return str(value)
    if isinstance(hint, type) and isinstance(value, hint):
        return value
    raise TypeError(f"{f.name}: {hint} cannot be read from a config")
