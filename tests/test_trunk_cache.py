"""The trunk cache: a frozen trunk's outputs kept from a window's first step, the same step computed either way."""

import os
import shutil

import pytest
import torch

from mtp.errors import UserError
from mtp.model import MTPModel
from mtp.model.config import ModelConfig
from mtp.pretrained.init_from import freeze
from mtp.training.loss import mtp_loss
from mtp.training.train import train
from mtp.training.trunk_cache import FileRows, MemoryRows, TrunkCache, available_memory, cache_budget, cache_room


def frozen_model(head_type: str = "causal") -> MTPModel:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=61, d_model=32, n_layers=6, n_heads=4, n_kv_heads=2, head_type=head_type)
    model = MTPModel(config)
    freeze(model, "trunk", set())
    return model


def step(model: MTPModel, window: torch.Tensor, trunk=None) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad()
    out = mtp_loss(model, window, trunk=trunk)
    out.total.backward()
    return out.total.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("store", ["memory", "file"])
@pytest.mark.parametrize("head_type", ["transformer", "causal", "medusa", "eagle3"])
def test_a_cached_step_computes_exactly_the_uncached_one(head_type, store, tmp_path):
    model = frozen_model(head_type)
    cache = TrunkCache(model, max_bytes=2**20, folder=tmp_path if store == "file" else None)
    windows = torch.randint(0, 61, (2, 3, 14), generator=torch.Generator().manual_seed(1))
    for window in (windows[0], windows[1], windows[1], windows[0]):  # the last two read what the first two kept
        loss, grads = step(model, window)
        cached_loss, cached_grads = step(model, window, cache)
        assert cached_loss == loss
        assert grads.keys() == cached_grads.keys() and all(torch.equal(grads[n], cached_grads[n]) for n in grads)
    assert (cache.misses, cache.hits) == (6, 6)  # 2 windows x 3 rows computed, each read back once
    assert isinstance(cache.rows, FileRows if store == "file" else MemoryRows)


@pytest.mark.parametrize("store", ["memory", "file"])
def test_the_cache_keeps_no_more_than_its_budget(store, tmp_path):
    model = frozen_model()
    row_bytes = 11 * 32 * 4  # (T, d) fp32
    cache = TrunkCache(model, max_bytes=2 * row_bytes, folder=tmp_path if store == "file" else None)
    window = torch.randint(0, 61, (3, 15))
    loss, _ = step(model, window, cache)
    assert len(cache.rows) == 2 and cache.rows.bytes == 2 * row_bytes
    assert step(model, window, cache)[0] == loss and cache.hits == 0  # one row missing: the batch is computed again
    if store == "file":
        assert cache.rows.path.stat().st_size == 2 * row_bytes


def test_a_trunk_that_trains_cannot_be_cached(make_cfg):
    with pytest.raises(UserError, match="trunk_cache_gb > 0 keeps the trunk's outputs, which change while the trunk"):
        TrunkCache.check_frozen(MTPModel(ModelConfig(vocab_size=61, d_model=32, n_layers=6, n_heads=4, n_kv_heads=2)))
    with pytest.raises(UserError, match="freeze it"):
        train(make_cfg("mtp4", ["trunk_cache_gb=1"]))


def test_training_with_the_cache_ends_with_the_same_weights(make_cfg, tiny_checkpoints):
    """Two epochs over the same few windows (the second read from the cache): the run's weights equal those of the
    run without it."""
    finals = []
    for gb in (0, 1):
        cfg = make_cfg(
            "causal4",
            [
                f"init_from={tiny_checkpoints['mtp4']}",
                "freeze=loaded",
                f"trunk_cache_gb={gb}",
                "trainer.max_steps=-1",
                "trainer.max_epochs=2",
                "trainer.limit_train_batches=2",
                "trainer.val_check_interval=null",
                "+trainer.check_val_every_n_epoch=2",
            ],
        )
        train(cfg)
        state = torch.load(f"{cfg.paths.output_dir}/checkpoints/last.ckpt", weights_only=True)["state_dict"]
        finals.append(state)
    assert finals[0].keys() == finals[1].keys()
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])


def test_a_cache_folder_serves_the_next_run_on_the_same_trunk_only(tmp_path):
    model = frozen_model()
    window = torch.randint(0, 61, (3, 15), generator=torch.Generator().manual_seed(2))
    first = TrunkCache(model, max_bytes=2**20, folder=tmp_path)
    loss, grads = step(model, window, first)
    first.save()
    rows = first.file.name.replace(".index.pt", ".rows")
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.file.name, rows]  # no temporary left
    second = TrunkCache(model, max_bytes=2**20, folder=tmp_path)
    cached_loss, cached_grads = step(model, window, second)
    assert (second.hits, second.misses) == (3, 0) and cached_loss == loss
    assert all(torch.equal(grads[n], cached_grads[n]) for n in grads)
    with torch.no_grad():
        model.layers[0].attention.wq.weight.add_(0.01)  # another trunk: another file, nothing read
    other = TrunkCache(model, max_bytes=2**20, folder=tmp_path)
    step(model, window, other)
    assert other.hits == 0 and other.file != first.file


def test_a_cache_file_of_another_trunk_or_other_layers_is_refused_in_one_sentence(tmp_path):
    """A file renamed or copied from another model's cache (the names hash the trunk): refused, not trained on."""
    model = frozen_model("eagle3")  # its cache keeps three layers' inputs beside the output: 4 x 32 wide
    window = torch.randint(0, 61, (3, 15), generator=torch.Generator().manual_seed(2))
    first = TrunkCache(model, max_bytes=2**20, folder=tmp_path)
    step(model, window, first)
    first.save()
    other = frozen_model("causal")
    other_cache = TrunkCache(other, max_bytes=2**20, folder=tmp_path / "other")
    step(other, window, other_cache)
    other_cache.save()
    other_cache.file.replace(first.file)  # the other model's outputs under this model's name
    with pytest.raises(UserError, match=r"^trunk_cache_dir holds trunk-\w+-T11-float32.index.pt, written for another"):
        step(model, window, TrunkCache(model, max_bytes=2**20, folder=tmp_path))


def test_rows_written_after_the_last_index_are_dropped_and_the_rest_serve(tmp_path):
    """A run stopped within an epoch wrote rows its index does not name: the next run cuts them off and reads the
    rows the index names."""
    model = frozen_model()
    windows = torch.randint(0, 61, (2, 3, 15), generator=torch.Generator().manual_seed(3))
    first = TrunkCache(model, max_bytes=2**20, folder=tmp_path)
    loss, _ = step(model, windows[0], first)
    first.save()
    step(model, windows[1], first)  # three more rows, never indexed
    row_bytes = first.rows.row_bytes
    assert first.rows.path.stat().st_size == 6 * row_bytes
    second = TrunkCache(model, max_bytes=2**20, folder=tmp_path)
    assert step(model, windows[0], second)[0] == loss and (second.hits, second.misses) == (3, 0)
    assert second.rows.path.stat().st_size == 3 * row_bytes
    step(model, windows[1], second)  # computed again and written where the cut rows were
    assert second.misses == 3 and second.rows.path.stat().st_size == 6 * row_bytes


def test_the_rows_are_read_from_the_file_not_kept_in_memory(tmp_path):
    """A hit reads the file: its bytes changed on disk are what the step gets (so the process holds only the index)."""
    model = frozen_model()
    window = torch.randint(0, 61, (3, 15), generator=torch.Generator().manual_seed(4))
    cache = TrunkCache(model, max_bytes=2**20, folder=tmp_path)
    computed = cache(window[:, :-1]).clone()
    sevens = torch.full(cache.rows.shape, 7.0)
    with open(cache.rows.path, "r+b") as f:
        f.write(sevens.numpy().tobytes())  # the first row, overwritten
    read = cache(window[:, :-1])
    assert cache.hits == 3 and torch.equal(read[1:], computed[1:]) and torch.equal(read[0], sevens)


def test_a_cache_file_of_earlier_versions_still_serves(tmp_path):
    """Earlier versions kept every row in one .pt file (a list of rows, or before that one stacked tensor): read once
    into the row file, the same step computed."""
    model = frozen_model()
    window = torch.randint(0, 61, (3, 15), generator=torch.Generator().manual_seed(2))
    loss, grads = step(model, window)
    memory = TrunkCache(model, max_bytes=2**20)
    step(model, window, memory)
    ids = torch.stack([torch.frombuffer(bytearray(key), dtype=torch.long) for key in memory.rows.keys()])
    rows = [row.clone() for row in memory.rows.rows.values()]
    probe = TrunkCache(model, max_bytes=2**20, folder=tmp_path)
    step(model, window, probe)
    stem = probe.file.name.removesuffix(".index.pt")
    for path in tmp_path.iterdir():
        path.unlink()
    for kind, stored in [("rows", {"rows": rows}), ("stacked", {"outputs": torch.stack(rows)})]:
        torch.save({"ids": ids, **stored, "trunk": probe.trunk}, tmp_path / f"{stem}.pt")
        cache = TrunkCache(model, max_bytes=2**20, folder=tmp_path / ".." / tmp_path.name)
        cached_loss, cached_grads = step(model, window, cache)
        assert (cache.hits, cache.misses) == (3, 0), kind
        assert cached_loss == loss and all(torch.equal(grads[n], cached_grads[n]) for n in grads)
        cache.save()
        assert cache.file.is_file() and cache.rows.path.stat().st_size == 3 * cache.rows.row_bytes
        for path in [cache.file, cache.rows.path]:
            path.unlink()


def test_the_cache_holds_at_most_half_the_memory_the_machine_has_available():
    gib = 2**30
    assert cache_budget(6 * gib, 20 * gib) == (6 * gib, None)
    assert cache_budget(6 * gib, None) == (6 * gib, None)  # no word from the kernel: as asked
    bound, note = cache_budget(6 * gib, 8 * gib)
    assert bound == 4 * gib
    assert note == (
        "trunk cache: 4.0 GiB, half the 8.0 GiB this machine has available, not the trunk_cache_gb=6 asked; windows "
        "past it run the trunk each epoch"
    )
    assert available_memory() is None or available_memory() > 0
    _, where = cache_budget(6 * gib, 8 * gib, "free on the disk of trunk_cache_dir=data/cache/trunk")
    assert "half the 8.0 GiB free on the disk of trunk_cache_dir=data/cache/trunk, not the" in where


def test_a_cache_folder_is_bounded_by_its_free_disk_and_what_its_rows_already_hold(tmp_path):
    for name in ("trunk-0123-T11-float32.rows", "other.bin"):  # sparse: 1 GiB long each, nothing on the disk
        (tmp_path / name).touch()
        os.truncate(tmp_path / name, 2**30)
    free, where = cache_room(tmp_path)
    assert free is not None and where == f"free on the disk of trunk_cache_dir={tmp_path}"
    assert abs(free - shutil.disk_usage(tmp_path).free - 2**30) < 2**26  # the disk's own use moves meanwhile
    assert cache_room(tmp_path / "not" / "yet")[0] is not None  # a folder to be made: the disk above it
    assert cache_room(None)[1] == "this machine has available"
