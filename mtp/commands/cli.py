"""What the command-line programs (mtp/commands/, run by scripts/*.py and the mtp-* entry points) share.

- one error handler: a :class:`UserError`, or an ``OSError`` (a disk full, a folder that cannot be written), is one
  sentence on stderr, ``error: ...``, and exit status 2, without a traceback;
- one device choice (``--device auto|cpu|cuda``) and one dtype flag (``--dtype``; its policy is
  :func:`mtp.checkpoint.load.resolve_dtype`'s: auto is bf16 on CUDA, fp32 elsewhere);
- settings as flags: :func:`add_settings` makes a flag of each field of a settings dataclass (its type, default and
  attribute docstring: one field with its docstring in :class:`~mtp.decode.settings.GenerationConfig` is a flag of
  every decoding command), :func:`settings_from` builds it back, and the class alone checks it, its errors
  (:class:`~mtp.errors.SettingError`) named by the flags, ``--field-name``, that the user typed;
- one spelling of a number below its floor: :func:`require_at_least`.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
import re
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeVar

import torch
from omegaconf.errors import InterpolationResolutionError

import mtp
from mtp.benchmarks.results_page import code_commit
from mtp.checkpoint.load import DTYPES
from mtp.data.packing import TokenizerConfig
from mtp.decode.tree_fit import FASTEST
from mtp.errors import FULL_DISK, UserError, settings_named, settings_named_by_keys
from mtp.model.config import ModelConfig

T = TypeVar("T")

PACKAGE_DIR = Path(mtp.__file__).resolve().parent
"""The mtp package this process runs; with ``pip install -e .`` it sits in the checkout, beside conf/."""


def error_sentence(err: UserError | OSError) -> str:
    """The one sentence a user sees: a UserError's own; an OSError's path (when it has one), cause and fix."""
    if isinstance(err, UserError):
        return str(err)
    cause = err.strerror or str(err)
    if err.errno in FULL_DISK:
        fix = "free some disk space or choose another path"
    else:
        fix = "check the path and its permissions, or choose another path"
    where = f"{err.filename} -> {err.filename2}" if err.filename2 is not None else err.filename
    return f"{'' if where is None else f'{where}: '}{cause}; {fix}."


@contextmanager
def errors_reported(cleanup: Callable[[], None] | None = None) -> Iterator[None]:
    """Turn a UserError or OSError raised inside into ``error: <sentence>`` on stderr and exit status 2, after
    ``cleanup`` (e.g. removing what a failed run left); any other exception is a bug and keeps its traceback."""
    try:
        try:
            yield
        except InterpolationResolutionError as err:  # a config resolver's user error, e.g. ${reference_model:}'s
            if isinstance(err.__context__, UserError):
                raise err.__context__ from None
            raise
    except (UserError, OSError) as err:
        if cleanup is not None:
            cleanup()
        print(f"error: {error_sentence(err)}", file=sys.stderr)
        sys.exit(2)


def run_script(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> NoReturn:
    """Run a command's ``main(argv)`` (None: the process's arguments) under :func:`errors_reported`; exit with its
    status."""
    code_commit()  # the commit its results will name: the code imported now, not what the checkout holds later
    with errors_reported():
        status = main(argv)
    sys.exit(status or 0)


@dataclass
class Placement:
    """Where a command runs its model, in which dtype and on how many CPU threads: its ``--device``, ``--dtype`` and
    ``--threads`` (a schema's part, :class:`mtp.commands.schema.Part`, takes any of them;
    :func:`mtp.benchmarks.threads.pin_threads` applies ``threads``)."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """The device: auto is cuda when PyTorch sees one, else cpu."""
    dtype: str = dataclasses.field(default="auto", metadata={"choices": ("auto", *DTYPES)})
    """The weights' dtype: auto is bf16 on cuda, fp32 elsewhere."""
    threads: int = 0
    """CPU threads, pinned to as many CPUs, as llama.cpp's -t (0: PyTorch's own count, unpinned)."""


def add_device_flag(parser: argparse.ArgumentParser, default: str = "auto") -> None:
    parser.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default=default,
        help=f"auto: cuda when PyTorch sees one, else cpu (default: {default})",
    )


def pick_device(name: str, node: str | None = None) -> torch.device:
    """The device of ``--device`` (or of a training config's ``node``'s ``device`` key, which an error names then):
    auto is cuda when PyTorch sees one, else cpu."""
    if name == "cuda" and not torch.cuda.is_available():
        given = "--device " if node is None else f"{node}.device="
        raise UserError(f"{given}cuda was asked for but PyTorch sees no CUDA device; use {given}cpu or auto.")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def add_dtype_flag(parser: argparse.ArgumentParser, default: str = "auto") -> None:
    """--dtype for commands that load a checkpoint (:func:`mtp.checkpoint.load.load_checkpoint` resolves it)."""
    parser.add_argument(
        "--dtype",
        choices=["auto", *DTYPES],
        default=default,
        help=f"the weights' dtype; auto: bf16 on cuda, fp32 elsewhere (default: {default})",
    )


def node_budget(text: str) -> int | str:
    """A tree's node budget on the command line: an integer, or ``fastest`` (:data:`mtp.decode.tree_fit.FASTEST`: the
    size that decodes fastest on this machine); the integer's bound is checked with the other flags."""
    if text == FASTEST:
        return FASTEST
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a node count nor {FASTEST}") from None


def int_list(text: str) -> list[int]:
    """A comma-separated list of positive integers, e.g. 1,2,4,8."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers, e.g. 1,2,4,8") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} has a value below 1; every entry must be a positive integer")
    return values


def node_budgets(text: str) -> list[int | str]:
    """A comma-separated list of tree node budgets: positive integers or ``fastest``, e.g. fastest,8,16."""
    budgets = [v if v == FASTEST else int(v) if v.isdigit() and int(v) > 0 else None for v in text.split(",")]
    if None in budgets:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of node counts (positive integers) or {FASTEST}, e.g. fastest,8,16"
        )
    return budgets


def comma_names(text: str) -> list[str]:
    """A comma-separated list of names, e.g. greedy,sampling."""
    return [entry for entry in text.split(",") if entry]


def list_parser(hint: Any, separator: str | None = None) -> Callable[[str], list] | None:
    """How a list field annotated ``hint`` reads its text (a comma-separated list): positive integers, node budgets
    (integers or ``fastest``), names where its metadata says ``separator=","``; None for a list of strings, which a
    flag takes as several arguments."""
    options = typing.get_args(hint)
    if typing.get_origin(hint) is not list:
        raise TypeError(f"{hint} is not a list type")
    if options == (int,):
        return int_list
    if options == (str,):
        return comma_names if separator == "," else None
    return node_budgets


def listed(value: Any, hint: Any, name: str, separator: str | None = None, given: str | None = None) -> list:
    """A list setting's value (the field ``name``, annotated ``hint``): a list already (parsed from the command line,
    or a config's list), or its text (a config's comma-separated string, read as the flag reads it); text that does
    not read is a UserError naming the flag, or ``given`` (how a config spelled it: ``bench_decode.heads=x``)."""
    if isinstance(value, list | tuple):
        return list(value)
    parse = list_parser(hint, separator)
    if parse is None:
        return [str(value)]
    try:
        return parse(str(value))
    except argparse.ArgumentTypeError as err:
        raise UserError(f"{given or flag_of(name)}: {err}." if given else f"{flag_of(name)} {err}.") from None


def flag_of(name: str) -> str:
    """The flag of a setting or an argument: its name in kebab case (``draft_p_min``: ``--draft-p-min``)."""
    return "--" + name.replace("_", "-")


def attribute_docs(cls: type) -> dict[str, str]:
    """The attribute docstring of each field of ``cls`` that has one: the string literal below it in the class body."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    return {
        field.target.id: doc.value.value
        for field, doc in itertools.pairwise(body)
        if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
        if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)
    }


def plain_type(hint: Any) -> Any:
    """``hint`` without its ``| None``."""
    options = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in options and len(options) == 2:
        return options[0] if options[1] is type(None) else options[1]
    return hint


def choices_of(hint: Any, metadata: Mapping[str, Any]) -> tuple | None:
    """The values a field may take: its metadata's ``choices``, or its Literal type's; None: any of its type."""
    if "choices" in metadata:
        return tuple(metadata["choices"])
    hint = plain_type(hint)
    return typing.get_args(hint) if typing.get_origin(hint) is Literal else None


def _argument_type(hint: Any, field: str, metadata: Mapping[str, Any] = types.MappingProxyType({})) -> dict[str, Any]:
    """argparse's type (and choices, or action) of a field annotated ``hint``: bool, int, float, str, Path, a Literal
    of them, or one of these or None; or a list (:func:`list_parser`: comma-separated, or several arguments). The
    field's metadata may name its ``choices`` (a str field's), its list's ``separator`` (","), its ``metavar``."""
    shown = {"metavar": metadata["metavar"]} if "metavar" in metadata else {}
    if typing.get_origin(plain_type(hint)) is list:  # ``list[X] | None``: a list, or None where not given
        hint = plain_type(hint)
        parse = list_parser(hint, metadata.get("separator"))
        return {"nargs": "+", **shown} if parse is None else {"type": parse, **shown}
    hint = plain_type(hint)
    if hint is bool:
        return {"action": argparse.BooleanOptionalAction}
    choices = choices_of(hint, metadata)
    if choices is not None:
        return {"type": type(choices[0]), "choices": choices, **shown}
    if hint in (int, float, str, Path):
        return {"type": hint, **shown}
    raise TypeError(
        f"{field}: {hint} has no flag; give it a bool, int, float, str, Path or Literal type (or flag=False)"
    )


def _settings_key(cls: type) -> str:
    return f"_settings_of_{cls.__qualname__}"


def add_settings(
    parser: argparse._ActionsContainer,
    cls: type,
    names: Sequence[str] | None = None,
    notes: dict[str, str] | None = None,
    **defaults: Any,
) -> None:
    """Add a flag for each field of the dataclass ``cls``: those in ``names``, or every field whose metadata does not
    say ``flag=False``. A field ``draft_p_min`` is ``--draft-p-min`` (dest ``draft_p_min``), typed as the field (a
    bool is ``--x/--no-x``, a Literal chooses among its values, ``X | None`` takes an X), its default ``defaults``'
    or the field's, its help the first sentence of the field's attribute docstring, then ``notes``' for it. A field
    whose metadata says ``renamed_from`` keeps its old flag, which refuses in one sentence naming the new one. Other
    metadata: ``positional`` (an argument, not a flag), ``required``, ``aliases`` (more flags for it), ``metavar``,
    ``choices`` and a list's ``separator`` (:func:`_argument_type`). :func:`settings_from` builds ``cls`` back from
    the parsed flags; :func:`mtp.commands.schema.node_values` reads a config's node of the same fields."""
    hints, docs, notes = typing.get_type_hints(cls), attribute_docs(cls), notes or {}
    if names is None:
        chosen = [field for field in fields(cls) if field.metadata.get("flag", True)]
    else:
        chosen = [field for field in fields(cls) if field.name in names]
        if len(chosen) < len(names):
            raise TypeError(f"{cls.__name__} has no field {', '.join(set(names) - {f.name for f in chosen})}")
    defaults_given = set(defaults)
    for field in chosen:
        if field.name not in docs:
            raise TypeError(f"{cls.__name__}.{field.name} has no docstring below it to be its flag's help")
        default = defaults.pop(field.name, field.default)
        sentence = re.split(r"(?<=\.)\s+(?=[A-Z])", " ".join(docs[field.name].split()))[0].removesuffix(".")
        text = "; ".join([sentence.replace("``", ""), *([notes[field.name]] if field.name in notes else [])])
        if field.default_factory is not dataclasses.MISSING and field.name not in defaults_given:
            default = field.default_factory()
        if field.metadata.get("positional") or field.metadata.get("required"):
            pass
        elif isinstance(default, list):  # as it is typed: comma-separated, or several arguments
            separator = "," if list_parser(hints[field.name], field.metadata.get("separator")) else " "
            text += f" (default: {separator.join(map(str, default))})" if default else ""
        elif default not in (None, "") and not isinstance(default, bool):  # BooleanOptionalAction shows its own
            text += f" (default: {default})"
        typed = _argument_type(hints[field.name], field.name, field.metadata)
        if field.metadata.get("positional"):
            parser.add_argument(field.name, help=text.replace("%", "%%"), **typed)
        else:
            extra = {"required": True} if field.metadata.get("required") else {"default": default}
            parser.add_argument(
                flag_of(field.name), *field.metadata.get("aliases", ()), dest=field.name, help=text.replace("%", "%%"),
                **extra, **typed,
            )  # fmt: skip
        if "renamed_from" in field.metadata:
            add_renamed_flag(parser, flag_of(field.metadata["renamed_from"]), flag_of(field.name))
    if defaults:
        raise TypeError(f"defaults for fields that got no flag: {', '.join(defaults)}")
    key = _settings_key(cls)
    parser.set_defaults(**{key: (*(parser.get_default(key) or ()), *(f.name for f in chosen))})


class _Renamed(argparse.Action):
    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option: str | None = None) -> None:
        raise UserError(f"{option} is now {self.default}; use {self.default} {values}.")


def add_renamed_flag(parser: argparse._ActionsContainer, old: str, new: str) -> None:
    """A flag that was renamed: not in the help; given, one sentence naming the new flag with the value typed."""
    parser.add_argument(old, action=_Renamed, default=new, dest=f"_renamed_{old}", help=argparse.SUPPRESS)


def settings_from(args: argparse.Namespace, cls: type[T], **values: Any) -> T:
    """``cls`` made of the flags :func:`add_settings` added and ``values`` (which set other fields or override flags),
    checked by ``cls`` itself: a :class:`SettingError` becomes a UserError naming the flags."""
    flags = {name: getattr(args, name) for name in getattr(args, _settings_key(cls), ())}
    with settings_named_by_flags():
        return cls(**(flags | values))


@contextmanager
def settings_named_by_flags(flags: Mapping[str, str] | None = None) -> Iterator[None]:
    """A :class:`SettingError` raised inside (by a settings class, or by ``generate``'s checks of them) becomes a
    UserError, the same sentence with each field spelled as its flag: ``--top-p 1.5`` for ``top_p=1.5``. ``flags``:
    the flag of each setting whose flag is not its name in kebab case (distill's ``max_new_tokens``: ``--new-tokens``).
    """
    named = flags or {}
    with settings_named(lambda field: named.get(field, flag_of(field)), " ", training_key):
        yield


def settings_named_by_config(node: str, keys: Mapping[str, str] | None = None) -> AbstractContextManager[None]:
    """:func:`settings_named_by_flags` for a command a training run's config asks for (its ``node``: ``eval_task``,
    ``bench_decode``): the same sentence with each field spelled as that node's key (``eval_task.heads=3``). ``keys``:
    the key of each setting whose key is not its name (bench_decode's ``chat_template``: ``prompt_format=chat``)."""
    if not keys:
        return settings_named_by_keys(node, training_key)
    return settings_named(lambda field: f"{node}.{keys.get(field, field)}", "=", training_key)


TRAINING_NODES: dict[type, str] = {ModelConfig: "model", TokenizerConfig: "data.tokenizer"}
"""Where each configuration a model is trained with sits in the training run's Hydra config (conf/train.yaml)."""


def training_key(owner: type, field: str) -> str:
    """The training config's key of ``owner``'s ``field`` (a :class:`~mtp.errors.Trained` value's): ``model.vocab_size``
    for :class:`~mtp.model.config.ModelConfig`'s ``vocab_size``."""
    return f"{TRAINING_NODES[owner]}.{field}"


def require_at_least(args: argparse.Namespace, least: int, *names: str, node: str | None = None) -> None:
    """Each named argument (None: not given) at least ``least``, or a UserError naming its flag (its key, where a
    training run's config ``node`` set the flags' values: ``eval_task.problems=0``)."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < least:
            limit = " (0: no limit)" if least == 0 else ""
            given = f"{flag_of(name)} {value}" if node is None else f"{node}.{name}={value}"
            raise UserError(f"{given} must be at least {least}{limit}.")


def checkout_root() -> Path:
    """The repository checkout this mtp was installed from with ``pip install -e .``: the folder of mtp/ and conf/
    (Hydra's configs stay at the top of the repository, where lightning-hydra-template keeps them)."""
    root = PACKAGE_DIR.parent
    if not (root / "conf" / "train.yaml").is_file():
        raise UserError(
            f"the Hydra configs (conf/) are not beside the mtp package in {root}: mtp is installed without its "
            "repository; clone the repository and install it with pip install -e . from a checkout."
        )
    return root
