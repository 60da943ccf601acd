"""Writing checkpoints: whole files only (reading them: mtp.checkpoint.load; when to write them:
mtp.training.callbacks)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from mtp.checkpoint.format import read_checkpoint
from mtp.errors import UserError
from mtp.files import write_whole


class AtomicCheckpointIO(TorchCheckpointIO):
    """Saves to a temporary file beside the target and renames it into place: a checkpoint is whole or absent.

    Lightning's own save is not enough: its fsspec transaction stages the file in the system temp directory
    and moves it, which is a copy (not a rename) when that directory is on another filesystem than the
    checkpoints (tmpfs /tmp, checkpoints on a network disk), so a kill during the copy leaves a torn file.
    Reading goes through :func:`read_checkpoint`, so a bad file is one clear sentence.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_whole(path, lambda f: torch.save(checkpoint, f))
        except OSError as err:  # a full disk, a read-only or vanished folder: the previous checkpoint stays
            raise UserError(
                f"could not write checkpoint {path} ({err.strerror or err}); free space there or point "
                "paths.output_dir (hydra.run.dir) at a writable disk, then resume from the last checkpoint."
            ) from err

    def load_checkpoint(self, path: str | os.PathLike, map_location: Any = None, weights_only: bool | None = None):
        return read_checkpoint(path, map_location or "cpu")
