"""How the commands show the decoding methods (:mod:`mtp.decode.methods`, the registry): each method's flags, on
decode's parser and on bench_decode's, and its settings read back from them. A method is known here only by its
name, for what the commands show differently (bench_decode's list flags, such as --gammas and --skip-layers with
several sets); any other method's flags are its settings' fields (:func:`~mtp.commands.cli.add_settings`)."""

from __future__ import annotations

import argparse
from dataclasses import fields

from mtp.benchmarks.cli import int_list, node_budgets
from mtp.commands.cli import add_settings, flag_of, settings_from, settings_named_by_flags
from mtp.decode.methods import DecodingMethod, Sweep, drafters
from mtp.decode.methods.draft_model import DraftModelSettings
from mtp.decode.methods.layer_skip import LayerSkipSettings
from mtp.decode.tree_fit import FASTEST, FASTEST_SIZES
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


def add_method_flags(parser: argparse.ArgumentParser, method: type[DecodingMethod]) -> None:
    """A drafting method's flags on decode's parser: a group of one flag per setting, titled by its name and its
    docstring's first paragraph."""
    summary = (method.__doc__ or method.name).split("\n\n")[0].rstrip(".")
    add_settings(parser.add_argument_group(f"{method.name}: {' '.join(summary.split())}"), method.settings)


def add_heads_bench_flags(parser: argparse.ArgumentParser) -> None:
    """--tree, --tree-nodes and --sequences: the flags of the heads' variants' rows on bench_decode's parser."""
    parser.add_argument("--tree", default="auto", help="for tree/typical: a JSON tree, or auto (fitted per mode)")
    parser.add_argument(
        "--tree-nodes",
        type=node_budgets,
        default=[FASTEST],
        help=f"node budgets of the fitted trees, one tree row each (e.g. fastest,8,16); {FASTEST}: the size of 1 to "
        f"{FASTEST_SIZES[-1]} nodes whose steps, timed here at batch 1, give the most expected tokens per second",
    )
    parser.add_argument(
        "--sequences",
        type=int_list,
        default=[2, 4],
        help="for spectr: draft sequences per step (SpecTr's k), one row each (with draft: the draft model's too)",
    )


def _draft_bench_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("draft, hybrid and staged: a draft model")
    add_settings(group, DraftModelSettings, notes={"staged": "for staged (default: lookup)"})
    group.add_argument("--gammas", type=int_list, default=list(range(1, 9)), help="for draft: drafts per step")


def add_skip_search_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of --skip-layers auto's search (bench_decode's; decode has them among the method's settings)."""
    search = parser.add_argument_group("--skip-layers auto: the skip set's search")
    add_settings(search, LayerSkipSettings, ("skip_sublayers", "search_trials", "search_seconds"))


def _layer_skip_bench_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--skip-layers",
        nargs="+",
        default=["auto"],
        help="for layerskip: sets to skip, a row each: blocks (2,4,5), sublayers (3a,5m: attention, MLP), or "
        "auto: searched per mode (with --skip-sublayers, a row for the block search and one for the sublayer "
        "search)",
    )
    add_skip_search_flags(parser)


def _lookup_bench_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt-lookup", type=int, default=3, help="for lookup: the longest n-gram matched")


BENCH_FLAGS = {"draft": _draft_bench_flags, "layerskip": _layer_skip_bench_flags, "lookup": _lookup_bench_flags}
"""bench_decode's flags of the drafting methods it shows otherwise than decode does, by name."""


def add_bench_flags(parser: argparse.ArgumentParser, method: type[DecodingMethod]) -> None:
    """A drafting method's flags on bench_decode's parser: its own there (:data:`BENCH_FLAGS`), or decode's."""
    BENCH_FLAGS.get(method.name, lambda parser: add_method_flags(parser, method))(parser)


def bench_settings_of(args: argparse.Namespace, method: type[DecodingMethod]) -> object:
    """A method's settings from bench_decode's flags (checked by its settings class): those of :data:`BENCH_FLAGS`
    by their fields' names (layer skip's sets are the sweep's, and its settings hold auto where a set is searched,
    since the search's flags need one, else the first set, and none where --methods has no layerskip), any other's
    from the flags its settings made."""
    if method.name not in BENCH_FLAGS:
        return settings_from(args, method.settings)
    values = {f.name: getattr(args, f.name) for f in fields(method.settings) if hasattr(args, f.name)}
    if method.name == "layerskip":
        sets = args.skip_layers if method.name in args.methods else [None]
        values["skip_layers"] = "auto" if "auto" in sets else sets[0]
    with settings_named_by_flags():
        return method.settings(**values)


def sweep_from(args: argparse.Namespace) -> Sweep:
    """The sweep of bench_decode's list flags (a value missing from the flags: the sweep's default)."""
    return Sweep(**{f.name: getattr(args, f.name) for f in fields(Sweep) if hasattr(args, f.name)})
