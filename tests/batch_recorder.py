"""A callback that scripts run in a subprocess can load by Hydra override, to record what each process trains on.

+callbacks.record._target_=tests.batch_recorder.RecordBatches +callbacks.record.path=DIR
"""

from pathlib import Path

import lightning as L
import torch


class RecordBatches(L.Callback):
    """Appends every training batch to DIR/rank<r>.pt (a list of tensors), one file per process."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.batches: list[torch.Tensor] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batches.append(batch.detach().cpu().clone())

    def on_train_end(self, trainer, pl_module) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        torch.save(self.batches, self.path / f"rank{trainer.global_rank}.pt")
