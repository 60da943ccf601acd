"""LightningDataModule over packed shards: fixed windows of ``seq_len + n_future`` tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, Dataset

from mtp.data.packing import PackedData, TokenizerConfig, prepare
from mtp.data.sources import SourceConfig
from mtp.errors import UserError


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
        return self._loader(self.windows("train"), shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.windows("validation"), shuffle=False)

    def _loader(self, dataset: TokenWindows, shuffle: bool) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            drop_last=shuffle,
            num_workers=self.num_workers,
            pin_memory=torch.cuda.is_available(),
            persistent_workers=self.num_workers > 0,
        )
