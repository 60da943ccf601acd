"""init_from + freeze: a trained model grows heads; frozen weights stay bit-identical and hold no optimizer state."""

import json
import shutil

import pytest
import torch
from omegaconf import open_dict

from mtp.checkpoint.format import CHECKPOINT_KEY
from mtp.errors import UserError
from mtp.model import MTPModel
from mtp.model.config import ModelConfig
from mtp.pretrained.init_from import freeze
from mtp.training.loss import mtp_loss
from mtp.training.train import build, train
from tests.test_scripts import assert_one_clear_error, pretrain, tiny_data


def weights(path) -> dict[str, torch.Tensor]:
    state = torch.load(path, weights_only=True)["state_dict"]
    return {k.removeprefix("model."): v for k, v in state.items()}


def grow(make_cfg, start, preset: str, *extra: str):
    cfg = make_cfg(preset, [f"init_from={start}", "model.vocab_size=512", "trainer.max_steps=3", *extra])
    train(cfg)
    return cfg.paths.output_dir + "/checkpoints/last.ckpt"


def test_freeze_loaded_trains_only_the_added_causal_heads(make_cfg, tiny_checkpoints):
    start = tiny_checkpoints["mtp4"]
    before = weights(start)
    path = grow(make_cfg, start, "causal4", "freeze=loaded")
    after = weights(path)
    checkpoint = torch.load(path, weights_only=True)
    start_meta, meta = torch.load(start, weights_only=True)[CHECKPOINT_KEY], checkpoint[CHECKPOINT_KEY]
    assert meta["tokenizer"] == start_meta["tokenizer"]  # the data was tokenized as the start model's
    assert meta["model_config"]["n_layers"] == start_meta["model_config"]["n_layers"]  # trunk + head 1 + 3 new blocks
    loaded = [k for k in after if k.startswith(("tok_embeddings", "layers.", "norm.", "heads.outputs.0"))]
    added = [k for k in after if k.startswith(("heads.layers", "heads.inputs"))]
    assert loaded and added and len(loaded) + len(added) == len(after)
    for name in loaded:
        assert torch.equal(after[name], before[name]), name  # bit-identical
    assert all(not torch.equal(after[k], before[k]) for k in added if k in before and after[k].shape == before[k].shape)
    trainable = sum(after[k].numel() > 0 for k in added)
    optimizer = checkpoint["optimizer_states"][0]
    assert len(optimizer["state"]) == trainable == sum(len(g["params"]) for g in optimizer["param_groups"])


def test_freeze_loaded_trains_only_the_eagle3_draft_from_the_whole_start_model(make_cfg, tiny_checkpoints):
    """Every block of the start model is trunk under EAGLE-3 heads (head 1 is the start's: its last block, norm and
    unembedding); the draft's unembedding starts as head 1's, and only the draft trains."""
    start = tiny_checkpoints["mtp4"]
    before = weights(start)
    path = grow(make_cfg, start, "eagle3", "freeze=loaded")
    after, meta = weights(path), torch.load(path, weights_only=True)[CHECKPOINT_KEY]
    start_blocks = len({k.split(".")[1] for k in before if k.startswith("layers.")})
    config = ModelConfig.from_dict(meta["model_config"])
    assert config.n_layer_blocks == start_blocks and config.n_layers == start_blocks + 1
    assert config.feature_layers == [2, start_blocks // 2, start_blocks - 3]
    loaded = [k for k in after if k.startswith(("tok_embeddings", "layers.", "norm.", "heads.outputs.0"))]
    assert all(torch.equal(after[k], before[k]) for k in loaded)  # the start model, bit-identical
    added = set(after) - set(loaded)
    assert {k.split(".")[1] for k in added} == {"outputs", "fc", "layer", "norm"}
    assert not torch.equal(after["heads.outputs.1.weight"], before["heads.outputs.0.weight"])  # trained from there
    assert (after["heads.outputs.1.weight"] - before["heads.outputs.0.weight"]).abs().max() < 0.05  # 3 steps away


def test_freeze_trunk_trains_head1_and_medusa_heads(make_cfg, tiny_checkpoints):
    start = tiny_checkpoints["mtp4"]
    before = weights(start)
    after = weights(grow(make_cfg, start, "medusa4", "freeze=trunk"))
    assert len([k for k in after if k.startswith("layers.")]) == len([k for k in before if k.startswith("layers.")])
    for name in after:
        if name.startswith(("tok_embeddings", "layers.")):
            assert torch.equal(after[name], before[name]), name
    assert not torch.equal(after["heads.outputs.0.weight"], before["heads.outputs.0.weight"])  # head 1 trains
    assert not torch.equal(
        after["heads.residuals.0.layers.0.weight"], torch.zeros_like(after["heads.residuals.0.layers.0.weight"])
    )


def test_freeze_none_takes_the_start_weights_and_trains_them(make_cfg, tiny_checkpoints):
    start = tiny_checkpoints["mtp4"]
    path = grow(make_cfg, start, "mtp4", "model.n_future=2", "trainer.max_steps=1", "optim.lr=1e-9")
    before, after = weights(start), weights(path)
    assert set(after) == {k for k in before if not k.startswith(("heads.layers.1", "heads.layers.2"))}
    for name, tensor in after.items():  # started from the checkpoint (a near-zero step moved them a hair)
        torch.testing.assert_close(tensor, before[name], rtol=0, atol=1e-6)


@pytest.mark.parametrize("mode", ["loaded", "trunk"])
def test_freeze_stops_exactly_the_gradients_of_its_part(mode):
    model = MTPModel(ModelConfig(vocab_size=61, d_model=32, n_layers=6, n_heads=4, n_kv_heads=2, head_type="causal"))
    loaded = {name for name, _ in model.named_parameters() if name.startswith(("tok_embeddings", "layers.", "norm."))}
    loaded.add("heads.outputs.0.weight")
    freeze(model, mode, loaded)
    if mode == "loaded":
        expected_frozen = loaded
    else:  # the embedding and the trunk blocks: every block of `layers` but head 1's
        trunk_blocks = {f"layers.{i}." for i in range(len(model.layers) - 1)}
        expected_frozen = {
            n for n, _ in model.named_parameters() if n == "tok_embeddings.weight" or n.startswith(tuple(trunk_blocks))
        }
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    assert frozen == expected_frozen
    model.zero_grad()
    mtp_loss(model, torch.randint(0, 61, (2, 12))).total.backward()
    assert all((p.grad is None) == (name in frozen) for name, p in model.named_parameters())


@pytest.mark.parametrize(
    ("preset", "extra", "message"),
    [
        ("mtp4", ["init_from={tmp}/missing.ckpt"], "does not exist"),
        ("mtp4", ["init_from={tmp}/bad.ckpt"], "truncated or not a PyTorch checkpoint"),
        (
            "mtp4",
            ["init_from={start}", "model.d_model=48"],
            "has model.d_model=64, which its weights fix, but the "
            "command line asks for model.d_model=48; drop that override",
        ),
        (
            "mtp4",
            ["init_from={start}", "model.vocab_size=1024", "model.n_heads=2"],
            "has model.vocab_size=512, model.n_heads=4, which its weights fix, but the command line asks for "
            "model.vocab_size=1024 model.n_heads=2;",
        ),
        ("mtp4", ["init_from={start}", "freeze=loaded"], "freeze=loaded leaves nothing to train"),
        ("mtp4", ["freeze=trunk"], "freeze=trunk needs a trained model to start from"),
        ("mtp4", ["init_from={start}", "freeze=heads"], "freeze='heads' is not one of"),
        ("mtp4", ["model.share_depth=true"], "applies to causal heads only"),
    ],
)
def test_bad_start_settings_are_one_sentence(make_cfg, tiny_checkpoints, tmp_path, preset, extra, message):
    (tmp_path / "bad.ckpt").write_bytes(b"not a checkpoint")
    extra = [e.format(tmp=tmp_path, start=tiny_checkpoints["mtp4"]) for e in extra]
    with pytest.raises(UserError, match=message):
        train(make_cfg(preset, extra))


@pytest.mark.slow
def test_a_bad_start_exits_2_and_leaves_nothing(corpus_dir, shared_cache, tmp_path, tiny_checkpoints):
    result = pretrain(
        *tiny_data(corpus_dir, shared_cache),
        f"init_from={tiny_checkpoints['mtp4']}",
        "freeze=loaded",
        tmp_path=tmp_path,
    )
    assert_one_clear_error(result, "freeze=loaded leaves nothing to train")
    assert result.returncode == 2
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").rglob("runs/*"))


def test_init_from_takes_every_shape_from_the_checkpoint(make_cfg, tiny_checkpoints):
    """Values a preset gives (not the command line) give way to the checkpoint's; an explicit context is kept."""
    start = tiny_checkpoints["mtp4"]
    trained = ModelConfig.from_dict(torch.load(start, weights_only=True)[CHECKPOINT_KEY]["model_config"])
    cfg = make_cfg("causal4", [f"init_from={start}", "freeze=loaded", "model.max_seq_len=96"])
    with open_dict(cfg):  # what another size preset would have set
        cfg.model.update(d_model=128, n_heads=8, n_kv_heads=8, vocab_size=8192, rope_theta=5e5, norm_eps=1e-6)
    _, module, _ = build(cfg)
    for name in ("vocab_size", "d_model", "n_heads", "n_kv_heads", "ffn_hidden", "rope_theta", "norm_eps"):
        assert getattr(module.config, name) == getattr(trained, name), name
    assert module.config.max_seq_len == 96 != trained.max_seq_len
    assert module.config.head_type == "causal"


CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.slow  # ~7 s: trains heads on a start model
def test_the_start_models_chat_template_travels_with_the_heads_trained_on_it(make_cfg, tiny_checkpoints, tmp_path):
    """A checkpoint trained from a model that declares a chat template carries it (decode, bench_decode and distill
    speak to the heads' model as to the start), on through a second init_from and into an export; one started from
    a model without a template carries none."""
    from mtp.checkpoint.load import chat_template_of, model_chat
    from mtp.commands import bench_decode
    from mtp.interop.chat import ChatTemplate, ModelChat

    chat = ModelChat(CHATML, "", "<|im_end|>")
    checkpoint = torch.load(tiny_checkpoints["mtp4"], weights_only=True)
    checkpoint[CHECKPOINT_KEY]["chat"] = chat.to_dict()
    start = tmp_path / "start.ckpt"
    torch.save(checkpoint, start)
    assert model_chat(start) == chat
    path = shutil.copy(
        grow(make_cfg, start, "causal4", "freeze=loaded"), tmp_path / "grown.ckpt"
    )  # runs share a folder
    assert torch.load(path, weights_only=True)[CHECKPOINT_KEY]["chat"] == chat.to_dict()
    assert (
        ChatTemplate(model_chat(path), path).render("Sort.")
        == "<|im_start|>user\nSort.<|im_end|>\n<|im_start|>assistant\n"
    )
    args = [str(path), "--prompt-set", "humaneval", "--prompts", "2", "--out", str(tmp_path / "bench")]
    assert bench_decode.checked_args(args).prompt_format == "chat"  # auto: the checkpoint declares the template
    again = shutil.copy(grow(make_cfg, path, "mtp4", "freeze=loaded"), tmp_path / "again.ckpt")
    assert model_chat(again) == chat
    plain = grow(make_cfg, tiny_checkpoints["mtp4"], "causal4", "freeze=loaded")
    assert "chat" not in torch.load(plain, weights_only=True)[CHECKPOINT_KEY]
    assert chat_template_of(plain) is None and model_chat(plain) == ModelChat()
    pytest.importorskip("transformers", reason="export needs transformers: pip install -e '.[hf]'")
    from mtp.pretrained.export import export_hf

    export_hf(path, tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["chat_template"] == CHATML
    assert chat_template_of(tmp_path / "hf") == CHATML
