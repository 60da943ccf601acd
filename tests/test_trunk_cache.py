"""The trunk cache: a frozen trunk's outputs kept from a window's first step, the same step computed either way."""

import pytest
import torch

from mtp.errors import UserError
from mtp.model import MTPModel
from mtp.model.config import ModelConfig
from mtp.pretrained.init_from import freeze
from mtp.training.loss import mtp_loss
from mtp.training.train import train
from mtp.training.trunk_cache import TrunkCache, available_memory, cache_budget


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


@pytest.mark.parametrize("head_type", ["transformer", "causal", "medusa", "eagle3"])
def test_a_cached_step_computes_exactly_the_uncached_one(head_type):
    model = frozen_model(head_type)
    cache = TrunkCache(model, max_bytes=2**20)
    windows = torch.randint(0, 61, (2, 3, 14), generator=torch.Generator().manual_seed(1))
    for window in (windows[0], windows[1], windows[0]):  # the third step reads the first's trunk outputs
        loss, grads = step(model, window)
        cached_loss, cached_grads = step(model, window, cache)
        assert cached_loss == loss
        assert grads.keys() == cached_grads.keys() and all(torch.equal(grads[n], cached_grads[n]) for n in grads)
    assert (cache.misses, cache.hits) == (6, 3)  # 2 windows x 3 rows computed, the first read back once


def test_the_cache_keeps_no_more_than_its_budget():
    model = frozen_model()
    row_bytes = 11 * 32 * 4  # (T, d) fp32
    cache = TrunkCache(model, max_bytes=2 * row_bytes)
    window = torch.randint(0, 61, (3, 15))
    loss, _ = step(model, window, cache)
    assert len(cache.outputs) == 2 and cache.bytes == 2 * row_bytes
    assert step(model, window, cache)[0] == loss and cache.hits == 0  # one row missing: the batch is computed again


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
    assert [p.name for p in tmp_path.iterdir()] == [first.file.name]  # one whole file, no temporary left
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
    with pytest.raises(UserError, match=r"^trunk_cache_dir holds trunk-\w+-T11-float32.pt, written for another trunk"):
        step(model, window, TrunkCache(model, max_bytes=2**20, folder=tmp_path))


def test_a_cache_file_keeps_each_row_and_a_file_of_one_stacked_tensor_still_serves(tmp_path):
    """The file holds the rows as kept (writing it makes no second copy of the whole cache); a file written before,
    of one stacked tensor, is read as well."""
    model = frozen_model()
    window = torch.randint(0, 61, (3, 15), generator=torch.Generator().manual_seed(2))
    first = TrunkCache(model, max_bytes=2**20, folder=tmp_path)
    loss, _ = step(model, window, first)
    first.save()
    stored = torch.load(first.file, weights_only=True)
    assert isinstance(stored["rows"], list) and len(stored["rows"]) == 3 and "outputs" not in stored
    older = {"ids": stored["ids"], "outputs": torch.stack(stored["rows"]), "trunk": stored["trunk"]}
    torch.save(older, first.file)
    second = TrunkCache(model, max_bytes=2**20, folder=tmp_path)
    assert step(model, window, second)[0] == loss and (second.hits, second.misses) == (3, 0)


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
