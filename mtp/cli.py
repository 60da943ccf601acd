"""What the command-line programs (mtp/commands/, run by scripts/*.py and the mtp-* entry points) share.

- one error handler: a :class:`UserError`, or an ``OSError`` (a disk full, a folder that cannot be written), is one
  sentence on stderr, ``error: ...``, and exit status 2, without a traceback;
- one device choice (``--device auto|cpu|cuda``) and one dtype flag (``--dtype``; its policy is
  :func:`mtp.checkpoint_load.resolve_dtype`'s: auto is bf16 on CUDA, fp32 elsewhere);
- decoding settings checked by :class:`GenerationConfig` alone, its errors named by the flags the user typed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import torch
from omegaconf.errors import InterpolationResolutionError

import mtp
from mtp.checkpoint_load import DTYPES
from mtp.config import ModelConfig
from mtp.decode.settings import GenerationConfig, SettingError
from mtp.errors import FULL_DISK, UserError

PACKAGE_DIR = Path(mtp.__file__).resolve().parent
"""The mtp package this process runs; with ``pip install -e .`` it sits in the checkout, beside conf/."""

GENERATION_FLAGS = {
    "max_new_tokens": "--max-new-tokens",
    "temperature": "--temperature",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "heads": "--heads",
    "seed": "--seed",
    "compile": "--compile",
    "tree": "--tree",
    "acceptance": "--acceptance",
    "typical_epsilon": "--typical-epsilon",
    "typical_delta": "--typical-delta",
    "draft_p_min": "--draft-p-min",
    "adaptive_drafts": "--adaptive-drafts",
    "gamma": "--gamma",
}
"""The flag of each GenerationConfig setting, the same in every command that has it (eos_id comes from the
tokenizer, never from a flag)."""


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
    with errors_reported():
        status = main(argv)
    sys.exit(status or 0)


def add_device_flag(parser: argparse.ArgumentParser, default: str = "auto") -> None:
    parser.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default=default,
        help=f"auto: cuda when PyTorch sees one, else cpu (default: {default})",
    )


def pick_device(name: str) -> torch.device:
    """The device of ``--device``: auto is cuda when PyTorch sees one, else cpu."""
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but PyTorch sees no CUDA device; use --device cpu or auto.")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def add_dtype_flag(parser: argparse.ArgumentParser, default: str = "auto") -> None:
    """--dtype for commands that load a checkpoint (:func:`mtp.checkpoint_load.load_checkpoint` resolves it)."""
    parser.add_argument(
        "--dtype",
        choices=["auto", *DTYPES],
        default=default,
        help=f"the weights' dtype; auto: bf16 on cuda, fp32 elsewhere (default: {default})",
    )


def generation_config(**settings) -> GenerationConfig:
    """``GenerationConfig(**settings)``, a bad setting reported as a UserError under its flag."""
    try:
        return GenerationConfig(**settings)
    except SettingError as err:
        raise UserError(err.render(lambda field: GENERATION_FLAGS.get(field, field), " ")) from None


def check_heads(heads: int, config: ModelConfig) -> None:
    """--heads must lie in 1..n, or above n for causal heads with one shared depth (applied again and again)."""
    if heads > config.n_future and not config.share_depth:
        raise UserError(
            f"--heads {heads} exceeds this checkpoint's {config.n_future} head(s); only causal heads trained with "
            f"model.share_depth=true draft beyond them; use --heads 1..{config.n_future}."
        )


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
