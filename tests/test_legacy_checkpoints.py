"""Checkpoints written before the head types were modules (tests/fixtures/legacy, made at 58142ae) load and decode
what that commit decoded from them: every head type, a shared causal depth, two medusa layers, a draft vocabulary;
through every way a checkpoint comes in (decoding, init_from, a resumed run's state dict, a sharded folder). And
checkpoints written before the loss settings had their own config (those fixtures too) keep them in their model
config: they load, the loss settings read back apart (a resumed run's: tests/test_train.py)."""

import json
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from mtp.checkpoint.format import CHECKPOINT_KEY, SHARDED_META, model_weights, read_checkpoint
from mtp.checkpoint.load import load_checkpoint
from mtp.decode.loop import generate
from mtp.decode.plan import Plan
from mtp.decode.settings import GenerationConfig, HeadsSettings
from mtp.model import MTPModel
from mtp.model.config import HEAD_TYPES, stored_model_config
from mtp.model.heads import HEADS, current_names, legacy_name
from mtp.pretrained.init_from import Start, start_config
from mtp.training.loss_config import LossConfig

LEGACY = Path(__file__).parent / "fixtures" / "legacy"
NAMES = sorted(p.stem for p in LEGACY.glob("*.ckpt"))


def record(name: str) -> dict:
    return json.loads((LEGACY / f"{name}.json").read_text())


def head_logit_sums(model: MTPModel, prompt: list[int]) -> list[float]:
    """What make.py recorded: every head's logits over the prompt, summed (causal heads read the following tokens)."""
    n = model.config.n_future
    following = torch.tensor(prompt[1:] + [0, 0])[None].unfold(1, len(prompt), 1)[:, : n - 1]
    with torch.no_grad():
        logits = model(torch.tensor([prompt]), following.transpose(0, 1) if n > 1 else None)
    return logits.double().sum(dim=(1, 2, 3)).tolist()


def test_the_fixtures_cover_every_head_type():
    stored = [read_checkpoint(LEGACY / f"{n}.ckpt")[CHECKPOINT_KEY]["model_config"] for n in NAMES]
    configs = [stored_model_config(model_config) for model_config in stored]
    assert {c.head_type for c in configs} | {"eagle3"} == set(HEAD_TYPES) == set(HEADS)  # every type there was then
    assert any(c.share_depth for c in configs) and any(c.medusa_layers > 1 for c in configs)
    assert any(c.draft_vocab for c in configs)
    old_names = {k for n in NAMES for k in model_weights(read_checkpoint(LEGACY / f"{n}.ckpt"))}
    assert not any(k.startswith("heads.") for k in old_names)  # the earlier layout, not today's
    assert {"extra_heads", "extra_inputs", "medusa_heads", "outputs"} <= {k.split(".")[0] for k in old_names}


@pytest.mark.parametrize("name", NAMES)
def test_a_legacy_checkpoint_decodes_what_it_decoded(name):
    expected = record(name)
    loaded = load_checkpoint(LEGACY / f"{name}.ckpt", "cpu", "float32")
    assert loaded.global_step == 7  # its loss, loss_weights and loss_chunk: defaults
    assert LossConfig.from_dict(loaded.loss_settings) == LossConfig()
    sums = head_logit_sums(loaded.model, expected["prompt"])
    assert sums == pytest.approx(expected["logit_sums"], rel=1e-5, abs=1e-3)
    for key, tokens in expected["decoded"].items():
        heads = int(key.split("=")[1])
        decoded, _ = generate(
            loaded.model,
            [expected["prompt"]],
            Plan(GenerationConfig(max_new_tokens=24), heads=HeadsSettings(heads=heads)),
        )
        assert decoded[0] == tokens, key


@pytest.mark.parametrize("name", NAMES)
def test_every_legacy_tensor_lands_in_todays_layout(name):
    """Strict loads through the adapter (the module hook a resumed run's LightningModule goes through too): nothing
    missing, nothing left over, every tensor where the renaming puts it."""
    checkpoint = read_checkpoint(LEGACY / f"{name}.ckpt")
    config = stored_model_config(checkpoint[CHECKPOINT_KEY]["model_config"])

    class Module(nn.Module):  # the LightningModule's layout: the model under "model."
        def __init__(self) -> None:
            super().__init__()
            self.model = MTPModel(config)

    module = Module()
    module.load_state_dict(checkpoint["state_dict"])  # strict
    own = module.model.state_dict()
    for old, tensor in model_weights(checkpoint).items():
        assert torch.equal(own[current_names({old: tensor}).popitem()[0]], tensor), old
    assert {legacy_name(k) for k in own} == set(model_weights(checkpoint))
    # the parameters in the earlier order: a resumed run's optimizer state (kept by position) fits them
    old_parameters = [k for k in model_weights(checkpoint) if k != "draft_tokens"]
    assert [legacy_name(k) for k, _ in module.model.named_parameters()] == old_parameters


def test_loss_settings_kept_in_the_model_config_move_to_the_loss_config(tmp_path):
    """Every checkpoint written before LossConfig kept the loss settings it trained with in its model config (the
    fixtures three of them, later ones eleven): decoding, init_from and the benchmarks read the model apart from
    them, and the loss settings read back as a LossConfig (``loss`` as ``mode``)."""
    checkpoint = read_checkpoint(LEGACY / "causal.ckpt")
    old = {"loss": "naive", "loss_weights": [1.0, 0.5, 0.5], "head_loss": "distill", "distill_top_k": 4}
    old |= {"causal_inputs": "drafts", "loss_weights_schedule": "linear", "loss_weights_final": [1.0, 0.0, 0.0]}
    checkpoint[CHECKPOINT_KEY]["model_config"] |= old
    path = tmp_path / "trained_before_loss_config.ckpt"
    torch.save(checkpoint, path)
    loaded = load_checkpoint(path, "cpu", "float32")
    assert loaded.config == load_checkpoint(LEGACY / "causal.ckpt").config and loaded.config.head_type == "causal"
    assert LossConfig.from_dict(loaded.loss_settings) == LossConfig(
        mode="naive",
        loss_weights=[1.0, 0.5, 0.5],
        head_loss="distill",
        distill_top_k=4,
        causal_inputs="drafts",
        loss_weights_schedule="linear",
        loss_weights_final=[1.0, 0.0, 0.0],
    )
    expected = record("causal")
    assert head_logit_sums(loaded.model, expected["prompt"]) == pytest.approx(expected["logit_sums"], rel=1e-5)
    assert Start.read(path).config == start_config(path) == loaded.config


def test_init_from_a_legacy_checkpoint_keeps_its_heads():
    start = Start.read(LEGACY / "causal.ckpt")
    model = MTPModel(start.config)
    loaded = start.load_into(model)
    assert loaded == set(model.state_dict())  # same head settings: every tensor carried over, heads included
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, start.weights[name]), name


def test_a_legacy_sharded_folder_loads(tmp_path):
    """A DCP folder (trainer=fsdp) of the earlier layout, as Lightning wrote it: ``state_dict.model.<old name>``."""
    checkpoint = read_checkpoint(LEGACY / "medusa.ckpt")
    folder = tmp_path / "sharded.ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"state_dict": checkpoint["state_dict"]}, storage_writer=dcp.FileSystemWriter(folder), no_dist=True)
    torch.save({k: v for k, v in checkpoint.items() if k != "state_dict"}, folder / SHARDED_META)
    loaded = load_checkpoint(folder, "cpu", "float32")
    expected = record("medusa")
    assert head_logit_sums(loaded.model, expected["prompt"]) == pytest.approx(expected["logit_sums"], rel=1e-5)
