"""Pretrain an MTP model: python scripts/pretrain.py model=mtp4 [group=option ...] [key=value ...] (or mtp-pretrain).

Hydra multirun sweeps with -m, e.g. python scripts/pretrain.py -m model=mtp1,mtp2,mtp4

The configs are the repository's conf/ folder (found beside the mtp package of an editable install), and runs write
under the repository's logs/ unless PROJECT_ROOT names another root (conf/paths/default.yaml).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from mtp.cli import checkout_root, errors_reported, run_script
from mtp.commands import bench_decode, distill
from mtp.errors import UserError
from mtp.train import train


def main(argv: list[str] | None = None) -> None:
    """Compose the config from the overrides in ``argv`` (None: the process's arguments) and train."""
    root = checkout_root()
    os.environ.setdefault("PROJECT_ROOT", str(root))
    task = hydra.main(version_base="1.3", config_path=str(root / "conf"), config_name="train")(train_in_run_dir)
    with arguments(argv):
        task()


def train_in_run_dir(cfg: DictConfig) -> None:
    """One Hydra job; a user's mistake leaves no empty run folder behind (Hydra made it before the job started).

    A config with a ``distill`` node (``experiment=pretrained_heads``) first makes the training data: the model of
    ``init_from`` continues prompts (``scripts/distill.py`` with those settings as its flags: a rerun reuses what an
    earlier run made); one with a ``bench_decode`` node ends with the decoding benchmark of the trained checkpoint
    (``scripts/bench_decode.py`` with those flags, written into the run folder). Both are checked before training.
    """
    output_dir = Path(HydraConfig.get().runtime.output_dir)
    with errors_reported(cleanup=lambda: remove_empty_run_dir(output_dir)):
        bench = None
        if cfg.get("bench_decode"):
            bench = bench_decode.checked_args([str(output_dir / "checkpoints" / "last.ckpt"), *flags(cfg.bench_decode)])
            bench.out = output_dir / "bench_decode"
        if cfg.get("distill"):
            if not cfg.get("init_from"):
                raise UserError("distill needs the model to continue prompts: set init_from=PATH (or drop distill).")
            status = distill.main([str(cfg.init_from), *flags(cfg.distill)])
            if status:
                raise SystemExit(status)  # Ctrl-C while distilling: what it wrote is kept, training does not start
        train(cfg)
        if bench is not None:
            bench_decode.run(bench)


def flags(settings: DictConfig) -> list[str]:
    """A command's flags from a config node: ``max_tokens: 1000`` is ``--max-tokens 1000``, ``hf: true`` is ``--hf``
    (false: left out), a list is comma-separated."""
    argv = []
    for key, value in OmegaConf.to_container(settings, resolve=True).items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
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
