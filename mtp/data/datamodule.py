"""LightningDataModule over packed shards: fixed windows of ``seq_len + n_future`` tokens."""

from __future__ import annotations

import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from mtp.data.packing import PackedData, TokenizerConfig, prepare
from mtp.data.sources import SourceConfig
from mtp.errors import UserError

# Lightning warns on every mid-epoch resume unless the DataLoader object is stateful; ResumableShuffle below
# restarts the order where the checkpoint left it, so the warning does not apply to this datamodule.
warnings.filterwarnings("ignore", message=r"You're resuming from a checkpoint that ended before the epoch ended")


class TokenWindows(Dataset):
    """Windows of ``window`` tokens taken every ``stride`` tokens from a flat token file."""

    def __init__(self, path: Path, dtype: str, window: int, stride: int) -> None:
        self.path, self.dtype, self.window, self.stride = path, dtype, window, stride
        n_tokens = path.stat().st_size // np.dtype(dtype).itemsize
        self.length = max(0, (n_tokens - window) // stride + 1)
        self._tokens: np.memmap | None = None  # opened lazily, once per DataLoader worker

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> torch.Tensor:
        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        start = i * self.stride
        return torch.from_numpy(self._tokens[start : start + self.window].astype(np.int64))


class ResumableShuffle(Sampler[int]):
    """A random order fixed by (seed, epoch), split across processes, that can start part-way into the epoch.

    Process ``rank`` of ``world_size`` takes every world_size-th sample of the shared order. A run resumed
    from a mid-epoch checkpoint skips the ``start`` samples (all processes together) the first run
    consumed and continues in the same order, instead of replaying the start of the epoch.
    """

    def __init__(self, length: int, seed: int, start: int = 0, rank: int = 0, world_size: int = 1) -> None:
        self.length, self.seed, self.start, self.epoch = length, seed, start, 0
        self.rank, self.world_size = rank, world_size

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = torch.randperm(self.length, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        start, self.start = self.start, 0  # only the first pass after a resume is shortened
        usable = start + (self.length - start) // self.world_size * self.world_size  # equal shares for every rank
        return iter(order[start + self.rank : usable : self.world_size].tolist())

    def __len__(self) -> int:
        return self.length // self.world_size


class MTPDataModule(L.LightningDataModule):
    def __init__(
        self,
        source: dict[str, Any],
        tokenizer: dict[str, Any],
        seq_len: int,
        n_future: int,
        batch_size: int,
        val_fraction: float = 0.05,
        cache_dir: str = "data/cache",
        num_workers: int = 0,
        seed: int | None = 0,
    ) -> None:
        super().__init__()
        if seq_len < 1:
            raise UserError(f"data.seq_len={seq_len} must be at least 1.")
        if batch_size < 1:
            raise UserError(f"data.batch_size={batch_size} must be at least 1.")
        if not 0 < val_fraction < 1:
            raise UserError(f"data.val_fraction={val_fraction} must lie strictly between 0 and 1.")
        self.source = SourceConfig(**source)
        self.tokenizer_config = TokenizerConfig(**tokenizer)
        self.seq_len, self.n_future, self.batch_size = seq_len, n_future, batch_size
        self.val_fraction, self.cache_dir, self.num_workers = val_fraction, cache_dir, num_workers
        self.seed = 0 if seed is None else seed
        self.packed: PackedData | None = None

    def prepare_data(self) -> None:
        prepare(self.source, self.tokenizer_config, self.val_fraction, self.cache_dir)

    def setup(self, stage: str | None = None) -> None:
        if self.packed is not None:
            return
        self.packed = prepare(self.source, self.tokenizer_config, self.val_fraction, self.cache_dir)
        window = self.seq_len + self.n_future
        val_tokens = self.packed.meta["tokens"]["validation"]
        if val_tokens < window:
            raise UserError(
                f"data.seq_len={self.seq_len} (+{self.n_future} future tokens) is longer than the whole validation "
                f"split ({val_tokens} tokens); lower data.seq_len or raise data.val_fraction."
            )

    def description(self) -> dict[str, Any]:
        """Plain settings that recover this data's splits: the source and the validation fraction."""
        return {"source": asdict(self.source), "val_fraction": self.val_fraction, "seq_len": self.seq_len}

    @property
    def tokenizer(self) -> Tokenizer:
        assert self.packed is not None, "call setup() first"
        return self.packed.tokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def windows(self, split: str) -> TokenWindows:
        assert self.packed is not None, "call setup() first"
        path = self.packed.path / f"{split}.bin"
        return TokenWindows(path, self.packed.meta["dtype"], self.seq_len + self.n_future, self.seq_len)

    def train_dataloader(self) -> DataLoader:
        windows = self.windows("train")
        if len(windows) < self.batch_size:
            raise UserError(
                f"the training split has {len(windows)} windows of {windows.window} tokens, fewer than "
                f"data.batch_size={self.batch_size}; lower data.batch_size or data.seq_len, or add data."
            )
        rank, world_size = self._process_share()
        start = self._samples_already_seen() * world_size
        sampler = ResumableShuffle(len(windows), self.seed, start=start, rank=rank, world_size=world_size)
        return self._loader(windows, sampler=sampler, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        windows = self.windows("validation")
        rank, world_size = self._process_share()
        sampler = DistributedSampler(windows, world_size, rank, shuffle=False) if world_size > 1 else None
        return self._loader(windows, sampler=sampler, drop_last=False)

    def _process_share(self) -> tuple[int, int]:
        """(rank, world size) of this process; the datamodule splits data across processes itself."""
        trainer = self.trainer
        if trainer is None or trainer.world_size == 1:
            return 0, 1
        if trainer._accelerator_connector.use_distributed_sampler:
            raise UserError(
                "trainer.use_distributed_sampler=true would split the data a second time; "
                "keep it false (the default), MTPDataModule gives each process its share."
            )
        return trainer.global_rank, trainer.world_size

    def _samples_already_seen(self) -> int:
        """Training samples this process consumed in the current epoch, as restored from a checkpoint (else 0)."""
        trainer = self.trainer
        if trainer is None:
            return 0
        return trainer.fit_loop.epoch_loop.batch_progress.current.ready * self.batch_size

    def _loader(self, dataset: TokenWindows, sampler: Sampler | None, drop_last: bool) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            drop_last=drop_last,
            num_workers=self.num_workers,
            pin_memory=torch.cuda.is_available(),
            persistent_workers=self.num_workers > 0,
        )
