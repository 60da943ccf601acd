"""LightningDataModule over packed shards: fixed windows of ``seq_len + n_future`` tokens."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from mtp.data.packing import PackedData, TokenizerConfig, prepare
from mtp.data.sources import SourceConfig, source_files
from mtp.errors import UserError

log = logging.getLogger(__name__)


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


class ResumableShuffle(DistributedSampler):
    """A random order fixed by (seed, epoch), split across processes, that can start part-way into an epoch.

    Process ``rank`` of ``world_size`` takes every world_size-th sample of the shared order. ``skip(epoch, n)``
    makes the pass over that epoch start after its first n samples (all processes together), as a resumed
    run must. A DistributedSampler, so that Lightning uses it as it is and never splits the data again.
    """

    def __init__(self, dataset: Dataset, seed: int, rank: int = 0, world_size: int = 1) -> None:
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.length = len(dataset)
        self.skipped: tuple[int, int] | None = None  # (epoch, samples) to skip once

    def skip(self, epoch: int, samples: int) -> None:
        self.skipped = (epoch, samples)

    def __iter__(self):
        order = torch.randperm(self.length, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        start = 0
        if self.skipped is not None and self.skipped[0] == self.epoch:
            start, self.skipped = self.skipped[1], None
        shared = (self.length - start) // self.num_replicas * self.num_replicas  # equal shares for every rank
        return iter(order[start + self.rank : start + shared : self.num_replicas].tolist())

    def __len__(self) -> int:
        return self.length // self.num_replicas


class ResumableLoader(DataLoader):
    """The training DataLoader, stateful in Lightning's sense (``state_dict`` / ``load_state_dict``).

    Its state is the epoch and the batches of it already handed out, the same on every process; Lightning
    stores rank 0's in the checkpoint and hands it back on resume, and the next pass over a ResumableShuffle
    skips those batches. DataLoader's own signature, so that Lightning can rebuild it with another sampler
    (``overfit_batches`` does); with another sampler there is nothing to skip.
    """

    def __init__(self, dataset: Dataset, batch_size: int = 1, sampler=None, **kwargs) -> None:
        super().__init__(dataset, batch_size=batch_size, sampler=sampler, **kwargs)
        self.batches_done = 0

    def __iter__(self):
        self.batches_done = self._batches_skipped()
        for batch in super().__iter__():
            self.batches_done += 1
            yield batch

    def _batches_skipped(self) -> int:
        sampler = self.sampler
        if not isinstance(sampler, ResumableShuffle) or not sampler.skipped or sampler.skipped[0] != sampler.epoch:
            return 0
        return sampler.skipped[1] // (self.batch_size * sampler.num_replicas)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": getattr(self.sampler, "epoch", 0), "batches": self.batches_done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if isinstance(self.sampler, ResumableShuffle):
            self.sampler.skip(state["epoch"], state["batches"] * self.batch_size * self.sampler.num_replicas)


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
        self.files: list[dict[str, Any]] = []

    def prepare_data(self) -> None:
        """Build the packed corpus if absent (Lightning calls this on one process per node, before setup; nodes or
        runs sharing a cache take turns on its lock, so one builds and the others reuse its entry)."""
        self.packed = prepare(self.source, self.tokenizer_config, self.val_fraction, self.cache_dir)

    def setup(self, stage: str | None = None) -> None:
        if self.packed is None:  # the processes that did not prepare: prepare opens the complete entry, or waits
            # on its lock for the process still building it (never reading a half-built entry, never building twice)
            self.packed = prepare(self.source, self.tokenizer_config, self.val_fraction, self.cache_dir)
        if self.source.kind == "files":  # what this run reads, as it is now (the checkpoint keeps the list)
            self.files = [{"path": str(f.resolve()), "bytes": f.stat().st_size} for f in source_files(self.source)]
        window = self.seq_len + self.n_future
        val_tokens = self.packed.meta["tokens"]["validation"]
        if val_tokens < window:
            raise UserError(
                f"data.seq_len={self.seq_len} (+{self.n_future} future tokens) is longer than the whole validation "
                f"split ({val_tokens} tokens); lower data.seq_len or raise data.val_fraction."
            )
        if self.trainer is None or self.trainer.is_global_zero:
            train, validation = self.windows("train"), self.windows("validation")
            log.info(
                "data: %d training and %d validation windows of %d tokens", len(train), len(validation), window,
            )  # fmt: skip

    def description(self) -> dict[str, Any]:
        """Plain settings that recover this data's splits: the source and the validation fraction; for a source of
        files, the files its paths matched when training set the data up (path and size), which a later glob of the
        same paths may no longer give."""
        described = {"source": asdict(self.source), "val_fraction": self.val_fraction, "seq_len": self.seq_len}
        if self.files:
            described["files"] = self.files
        return described

    def token_counts(self, split: str = "train") -> np.ndarray:
        """How often each token id occurs in a split, (vocab_size,)."""
        assert self.packed is not None, "call setup() first"
        return np.bincount(self.packed.tokens(split), minlength=self.vocab_size)

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
        sampler = ResumableShuffle(windows, self.seed, rank=rank, world_size=world_size)
        return ResumableLoader(
            windows, batch_size=self.batch_size, sampler=sampler, drop_last=True, **self._loader_settings()
        )

    def val_dataloader(self) -> DataLoader:
        windows = self.windows("validation")
        rank, world_size = self._process_share()
        sampler = DistributedSampler(windows, world_size, rank, shuffle=False) if world_size > 1 else None
        return DataLoader(windows, batch_size=self.batch_size, sampler=sampler, **self._loader_settings())

    def _process_share(self) -> tuple[int, int]:
        """(rank, number) of this process's share of the data: every loader gives each share its own batches. A
        process's global rank among all of them, except where Lightning's strategy says otherwise (tensor
        parallelism: the processes of a tensor-parallel group read the same batches, one share)."""
        if self.trainer is None:
            return 0, 1
        kwargs = getattr(self.trainer.strategy, "distributed_sampler_kwargs", None)
        if kwargs:
            return kwargs["rank"], kwargs["num_replicas"]
        return self.trainer.global_rank, self.trainer.world_size

    def _loader_settings(self) -> dict[str, Any]:
        return {
            "num_workers": self.num_workers,
            "pin_memory": torch.cuda.is_available(),
            "persistent_workers": self.num_workers > 0,
        }
