"""Callbacks that scripts run in a subprocess can load by Hydra override, to record what each process trains on
and to stall a checkpoint write half-way (for a kill to land in it).

+callbacks.record._target_=tests.batch_recorder.RecordBatches +callbacks.record.path=DIR
+callbacks.stall._target_=tests.batch_recorder.StallSave +callbacks.stall.marker=FILE +callbacks.stall.nth=2
(the subprocess needs the repository root on PYTHONPATH to import them)
"""

import time
from pathlib import Path

import lightning as L
import torch


class RecordBatches(L.Callback):
    """Appends every training batch to DIR/rank<r>.pt (a list of tensors), one file per process, at the end of
    the run or when it stops on an exception (SIGTERM); DIR/started appears with the first batch."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.batches: list[torch.Tensor] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not self.batches:
            self.path.mkdir(parents=True, exist_ok=True)
            (self.path / "started").touch()
        self.batches.append(batch.detach().cpu().clone())

    def on_train_end(self, trainer, pl_module) -> None:
        self.save(trainer)

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.save(trainer)

    def save(self, trainer) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        torch.save(self.batches, self.path / f"rank{trainer.global_rank}.pt")


class StallSave(L.Callback):
    """The nth checkpoint save writes half its bytes, creates ``marker`` and hangs (until the test kills it)."""

    def __init__(self, marker: str, nth: int = 2) -> None:
        self.marker, self.nth = Path(marker), nth

    def setup(self, trainer, pl_module, stage) -> None:
        import io

        import mtp.checkpoint.save

        real_save, calls = torch.save, []

        def stalling_save(obj, f, *args, **kwargs):
            calls.append(1)
            if len(calls) < self.nth:
                return real_save(obj, f, *args, **kwargs)
            buffer = io.BytesIO()
            real_save(obj, buffer, *args, **kwargs)
            f.write(buffer.getvalue()[: buffer.tell() // 2])
            f.flush()
            self.marker.touch()
            time.sleep(600)

        mtp.checkpoint.save.torch = _TorchWith(stalling_save)


class _TorchWith:
    """The torch module as mtp.checkpoint.save sees it, with another ``save``."""

    def __init__(self, save) -> None:
        self.save = save

    def __getattr__(self, name):
        return getattr(torch, name)
