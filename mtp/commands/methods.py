"""How the commands show the decoding methods (:mod:`mtp.decode.methods`, the registry, and their benchmark parts,
:mod:`mtp.benchmarks.methods`): each method's flags, on decode's parser and on bench_decode's, and its settings read
back from them. A method is known here only through what its parts declare: its settings (decode's flags, bench_decode's
too), its benchmark part's sweep (bench_decode's alone: list fields take several values, a row each; a sweep field
named as a setting takes that setting's flag there) and its settings' defaults on a benchmark
(:attr:`~mtp.benchmarks.methods.MethodBench.bench_defaults`)."""

from __future__ import annotations

import argparse
import typing
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from mtp.benchmarks.methods import MethodBench
from mtp.commands.cli import add_settings, flag_of, listed, settings_named_by_flags
from mtp.commands.schema import Part, part_values
from mtp.decode.methods import DecodingMethod, drafters
from mtp.errors import UserError


def flag(method: type[DecodingMethod]) -> str:
    """The flag that chooses a drafting method: its ``selected_by``'s."""
    return flag_of(method.selected_by)


def method_flags(conjunction: str = "and") -> str:
    """Every drafting method's selecting flag, as a list in a sentence: '--draft, --skip-layers and --prompt-lookup'."""
    flags = [flag(cls) for cls in drafters()]
    return flags[0] if len(flags) == 1 else f"{', '.join(flags[:-1])} {conjunction} {flags[-1]}"


def chosen_methods(args: argparse.Namespace) -> list[type[DecodingMethod]]:
    """The drafting methods decode's flags choose (at most one may be)."""
    chosen = [cls for cls in drafters() if getattr(args, cls.selected_by, None) is not None]
    if len(chosen) > 1:
        flags = " and ".join(flag(cls) for cls in chosen)
        raise UserError(f"{flags} each choose who drafts; give one of them.")
    return chosen


def group_title(method: type[DecodingMethod]) -> str:
    """A method's flags' group: its name and its docstring's first paragraph."""
    summary = (method.__doc__ or method.name).split("\n\n")[0].rstrip(".")
    return f"{method.name}: {' '.join(summary.split())}"


def add_method_flags(parser: argparse.ArgumentParser, method: type[DecodingMethod]) -> None:
    """A drafting method's flags on decode's parser: a group of one flag per setting."""
    add_settings(parser.add_argument_group(group_title(method)), method.settings)


def swept(bench: type[MethodBench]) -> set[str]:
    """The names of a method's sweep fields."""
    return {f.name for f in fields(bench.sweep)} if bench.sweep is not None else set()


def bench_parts(bench: type[MethodBench]) -> tuple[Part, ...]:
    """A method's parts of bench_decode's schema (:mod:`mtp.commands.schema`), in one group: its settings' (a
    drafter's; the heads' are the decoding settings) but those its sweep names, at the benchmark's defaults, and its
    benchmark part's sweep's."""
    method, parts = bench.method, []
    if method.selected_by is not None:
        names = tuple(f.name for f in fields(method.settings) if f.name not in swept(bench))
        parts.append(Part(method.settings, names, dict(bench.bench_defaults), title=group_title(method)))
    if bench.sweep is not None:
        parts.append(Part(bench.sweep, title=group_title(method)))
    return tuple(parts)


def bench_settings_of(
    values: Mapping[str, Any], bench: type[MethodBench], chosen: list[str], schema: Sequence[Part]
) -> tuple[object, object | None]:
    """A method's settings and sweep on bench_decode, of its flags' values by name (``values``: the parsed flags, or a
    config's keys, whose list values may be comma-separated text), each checked by its class, errors named by the
    flags; a drafter's settings of its flags there (:meth:`~mtp.benchmarks.methods.MethodBench.bench_settings`, told
    whether ``chosen``, the --methods entries, benchmark it), the heads' of the decoding flags (those of its fields
    bench_decode's ``schema`` takes)."""
    sweep, method = None, bench.method
    if bench.sweep is not None:
        hints = typing.get_type_hints(bench.sweep)
        given = {f.name: values[f.name] for f in fields(bench.sweep)}
        given = {name: listed(value, hints[name], name) if typing.get_origin(hints[name]) is list else value
                 for name, value in given.items()}  # fmt: skip
        with settings_named_by_flags():
            sweep = bench.sweep(**given)
    if method.selected_by is None:
        with settings_named_by_flags():
            return method.settings(**part_values(schema, method.settings, values)), sweep
    names = [f.name for f in fields(method.settings) if f.name not in swept(bench)]
    with settings_named_by_flags():
        rows = sweep if set(bench.names()) & set(chosen) else None
        return bench.bench_settings({name: values[name] for name in names}, rows), sweep
