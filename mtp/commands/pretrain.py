"""Pretrain an MTP model: python scripts/pretrain.py model=mtp4 [group=option ...] [key=value ...] (or mtp-pretrain).

Hydra multirun sweeps with -m, e.g. python scripts/pretrain.py -m model=mtp1,mtp2,mtp4

The configs are the repository's conf/ folder (found beside the mtp package of an editable install), and runs write
under the repository's logs/ unless PROJECT_ROOT names another root (conf/paths/default.yaml).
"""

from __future__ import annotations

import difflib
import hashlib
import io
import json
import logging
import os
import re
import shutil
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Any, NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from mtp.benchmarks.memory import in_own_process, phase
from mtp.benchmarks.sweep_runs import SUMMARY, read_summary, summary_job, write_summary
from mtp.checkpoint.format import read_checkpoint
from mtp.commands import bench_decode, distill, eval_task
from mtp.commands.cli import checkout_root, errors_reported, run_script
from mtp.errors import UserError, first_line
from mtp.files import write_whole
from mtp.model.config import FORMER_LOSS_SETTINGS
from mtp.pretrained.reference import register_resolver

LITLOGGER_TIP = "💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]"
"""The start of the advertisement Lightning 2.6 logs for every Trainer without a LitLogger."""

FULL_ERROR = "HYDRA_FULL_ERROR"
"""While set to 1, Hydra raises a config it cannot compose instead of printing its report and exiting 1."""
_raising_for_mtp = False  # FULL_ERROR was set by config_errors_raised, not by the user
_sweep_dirs: list[Path] = []  # the sweep folders of multiruns started in this process (SweepFolder)
log = logging.getLogger(__name__)  # under Hydra: the console and the run folder's pretrain.log

EVAL_FOLDER = "eval_task"
"""The run folder's subfolder of the task evaluation a run ends with (``eval_task``): its results.json marks a sweep's
job finished."""
SWEEP_JOB = "sweep_job.yaml"
"""A sweep job's record of its settings (Hydra's ``override_dirname``), written before it trains: a later sweep finds
its folder again and continues it only when its settings are the same."""
JOB_FOLDER_LENGTH = 120
"""A job folder's name longer than this keeps its first characters and ends with a hash of the whole."""


def main(argv: list[str] | None = None) -> None:
    """Compose the config from the overrides on the process's command line and train. Hydra's entry point
    (``@hydra.main``) reads them from ``sys.argv``, so ``argv``, where given, is that command line's arguments (``mtp
    pretrain`` sets ``sys.argv`` for its subcommand; a test sets it too)."""
    if argv is not None and list(argv) != sys.argv[1:]:
        raise ValueError(f"pretrain reads its overrides from sys.argv, as @hydra.main does: {sys.argv[1:]}, not {argv}")
    root = checkout_root()
    os.environ.setdefault("PROJECT_ROOT", str(root))
    quiet_library_notices()
    argv = sys.argv[1:]
    check_groups_not_nulled(argv, root / "conf")
    check_launcher_installed(argv)
    with config_errors_raised(), internal_groups_hidden(argv):
        run_hydra(root / "conf")


def run_hydra(conf: Path) -> None:
    """Hydra's own entry point, ``@hydra.main(config_path=conf, config_name="train")``, over the process's command
    line."""
    hydra.main(version_base="1.3", config_path=str(conf), config_name="train")(train_in_run_dir)()


SUBMITIT_LAUNCHERS = ("local", "slurm")
"""The launchers of conf/hydra/launcher/, both Hydra's submitit launcher plugin (the ``cluster`` extra)."""
CLUSTER_INSTALL = 'pip install -e ".[cluster]"'


def check_launcher_installed(overrides: list[str]) -> None:
    """``hydra/launcher=local`` or ``slurm`` without Hydra's submitit launcher installed: one sentence naming the pip
    command, before Hydra composes anything."""
    for override in overrides:
        group, _, value = override.partition("=")
        if group.lstrip("+") == "hydra/launcher" and value in SUBMITIT_LAUNCHERS:
            try:
                import hydra_plugins.hydra_submitit_launcher  # noqa: F401  (optional: the cluster extra)
            except ImportError:
                raise UserError(
                    f"{override} runs the sweep's jobs through Hydra's submitit launcher, which is not installed; "
                    f"install it with {CLUSTER_INSTALL} (or pip install hydra-submitit-launcher)."
                ) from None


def check_groups_not_nulled(overrides: list[str], conf: Path) -> None:
    """``logger=null`` (a config group set to null) is refused by Hydra with a traceback: Hydra turns a group's default
    off with ``~logger``. One sentence that says so instead."""
    for override in overrides:
        group, _, value = override.partition("=")
        if value == "null" and (conf / group).is_dir():
            raise UserError(
                f"{override} cannot turn a config group off; write '~{group}' instead, Hydra's way to drop it."
            )


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
def internal_groups_hidden(argv: list[str]) -> Iterator[None]:
    """Hydra's ``--help`` (which lists every folder of conf/ as a config group) without the internal groups'
    lines; anything else runs as it is."""
    if not {"--help", "-h"} & set(argv):
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
        if cause.full_key.removeprefix("model.") in FORMER_LOSS_SETTINGS:  # a command line older than the loss group
            return f"{cause.full_key} is a loss setting now; set loss.{FORMER_LOSS_SETTINGS[cause.key]} instead."
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


LEADING_SETTINGS = ("model", "size", "seed")
"""What a sweep varies most: first in a job folder's name, whose length is bounded."""


def job_folder(overrides: str) -> str:
    """A sweep job's folder name from its settings (Hydra's ``override_dirname``, sorted by key:
    ``data.seq_len=64,model=mtp2,seed=1``): one folder per set of settings, so that a rerun of the sweep finds each
    job's folder again. :data:`LEADING_SETTINGS` come first (``model=mtp2,seed=1,data.seq_len=64``); Hydra's escapes
    are dropped; a path in a value cannot nest folders (``/`` becomes ``_``); a long name is cut and ends with a hash
    of the whole; no settings at all is ``defaults``."""
    items, depth, start = [], 0, 0
    for at, char in enumerate(overrides + ","):  # split at the commas outside brackets (a list value: ops=[1,6])
        depth += (char in "[{(") - (char in "]})")
        if char == "," and depth == 0:
            items.append(overrides[start:at])
            start = at + 1
    leading = [item for key in LEADING_SETTINGS for item in items if item.split("=", 1)[0] == key]
    name = ",".join(leading + [item for item in items if item and item not in leading])
    name = name.replace("\\", "").replace(os.sep, "_")  # Hydra escapes a value's ":" (max_time=00\:01\:00)
    if len(name) > JOB_FOLDER_LENGTH:
        name = f"{name[: JOB_FOLDER_LENGTH - 9]}_{hashlib.sha256(overrides.encode()).hexdigest()[:8]}"
    return name or "defaults"


# The resolvers the configs use, registered when this module is imported: by the command, and by a sweep job that a
# launcher runs in a process of its own (hydra/launcher=local, slurm), which imports its task function from here.
register_resolver()  # ${reference_model:}: the job reads init_from before train() imports the training stack
OmegaConf.register_new_resolver("job_folder", job_folder, replace=True)  # the experiments' hydra.sweep.subdir


def train_in_run_dir(cfg: DictConfig) -> None:
    """One Hydra job; a user's mistake leaves no empty run folder behind (Hydra made it before the job started).

    A config with a ``distill`` node (``experiment=pretrained_heads``) first makes the training data: the model of
    ``init_from`` continues prompts (:func:`mtp.commands.distill.run` with the settings the node's keys set, each a
    flag of ``scripts/distill.py`` by name: a rerun reuses what an earlier run made); one with a ``bench_decode`` node
    ends with the decoding benchmark of the trained checkpoint (:func:`mtp.commands.bench_decode.run`, written into the
    run folder); one with an ``eval_task`` node (``experiment=paper_polynomial``, ``paper_induction``) ends with the
    task's evaluation of the trained checkpoint (:func:`mtp.commands.eval_task.run`, into the run folder's
    eval_task/). Each is typed settings read from its node, checked before training.

    A job of a sweep (``-m``) continues what an earlier run of the same sweep left in its folder: see
    :func:`continue_sweep_job`.
    """
    if _raising_for_mtp:  # composed: the job's own errors get Hydra's usual report again
        os.environ.pop(FULL_ERROR, None)
    lightning_through_hydra()
    output_dir = Path(HydraConfig.get().runtime.output_dir)
    with errors_reported(cleanup=lambda: remove_empty_run_dir(output_dir)):
        checkpoint = str(output_dir / "checkpoints" / "last.ckpt")  # not written yet
        bench = None
        if cfg.get("bench_decode"):
            node = {**node_values(cfg.bench_decode), "out": str(output_dir / "bench_decode")}
            # the checkpoint will carry the chat template of init_from, which decides the format
            bench = bench_decode.settings_of_config(checkpoint, node, template_from=cfg.get("init_from"))
        evaluation = None
        if cfg.get("eval_task"):  # its results are headed by the pretrain command
            node = {**node_values(cfg.eval_task), "out": str(output_dir / EVAL_FOLDER)}
            evaluation = eval_task.settings_of_config(checkpoint, node)
        trains, summary = True, None
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            settings = HydraConfig.get().job.override_dirname
            summary = summary_folder(cfg, output_dir) if evaluation is not None else None
            cfg, trains = continue_sweep_job(cfg, output_dir, settings, evaluation is not None, summary)
            if cfg is None:
                remove_empty_run_dir(output_dir)  # skipped for its kept summary: no empty job folder
                return
        if cfg.get("distill"):
            if not cfg.get("init_from"):
                raise UserError("distill needs the model to continue prompts: set init_from=PATH (or drop distill).")
            with phase("distillation"):
                status = distill.run(distill.settings_of_config(str(cfg.init_from), node_values(cfg.distill)))
            if status:
                raise SystemExit(status)  # Ctrl-C while distilling: what it wrote is kept, training does not start
        if trains:
            with phase("training (data, model, trunk cache, steps)"):
                train(cfg)
        if score_trained(bench, evaluation) and summary is not None:
            keep_summary(cfg, output_dir, summary)


def score_trained(bench, evaluation) -> bool:
    """The decoding benchmark and the task evaluation a run ends with (None: not asked for), on the first process
    only: every process of a multi-device run returns from training, and one writes the results. Returns whether this
    process scored. The benchmark runs in a process of its own, started afresh: the memory training left behind in
    this one is never resident beside the models it loads, and its thread pinning and compiled steps end with it."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only  # Lightning: seconds to import, not for --help

    if rank_zero_only.rank != 0:
        return False
    if bench is not None:
        release_device_cache()
        with phase("decoding benchmark"):  # its errors name the node's keys, as the config wrote them
            in_own_process(bench_decode.run, bench, "bench_decode")  # training's memory is not resident beside it
    if evaluation is not None:
        with phase("task evaluation"):
            eval_task.run(evaluation)
    return True


def release_device_cache() -> None:
    """Hand the CUDA memory PyTorch's allocator keeps cached back to the device, for a process that follows."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def summary_folder(cfg: DictConfig, output_dir: Path) -> Path | None:
    """Where a sweep job of an experiment keeps its summary: ``paths.results_dir``/<experiment>/<its job folder's
    name> (results/experiments/paper_induction/model=mtp2,size=paper_1m,seed=3); None for a sweep of no experiment or
    with ``paths.results_dir=null``."""
    experiment = HydraConfig.get().runtime.choices.get("experiment")
    results_dir = OmegaConf.select(cfg, "paths.results_dir", default=None)
    if not experiment or not results_dir:
        return None
    return Path(results_dir) / experiment / output_dir.name


def keep_summary(cfg: DictConfig, output_dir: Path, summary: Path) -> None:
    """Write the job's summary (:func:`mtp.benchmarks.sweep_runs.write_summary`) into ``summary`` from its scores
    (eval_task/results.json), Hydra's record of the job and its resolved config."""
    hydra = HydraConfig.get()
    results = json.loads((output_dir / EVAL_FOLDER / "results.json").read_text())
    excluded = OmegaConf.select(hydra, "job.config.override_dirname.exclude_keys", default=None) or []
    job = summary_job(hydra.runtime.choices.get("experiment"), output_dir.name, hydra.job.override_dirname,
                      hydra.overrides.task, hydra.runtime.choices, excluded)  # fmt: skip
    config = OmegaConf.to_container(cfg, resolve=True)
    path = write_summary(summary, results, config, job)
    log.info("sweep job %s: its summary is in %s (commit it to keep it)", output_dir.name, path)


def continue_sweep_job(
    cfg: DictConfig, output_dir: Path, settings: str, scored: bool, summary: Path | None = None
) -> tuple[DictConfig | None, bool]:
    """What a sweep's job does with what an earlier run of the same sweep left: a job whose summary is kept in the
    results folder (``summary``/results.json, committed) is skipped (None), wherever it ran; so is one that
    ``scored`` itself in its folder (its eval_task/results.json is there), which keeps its summary first if it has
    none; one with a last.ckpt (Ctrl-C, a kill, a lease that ended) resumes from it (``ckpt_path``; or, when its
    training had reached ``trainer.max_steps``, goes straight to what follows training: the bool is whether to train);
    any other starts afresh. The folder's record of its settings (:data:`SWEEP_JOB`), and a kept summary's, must match
    this job's ``settings`` (Hydra's ``override_dirname``): another sweep's folder is refused, not continued. Each
    choice is logged."""
    name = output_dir.name
    if summary is not None and summary.exists():
        kept = read_summary(summary / SUMMARY)
        if kept["job"].get("settings") != settings:
            raise UserError(
                f"{summary / SUMMARY} is the summary of a job of other settings ({kept['job'].get('settings')}, not "
                f"{settings or 'none'}); move that folder away, or keep this sweep's summaries apart with "
                "paths.results_dir=FOLDER."
            )
        log.info("sweep job %s: its summary is kept in %s; skipping it", name, summary)
        return None, False
    record = output_dir / SWEEP_JOB
    last = output_dir / "checkpoints" / "last.ckpt"
    if record.is_file():
        recorded = OmegaConf.load(record).get("settings")
        if recorded != settings:
            raise UserError(
                f"{output_dir} holds a sweep job of other settings ({recorded or 'none'}, not {settings or 'none'}); "
                "give this sweep a folder of its own with hydra.sweep.dir=FOLDER."
            )
    elif (output_dir / "checkpoints").exists():
        raise UserError(
            f"{output_dir} holds checkpoints that no sweep job recorded; give this sweep a folder of its own with "
            "hydra.sweep.dir=FOLDER, or move that folder away."
        )
    else:
        text = OmegaConf.to_yaml({"settings": settings})
        output_dir.mkdir(parents=True, exist_ok=True)
        write_whole(record, lambda f: f.write(text.encode()))
    results = output_dir / EVAL_FOLDER / "results.json"
    if scored and results.is_file():
        log.info("sweep job %s: finished earlier (its %s/results.json is there); skipping it", name, EVAL_FOLDER)
        if summary is not None:
            keep_summary(cfg, output_dir, summary)
        return None, False
    if cfg.get("ckpt_path") or not last.exists():
        return cfg, True
    step = read_checkpoint(str(last), mmap=not last.is_dir()).get("global_step", 0)
    max_steps = cfg.trainer.get("max_steps", -1)
    if max_steps is not None and 0 < max_steps <= step:
        log.info("sweep job %s: trained to step %d earlier (checkpoints/last.ckpt); going on from there", name, step)
        return cfg, False
    log.info("sweep job %s: resuming from its checkpoints/last.ckpt (step %d)", name, step)
    cfg = cfg.copy()
    cfg.ckpt_path = str(last)
    return cfg, True


def train(cfg: DictConfig) -> None:
    """:func:`mtp.training.train.train`, imported when a job runs: Lightning and what it imports cost several seconds,
    which ``--help`` and a config Hydra cannot compose need not wait for."""
    from mtp.training.train import train as run  # Lightning: seconds to import, not needed by --help

    run(cfg)


def node_values(node: DictConfig) -> dict[str, Any]:
    """A command's node of the config (``bench_decode``, ``eval_task``, ``distill``) as plain values, resolved."""
    return OmegaConf.to_container(node, resolve=True)


def remove_empty_run_dir(output_dir: Path) -> None:
    """A run that failed on bad input leaves no folder behind, unless it had written something of value."""
    owned = {".hydra", f"{HydraConfig.get().job.name}.log", "tensorboard", SWEEP_JOB}
    if (
        output_dir.is_dir()
        and {p.name for p in output_dir.iterdir()} <= owned
        and not (output_dir / "checkpoints").exists()
    ):
        shutil.rmtree(output_dir, ignore_errors=True)


def entry_point() -> NoReturn:
    """mtp-pretrain and scripts/pretrain.py."""
    run_script(main)


if __name__ == "__main__":
    entry_point()
