"""Pretrain an MTP model: python scripts/pretrain.py model=mtp4 [group=option ...] [key=value ...] (or mtp-pretrain).

Hydra multirun sweeps with -m, e.g. python scripts/pretrain.py -m model=mtp1,mtp2,mtp4

The configs are the repository's conf/ folder (found beside the mtp package of an editable install), and runs write
under the repository's logs/ unless PROJECT_ROOT names another root (conf/paths/default.yaml).
"""

from __future__ import annotations

import argparse
import difflib
import io
import logging
import os
import re
import shutil
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from mtp.commands import bench_decode, distill
from mtp.commands.cli import checkout_root, errors_reported, run_script
from mtp.config import MOVED_TO_LOSS
from mtp.errors import UserError, first_line
from mtp.pretrained.reference import register_resolver

LITLOGGER_TIP = "💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]"
"""The start of the advertisement Lightning 2.6 logs for every Trainer without a LitLogger."""

FULL_ERROR = "HYDRA_FULL_ERROR"
"""While set to 1, Hydra raises a config it cannot compose instead of printing its report and exiting 1."""
_raising_for_mtp = False  # FULL_ERROR was set by config_errors_raised, not by the user
_sweep_dirs: list[Path] = []  # the sweep folders of multiruns started in this process (SweepFolder)


def main(argv: list[str] | None = None) -> None:
    """Compose the config from the overrides in ``argv`` (None: the process's arguments) and train."""
    root = checkout_root()
    os.environ.setdefault("PROJECT_ROOT", str(root))
    quiet_library_notices()
    register_resolver()  # ${reference_model:}: the job reads init_from before train() imports the training stack
    task = hydra.main(version_base="1.3", config_path=str(root / "conf"), config_name="train")(train_in_run_dir)
    with arguments(argv), config_errors_raised(), internal_groups_hidden():
        task()


def quiet_library_notices() -> None:
    """Leave out two notices about the libraries, not the run, that every run would print (the tests filter them in
    pyproject.toml): Lightning's litlogger tip, and torch 2.13's deprecation of LeafSpec, which Lightning 2.6 still
    checks for (lightning/pytorch/utilities/_pytree.py)."""
    warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning)
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(not_litlogger_tip)


def lightning_through_hydra() -> None:
    """Lightning's messages once, through the job's own handlers (the console, pretrain.log): Lightning gives its
    logger a console handler of its own when imported before logging is set up, and Hydra's logging set-up lets the
    messages reach the root's console handler too, so each line ("Seed set to ...", the model summary) printed
    twice."""
    import lightning  # noqa: F401  (its import adds the handler: imported first, the handler goes for good)

    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True


def not_litlogger_tip(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(LITLOGGER_TIP)


INTERNAL_GROUP = re.compile(r"^(?:[\w-]+/)+_[\w-]*: ")
"""A line of Hydra's --help that lists an internal config group (a folder whose name starts with ``_``, such as
conf/model/_base: the presets' shared base files, not a choice)."""


@contextmanager
def internal_groups_hidden() -> Iterator[None]:
    """Hydra's ``--help`` (which lists every folder of conf/ as a config group) without the internal groups'
    lines; anything else runs as it is."""
    if not {"--help", "-h"} & set(sys.argv[1:]):
        yield
        return
    printed = io.StringIO()
    try:
        with redirect_stdout(printed):
            yield
    finally:
        lines = printed.getvalue().splitlines(keepends=True)
        sys.stdout.write("".join(line for line in lines if not INTERNAL_GROUP.match(line)))


@contextmanager
def config_errors_raised() -> Iterator[None]:
    """A config Hydra cannot compose (an option a group lacks, a key the config lacks, an override it cannot parse)
    becomes a UserError of one sentence, before any run folder exists. The job itself runs under Hydra's usual
    reporting (see :func:`train_in_run_dir`); a user who set HYDRA_FULL_ERROR=1 gets Hydra's full report."""
    global _raising_for_mtp
    if os.environ.get(FULL_ERROR) == "1":
        yield
        return
    os.environ[FULL_ERROR], _raising_for_mtp = "1", True
    try:
        yield
    except (ConfigCompositionException, OverrideParseException) as err:
        for sweep_dir in _sweep_dirs:  # a sweep whose jobs did not compose: its folder holds only multirun.yaml
            if sweep_dir.is_dir() and {p.name for p in sweep_dir.iterdir()} <= {"multirun.yaml"}:
                shutil.rmtree(sweep_dir, ignore_errors=True)
        raise UserError(config_error_sentence(err)) from None
    finally:
        _sweep_dirs.clear()
        if _raising_for_mtp:
            os.environ.pop(FULL_ERROR, None)
            _raising_for_mtp = False


def config_error_sentence(err: ConfigCompositionException | OverrideParseException) -> str:
    """One sentence for a config Hydra could not compose: the bad override and its fix."""
    if isinstance(err, MissingConfigException) and err.options and err.missing_cfg_file:
        group, option = err.missing_cfg_file.rsplit("/", 1)
        return f"{group}={option} names no config in conf/{group}/; choose one of {', '.join(err.options)}."
    cause = err.__cause__
    if isinstance(cause, ConfigKeyError | ConfigAttributeError) and cause.full_key:  # a key the config lacks
        if cause.full_key.removeprefix("model.") in MOVED_TO_LOSS:  # a command line written before the loss group
            return f"{cause.full_key} is a loss setting now; set loss.{MOVED_TO_LOSS[cause.key]} instead."
        typed = re.search(r"use \+(\S+)", str(err))
        known = list(cause.parent_node.keys()) if isinstance(cause.parent_node, DictConfig) else []
        close = difflib.get_close_matches(str(cause.key), [str(k) for k in known], n=1)
        prefix = cause.full_key[: -len(str(cause.key))]
        guess = f" (did you mean {prefix}{close[0]}?)" if close else ""
        add = f", or add it with +{typed.group(1)}" if typed else ""
        return f"{cause.full_key} is not a setting of the config{guess}; fix the name{add} (--cfg job lists them)."
    if isinstance(err, OverrideParseException):
        return f"cannot read the override {err.override!r}: {first_line(err)}; see --help for the override syntax."
    lines = [line.strip() for line in str(err).split("Config search path:")[0].splitlines() if line.strip()]
    return f"{' '.join(lines).rstrip('.')}; see --help for the config groups and their options."


class SweepFolder(Callback):
    """Notes the folder a multirun writes its multirun.yaml into before composing its jobs (conf/hydra/default.yaml
    names this callback), so that a job that does not compose leaves no folder behind."""

    def on_multirun_start(self, config: DictConfig, **kwargs: object) -> None:
        _sweep_dirs.append(Path(config.hydra.sweep.dir))


def train_in_run_dir(cfg: DictConfig) -> None:
    """One Hydra job; a user's mistake leaves no empty run folder behind (Hydra made it before the job started).

    A config with a ``distill`` node (``experiment=pretrained_heads``) first makes the training data: the model of
    ``init_from`` continues prompts (``scripts/distill.py`` with those settings as its flags: a rerun reuses what an
    earlier run made); one with a ``bench_decode`` node ends with the decoding benchmark of the trained checkpoint
    (``scripts/bench_decode.py`` with those flags, written into the run folder). Both are checked before training.
    """
    if _raising_for_mtp:  # composed: the job's own errors get Hydra's usual report again
        os.environ.pop(FULL_ERROR, None)
    lightning_through_hydra()
    output_dir = Path(HydraConfig.get().runtime.output_dir)
    with errors_reported(cleanup=lambda: remove_empty_run_dir(output_dir)):
        bench = None
        if cfg.get("bench_decode"):
            # the checkpoint is not written yet: it will carry the chat template of init_from, which decides the format
            checkpoint = str(output_dir / "checkpoints" / "last.ckpt")
            argv = [checkpoint, *flags(cfg.bench_decode, bench_decode.build_parser())]
            bench = bench_decode.checked_args(argv, template_from=cfg.get("init_from"))
            bench.out = output_dir / "bench_decode"
        if cfg.get("distill"):
            if not cfg.get("init_from"):
                raise UserError("distill needs the model to continue prompts: set init_from=PATH (or drop distill).")
            status = distill.main([str(cfg.init_from), *flags(cfg.distill, distill.build_parser())])
            if status:
                raise SystemExit(status)  # Ctrl-C while distilling: what it wrote is kept, training does not start
        train(cfg)
        if bench is not None:
            bench_decode.run(bench)


def train(cfg: DictConfig) -> None:
    """:func:`mtp.training.train.train`, imported when a job runs: Lightning and what it imports cost several seconds,
    which ``--help`` and a config Hydra cannot compose need not wait for."""
    from mtp.training.train import train as run  # Lightning: seconds to import, not needed by --help

    run(cfg)


def flags(settings: DictConfig, parser: argparse.ArgumentParser | None = None) -> list[str]:
    """A command's flags from a config node: ``max_tokens: 1000`` is ``--max-tokens 1000``, ``hf: true`` is ``--hf``
    (false: left out), a list is comma-separated, or several arguments for a flag of ``parser`` that takes several
    (``paths: [a, b]`` is ``--paths a b``)."""
    several = {a.dest for a in parser._actions if a.nargs in ("+", "*")} if parser is not None else set()
    argv = []
    for key, value in OmegaConf.to_container(settings, resolve=True).items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif isinstance(value, list) and key in several:
            argv += [flag, *map(str, value)] if value else []
        elif value is not False and value is not None:
            argv += [flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    return argv


def remove_empty_run_dir(output_dir: Path) -> None:
    """A run that failed on bad input leaves no folder behind, unless it had written something of value."""
    owned = {".hydra", f"{HydraConfig.get().job.name}.log", "tensorboard"}
    if (
        output_dir.is_dir()
        and {p.name for p in output_dir.iterdir()} <= owned
        and not (output_dir / "checkpoints").exists()
    ):
        shutil.rmtree(output_dir, ignore_errors=True)


@contextmanager
def arguments(argv: list[str] | None) -> Iterator[None]:
    """Hydra reads its overrides from sys.argv: ``argv`` stands in for them while it runs (None: leave them)."""
    if argv is None:
        yield
        return
    saved = sys.argv
    sys.argv = [saved[0], *argv]
    try:
        yield
    finally:
        sys.argv = saved


def entry_point() -> NoReturn:
    """mtp-pretrain and scripts/pretrain.py."""
    run_script(main)


if __name__ == "__main__":
    entry_point()
