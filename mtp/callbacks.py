"""Lightning callbacks of a training run: when checkpoints are written, and tokens/s."""

from __future__ import annotations

import os

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint, ThroughputMonitor
from torch import Tensor


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


class TokenThroughputMonitor(ThroughputMonitor):
    """Lightning's throughput monitor counting trained tokens as items: B x seq_len per (B, seq_len + n_future) batch.

    Logs ``train/device/items_per_sec`` (tokens/s per device) and, with several devices, ``train/items_per_sec``.
    """

    def __init__(self, n_future: int, window_size: int = 20) -> None:
        self.n_future = n_future
        super().__init__(batch_size_fn=self.batch_size, length_fn=self.trained_tokens, window_size=window_size)

    @staticmethod
    def batch_size(batch: Tensor) -> int:
        return batch.size(0)

    def trained_tokens(self, batch: Tensor) -> int:
        return batch.size(0) * (batch.size(1) - self.n_future)
