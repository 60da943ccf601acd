"""Lightning-side checkpoint handling: whole files only, clear errors on reading, and a last.ckpt at the final step."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint

from mtp.checkpoint import read_checkpoint


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
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with open(temporary, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())  # the bytes are on disk before the name points at them
            os.replace(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)

    def load_checkpoint(self, path: str | os.PathLike, map_location: Any = None, weights_only: bool | None = None):
        return read_checkpoint(path, map_location or "cpu")


class ModelCheckpointAtEnd(ModelCheckpoint):
    """Lightning's ModelCheckpoint, plus last.ckpt written at the final step (``max_steps``) of a run.

    Validation, after which ModelCheckpoint saves, need not fall on the final step. The extra save happens
    where ``every_n_train_steps`` saves happen, so resuming from it continues mid-epoch like any other. Lightning
    (2.6+) saves last.ckpt once more in ``on_train_end``, after the epoch loop has closed, and a run resumed from
    that copy would start a new epoch instead of finishing the interrupted one: that save is skipped here.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.saved_final_step = False

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        final_step = 0 < trainer.max_steps <= trainer.global_step
        if self.save_last and final_step and not trainer.fast_dev_run and self.dirpath is not None:
            path = os.path.join(self.dirpath, f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}")
            trainer.save_checkpoint(path, weights_only=False)  # a full checkpoint: it must resume
            self.last_model_path = path
            self.saved_final_step = True

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.saved_final_step:
            super().on_train_end(trainer, pl_module)
