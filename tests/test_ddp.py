"""DDP on CPU (2 processes, gloo) gives the same first-step gradients as one process with the same global batch."""

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from mtp.data import MTPDataModule
from mtp.model import MTPModel
from mtp.model.config import ModelConfig
from mtp.training.lit import MTPLitModule

MODEL = dict(vocab_size=320, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, n_future=3)
WINDOWS = torch.randint(0, 320, (4, 19), generator=torch.Generator().manual_seed(0))


class FixedWindows(L.LightningDataModule):
    def __init__(self, batch_size: int) -> None:
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(list(WINDOWS), batch_size=self.batch_size, shuffle=False)


class CaptureFirstGradients(L.Callback):
    """Saves the (all-reduced) gradients of the first optimizer step, before clipping, from rank 0."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if trainer.global_step == 0 and trainer.is_global_zero:
            torch.save({n: p.grad.detach().clone() for n, p in pl_module.model.named_parameters()}, self.path)


def first_step_gradients(tmp_path, devices: int, strategy: str, datamodule=None) -> dict[str, torch.Tensor]:
    path = str(tmp_path / f"grads_{devices}.pt")
    torch.manual_seed(0)
    module = MTPLitModule(model=MTPModel(ModelConfig(**MODEL)), optim={"warmup_steps": 1})
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[CaptureFirstGradients(path)],
        use_distributed_sampler=datamodule is None,
    )
    trainer.fit(module, datamodule=datamodule or FixedWindows(batch_size=4 // devices))
    return torch.load(path, weights_only=True)


@pytest.mark.slow
def test_ddp_first_step_gradients_equal_single_process(tmp_path):
    single = first_step_gradients(tmp_path, devices=1, strategy="auto")
    ddp = first_step_gradients(tmp_path, devices=2, strategy="ddp_spawn")
    assert single.keys() == ddp.keys()
    for name, grad in single.items():
        torch.testing.assert_close(ddp[name], grad, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.slow
def test_ddp_with_mtp_datamodule_splits_the_global_batch(tmp_path, corpus_dir, shared_cache):
    """MTPDataModule gives each process its share of one shared order: the same global batch as one process."""

    def datamodule(batch_size: int) -> MTPDataModule:
        dm = MTPDataModule(
            source={"kind": "files", "paths": [str(corpus_dir / "*.txt")]},
            tokenizer={"kind": "byte"},
            seq_len=16,
            n_future=3,
            batch_size=batch_size,
            cache_dir=str(shared_cache),
        )
        dm.setup("fit")
        return dm

    single = first_step_gradients(tmp_path, devices=1, strategy="auto", datamodule=datamodule(4))
    ddp = first_step_gradients(tmp_path, devices=2, strategy="ddp_spawn", datamodule=datamodule(2))
    for name, grad in single.items():
        torch.testing.assert_close(ddp[name], grad, rtol=1e-5, atol=1e-7, msg=name)
