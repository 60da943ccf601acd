"""Pretrain an MTP model: python scripts/pretrain.py model=mtp4 [group=option ...] [key=value ...]

Hydra multirun sweeps with -m, e.g. python scripts/pretrain.py -m model=mtp1,mtp2,mtp4
"""

import os
import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(ROOT))
sys.path.insert(0, str(ROOT))  # run from a checkout without installing, too

from mtp.errors import UserError  # noqa: E402
from mtp.train import train  # noqa: E402


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> None:
    try:
        train(cfg)
    except UserError as err:
        remove_empty_run_dir(Path(HydraConfig.get().runtime.output_dir))
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


def remove_empty_run_dir(output_dir: Path) -> None:
    """A run that failed on bad input leaves no folder behind, unless it had written something of value."""
    owned = {".hydra", f"{HydraConfig.get().job.name}.log", "tensorboard"}
    if (
        output_dir.is_dir()
        and {p.name for p in output_dir.iterdir()} <= owned
        and not (output_dir / "checkpoints").exists()
    ):
        shutil.rmtree(output_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
