"""Lightning-side checkpoint writing: whole files only, and a last.ckpt at the final step."""

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
    """Saves to a temporary file beside the target and renames it into place: a checkpoint is whole or absent."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            torch.save(checkpoint, temporary)
            os.replace(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)

    def load_checkpoint(self, path: str | os.PathLike, map_location: Any = None, weights_only: bool | None = None):
        return read_checkpoint(path, map_location)


class ModelCheckpointAtEnd(ModelCheckpoint):
    """Lightning's ModelCheckpoint, plus last.ckpt written at the final step (``max_steps``) of a run.

    Validation, after which ModelCheckpoint saves, need not fall on the final step. The extra save happens
    where ``every_n_train_steps`` saves happen, so resuming from it continues mid-epoch like any other.
    """

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        final_step = 0 < trainer.max_steps <= trainer.global_step
        if self.save_last and final_step and not trainer.fast_dev_run and self.dirpath is not None:
            path = os.path.join(self.dirpath, f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}")
            trainer.save_checkpoint(path, weights_only=False)  # a full checkpoint: it must resume
            self.last_model_path = path
