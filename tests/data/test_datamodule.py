import logging
import sys

import pytest
import torch

from mtp.data import packing
from mtp.data.datamodule import MTPDataModule, ResumableLoader, ResumableShuffle
from mtp.errors import UserError
from tests.data.helpers import builders, start_preparers, wait_for, write_corpus


def loader(length: int, batch_size: int, rank: int = 0, world_size: int = 1) -> ResumableLoader:
    data = list(range(length))
    sampler = ResumableShuffle(data, seed=7, rank=rank, world_size=world_size)
    return ResumableLoader(data, batch_size, sampler, drop_last=True)


def test_shuffle_is_fixed_by_seed_and_epoch():
    sampler = ResumableShuffle(list(range(50)), seed=3)
    first = list(sampler)
    assert sorted(first) == list(range(50)) and list(sampler) == first
    sampler.set_epoch(1)
    assert list(sampler) != first


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_a_loaded_state_continues_every_rank_where_the_run_stopped(world_size):
    """Rank 0's state after 3 batches, loaded by fresh loaders on every rank: each yields what it would have next."""
    length, batch_size, done = 41, 2, 3
    for rank in range(world_size):
        straight = [b.tolist() for b in loader(length, batch_size, rank, world_size)]
        interrupted = loader(length, batch_size, rank, world_size)
        batches = iter(interrupted)
        seen = [next(batches).tolist() for _ in range(done)]
        state = interrupted.state_dict()
        assert state == {"epoch": 0, "batches": done} and seen == straight[:done]
        resumed = loader(length, batch_size, rank, world_size)
        resumed.load_state_dict(state)
        assert [b.tolist() for b in resumed] == straight[done:]
        assert resumed.state_dict()["batches"] == len(straight)
    shares = [{x for b in loader(length, batch_size, r, world_size) for x in b.tolist()} for r in range(world_size)]
    assert len(set().union(*shares)) == sum(map(len, shares))  # disjoint


def test_only_the_resumed_epoch_is_shortened():
    resumed = loader(10, 2)
    resumed.load_state_dict({"epoch": 0, "batches": 2})
    assert len(list(resumed)) == 3 and len(list(resumed)) == 5
    later = loader(10, 2)
    later.load_state_dict({"epoch": 0, "batches": 2})
    later.sampler.set_epoch(1)  # the checkpoint ended its epoch: the next one starts at its beginning
    assert len(list(later)) == 5


def test_windows_cover_seq_len_plus_future_tokens(corpus_dir, shared_cache):
    dm = MTPDataModule(
        source={"kind": "files", "paths": [str(corpus_dir / "*.txt")]},
        tokenizer={"kind": "byte"},
        seq_len=16,
        n_future=4,
        batch_size=3,
        cache_dir=str(shared_cache),
    )
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch.shape == (3, 20) and batch.dtype == torch.int64
    windows = dm.windows("validation")
    tokens = dm.packed.tokens("validation")
    assert torch.equal(windows[1], torch.from_numpy(tokens[16:36].astype("int64")))


def test_bad_datamodule_settings():
    with pytest.raises(UserError, match="batch_size=0"):
        MTPDataModule(source={}, tokenizer={}, seq_len=8, n_future=1, batch_size=0)
    with pytest.raises(UserError, match="val_fraction=1.5"):
        MTPDataModule(source={}, tokenizer={}, seq_len=8, n_future=1, batch_size=1, val_fraction=1.5)


def test_too_few_training_windows_for_one_batch(tmp_path, shared_cache):
    for i in range(30):
        (tmp_path / f"d{i}.txt").write_text(f"document number {i} " * 3)
    dm = MTPDataModule(
        source={"kind": "files", "paths": [str(tmp_path / "*.txt")]},
        tokenizer={"kind": "byte"},
        seq_len=8,
        n_future=1,
        batch_size=100_000,
        val_fraction=0.3,
        cache_dir=str(shared_cache),
    )
    dm.setup("fit")
    with pytest.raises(UserError, match="fewer than data.batch_size=100000"):
        dm.train_dataloader()


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="no fcntl: builds may overlap (safely)")
def test_setup_waits_for_another_process_preparing_the_same_data(tmp_path, monkeypatch, caplog):
    """A rank (or a second run) whose setup finds the data half-built by another process waits for it, neither
    reading the partial entry nor building its own."""
    pattern, cache, work = write_corpus(tmp_path / "corpus"), tmp_path / "cache", tmp_path / "work"
    (other,) = start_preparers(1, cache, pattern, work, slow_step="shard", delay=1.0)
    wait_for(lambda: builders(work) or other.poll() is not None, 60)  # train.bin is written, meta.json is not
    built = []
    monkeypatch.setattr(packing, "_build", lambda *args: built.append(args))
    dm = MTPDataModule(
        source={"kind": "files", "paths": [pattern]},
        tokenizer={"kind": "byte"},
        seq_len=8,
        n_future=2,
        batch_size=2,
        val_fraction=0.25,
        cache_dir=str(cache),
    )
    caplog.set_level(logging.INFO, logger="mtp.data.packing")
    dm.setup("fit")
    assert "waiting for another process preparing" in caplog.text
    out, err = other.communicate(timeout=60)
    assert other.returncode == 0, err
    assert built == [] and str(dm.packed.path) == out.strip()
    assert dm.packed.meta["tokens"]["validation"] > 0 and len(list(dm.train_dataloader())) > 0
