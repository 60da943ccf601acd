"""Errors a user can cause: bad config, bad CLI flag, bad file, a setting out of its range.

Entry points catch :class:`UserError` and print its message as one sentence, without a traceback; a
:class:`SettingError` is one that a command line renders under its flags.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

FULL_DISK = frozenset({errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)})
"""The errnos of a write that ran out of room (EDQUOT, a quota, is missing on Windows)."""


class UserError(Exception):
    """A problem the user can fix; the message names the bad value and the fix."""


class SettingError(UserError, ValueError):
    """A setting out of its range or at odds with another (of GenerationConfig, of DistillSettings, of a method's): one
    sentence naming the value and the fix; a UserError, as written (``str()``), where no command renders it under its
    flags.

    ``template`` has a ``{field}`` for each field it names (``values``: field -> its value): ``{top_p}`` shows the
    field and its value, ``{tree:name}`` the field alone, ``{heads:1}`` the field with the value 1. ``str()`` spells
    fields as Python does (``top_p=1.5``); a command line renders the same sentence with its flags (``--top-p 1.5``,
    :func:`mtp.commands.cli.settings_named_by_flags`), a training run with its config's keys. A value that is
    :class:`Trained` is a field of the configuration a model was trained with, which a fix retrains with: the commands
    spell it as the training config's override.
    """

    def __init__(self, template: str, **values: object) -> None:
        self.template, self.values = template, values
        super().__init__(self.render(str, "="))

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(self.values)

    def render(self, name: Callable[[str], str], joiner: str, trained: Callable[[type, str], str] | None = None) -> str:
        """The sentence with each field spelled ``name(field)``, a shown value after ``joiner``; a :class:`Trained`
        field spelled ``trained(owner, field)`` with its value after ``=`` (as the field itself without ``trained``)."""
        named = {}
        for field, value in self.values.items():
            if isinstance(value, Trained):
                spelled = trained(value.owner, field) if trained is not None else field
                named[field] = _Named(spelled, value.value, "=")
            else:
                named[field] = _Named(name(field), value, joiner)
        return self.template.format_map(named)


@dataclass(frozen=True)
class Trained:
    """A :class:`SettingError`'s value of a field of the configuration a model is trained with, not of the run that
    raised it (the fix is to train so): ``owner`` is that field's dataclass (:class:`mtp.model.config.ModelConfig`,
    :class:`mtp.data.packing.TokenizerConfig`). ``str()`` spells it as the field (``share_depth=true``), the commands as
    the training config's override (``model.share_depth=true``: :func:`mtp.commands.cli.training_key`)."""

    owner: type
    value: object


@contextmanager
def settings_named(
    name: Callable[[str], str], joiner: str, trained: Callable[[type, str], str] | None = None
) -> Iterator[None]:
    """A :class:`SettingError` raised inside becomes a UserError, the same sentence with each field spelled
    ``name(field)`` and a shown value after ``joiner`` (:meth:`SettingError.render`): how a command line (its flags) or
    a config (its keys) names the settings the library named by their fields."""
    try:
        yield
    except SettingError as err:
        raise UserError(err.render(name, joiner, trained)) from None


def settings_named_by_keys(
    node: str, trained: Callable[[type, str], str] | None = None
) -> AbstractContextManager[None]:
    """:func:`settings_named` for settings a Hydra config sets under ``node``: ``top_p=1.5`` becomes the override
    ``node.top_p=1.5`` the user wrote (or would write)."""
    return settings_named(lambda field: f"{node}.{field}", "=", trained)


@dataclass
class _Named:
    name: str
    value: object
    joiner: str

    def __format__(self, spec: str) -> str:
        if spec == "name":
            return self.name
        value = spec or self.value
        shown = repr(value).removesuffix(".0") if isinstance(value, float) else str(value)  # -1, as typed, not -1.0
        return f"{self.name}{self.joiner}{shown}"


def literal(text: object) -> str:
    """``text`` as it reads inside a :class:`SettingError`'s template (its braces doubled: a path may hold some)."""
    return str(text).replace("{", "{{").replace("}", "}}")


def first_line(err: BaseException) -> str:
    """The first line of an exception's message, or its type's name when it has none (an empty file's EOFError)."""
    lines = str(err).splitlines()
    return lines[0] if lines else type(err).__name__
