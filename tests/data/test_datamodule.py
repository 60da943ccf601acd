import pytest
import torch

from mtp.data.datamodule import MTPDataModule, ResumableShuffle
from mtp.errors import UserError


def test_shuffle_is_fixed_by_seed_and_epoch():
    sampler = ResumableShuffle(50, seed=3)
    first = list(sampler)
    assert sorted(first) == list(range(50)) and list(sampler) == first
    sampler.set_epoch(1)
    assert list(sampler) != first


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_resumed_shares_continue_where_the_run_stopped(world_size):
    """Every rank, restarted `start` samples (all ranks together) in, yields what it would have yielded next."""
    length, batch_size, batches_done = 41, 2, 3
    start = batches_done * batch_size * world_size
    for rank in range(world_size):
        straight = list(ResumableShuffle(length, 7, rank=rank, world_size=world_size))
        resumed = list(ResumableShuffle(length, 7, start=start, rank=rank, world_size=world_size))
        assert resumed == straight[batches_done * batch_size : batches_done * batch_size + len(resumed)]
    shares = [set(ResumableShuffle(length, 7, rank=r, world_size=world_size)) for r in range(world_size)]
    assert sum(len(s) for s in shares) == length // world_size * world_size
    assert len(set().union(*shares)) == length // world_size * world_size  # disjoint


def test_only_the_first_pass_after_a_resume_is_shortened():
    sampler = ResumableShuffle(10, 0, start=4)
    assert len(list(sampler)) == 6 and len(list(sampler)) == 10


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
