"""A causal-head model exported in MiMo's layout (the folder vLLM drafts from with its own MTP layer), read back by an
independent reference: the MTP layer is a small forward written from vLLM's ``model_executor/models/mimo_mtp.py``
(``MiMoMultiTokenPredictorLayer.forward``) and ``qwen2.py`` (``Qwen2DecoderLayer``), reading only the exported
files; the trunk is transformers' Qwen2 over the same files. Then the folder imported back, and what is refused."""

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mtp.checkpoint.load import foreign_format, load_checkpoint, read_foreign_config
from mtp.commands import export as export_command
from mtp.errors import UserError
from mtp.interop.mimo import MIMO_ARCHITECTURE
from mtp.model import MTPModel
from mtp.model.config import ModelConfig
from mtp.pretrained.export import export_mimo
from tests.interop.test_engines import checkpoint_of, rms_norm, rotate

safetensors_torch = pytest.importorskip("safetensors.torch", reason="exports need safetensors: pip install -e '.[hf]'")
transformers = pytest.importorskip("transformers", reason="exports need transformers: pip install -e '.[hf]'")


def causal_model(n_future: int = 2, first_token: str = "zero"):
    """A random causal-head model, every norm weight away from 1 (a lost or swapped norm shows)."""
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=320, d_model=32, n_layers=4 + n_future, n_heads=4, n_kv_heads=2, n_future=n_future,
        head_type="causal", causal_first_token=first_token,
    )  # fmt: skip
    model = MTPModel(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)
    return model


def exported(model, tmp_path: Path) -> Path:
    tmp_path.mkdir(exist_ok=True)
    out = tmp_path / "mimo"
    export_mimo(checkpoint_of(model, tmp_path / "m.ckpt"), out)
    return out


class MiMoMTPReference:
    """vLLM's MiMo MTP layer over an exported folder: ``MiMoMultiTokenPredictorLayer.forward`` (the token input zeroed
    at position 0; token_layernorm and hidden_layernorm; input_proj over [hidden; embedding]; a Qwen2 decoder layer
    with q/k/v biases; residual + hidden; final_layernorm) and ``compute_logits`` with the target's lm_head."""

    def __init__(self, folder: Path):
        self.w = safetensors_torch.load_file(str(folder / "model.safetensors"))
        self.c = json.loads((folder / "config.json").read_text())

    def decoder_layer(self, positions, x, prefix):
        """Qwen2DecoderLayer over every position at once (causal attention), its output + its residual."""
        c, w = self.c, self.w
        eps, heads, kv_heads = c["rms_norm_eps"], c["num_attention_heads"], c["num_key_value_heads"]
        head_dim = c["hidden_size"] // heads
        residual = x
        h = rms_norm(x, w[prefix + "input_layernorm.weight"], eps)

        def project(name, count):
            out = h @ w[f"{prefix}self_attn.{name}.weight"].T + w[f"{prefix}self_attn.{name}.bias"]
            return out.view(-1, count, head_dim)

        q, k, v = project("q_proj", heads), project("k_proj", kv_heads), project("v_proj", kv_heads)
        q, k = rotate(q, positions, c["rope_theta"]), rotate(k, positions, c["rope_theta"])
        k, v = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))
        scores = torch.einsum("thd,shd->hts", q, k) / head_dim**0.5
        T = positions.numel()
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        attn = torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(T, -1)
        residual = attn @ w[prefix + "self_attn.o_proj.weight"].T + residual
        h = rms_norm(residual, w[prefix + "post_attention_layernorm.weight"], eps)
        mlp = F.silu(h @ w[prefix + "mlp.gate_proj.weight"].T) * (h @ w[prefix + "mlp.up_proj.weight"].T)
        return mlp @ w[prefix + "mlp.down_proj.weight"].T + residual

    def logits(self, input_ids, positions, previous_hidden_states):
        """Layer 0's draft logits at every position: input_ids (T,) the tokens after each position, previous hidden
        states (T, H) the target's last layer's output there, before its final norm."""
        c, w, p = self.c, self.w, "model.mtp_layers.0."
        assert c["architectures"] == [MIMO_ARCHITECTURE] and c["num_nextn_predict_layers"] == 1
        eps = c["rms_norm_eps"]
        inputs_embeds = w["model.embed_tokens.weight"][input_ids].clone()
        inputs_embeds[positions == 0] = 0  # masking inputs at position 0, as not needed by MTP
        inputs_embeds = rms_norm(inputs_embeds, w[p + "token_layernorm.weight"], eps)
        previous = rms_norm(previous_hidden_states, w[p + "hidden_layernorm.weight"], eps)
        hidden = torch.cat([previous, inputs_embeds], dim=-1) @ w[p + "input_proj.weight"].T
        hidden = self.decoder_layer(positions, hidden, p)
        return rms_norm(hidden, w[p + "final_layernorm.weight"], eps) @ w["lm_head.weight"].T


def qwen2_of(folder: Path):
    """transformers' Qwen2 over the folder, and a hook that keeps its last layer's output (the state before the final
    norm, what vLLM's MiMo hands its MTP layer)."""
    qwen2 = transformers.Qwen2ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    kept = {}

    def keep(module, args, output):
        kept["last"] = output[0] if isinstance(output, tuple) else output

    qwen2.model.layers[-1].register_forward_hook(keep)
    return qwen2, kept


@pytest.mark.parametrize("n_future", [2, 3])
def test_a_mimo_export_drafts_what_mtp_drafts_read_as_vllm_reads_it(n_future, tmp_path):
    """Qwen2 over the exported trunk gives mtp's head-1 logits; vLLM's MTP layer over the exported files, fed Qwen2's
    last states and the token after each position, gives mtp's depth-2 logits (fp32, within 1e-5); a third depth is
    not written."""
    model = causal_model(n_future)
    folder = exported(model, tmp_path)
    tokens = torch.randint(0, 320, (1, 12), generator=torch.Generator().manual_seed(1))
    T = 10
    following = torch.stack([tokens[:, j : j + T] for j in range(1, n_future)])
    qwen2, kept = qwen2_of(folder)
    reference = MiMoMTPReference(folder)
    with torch.no_grad():
        expected = model(tokens[:, :T], following=following)  # (n, 1, T, V)
        head1 = qwen2(tokens[:, :T]).logits
        torch.testing.assert_close(head1, expected[0], rtol=0, atol=1e-5)
        drafts = reference.logits(tokens[0, 1 : T + 1], torch.arange(T), kept["last"][0])
        torch.testing.assert_close(drafts, expected[1, 0], rtol=0, atol=1e-5)
    assert not any(name.startswith("model.mtp_layers.1.") for name in reference.w)
    assert reference.c["num_hidden_layers"] == model.config.n_layer_blocks
    assert all(not tensor.count_nonzero() for name, tensor in reference.w.items() if name.endswith("_proj.bias"))


def test_a_model_trained_reading_the_first_token_drafts_otherwise_at_position_0(tmp_path):
    """Without model.causal_first_token=zero, vLLM's layer (which zeroes the token at position 0) drafts otherwise
    there and the same everywhere after (attention reads position 0's keys, so only nearly): the option is what makes
    the two agree."""
    model = causal_model(first_token="keep")
    folder = exported(model, tmp_path)
    tokens = torch.randint(0, 320, (1, 9), generator=torch.Generator().manual_seed(2))
    qwen2, kept = qwen2_of(folder)
    with torch.no_grad():
        expected = model(tokens[:, :8], following=tokens[None, :, 1:9])[1, 0]
        qwen2(tokens[:, :8])
        drafts = MiMoMTPReference(folder).logits(tokens[0, 1:9], torch.arange(8), kept["last"][0])
    assert not torch.allclose(drafts[0], expected[0], atol=1e-3)


@pytest.mark.parametrize("first_token", ["zero", "keep"])
def test_an_exported_folder_reads_back_as_the_model_it_came_from(first_token, tmp_path):
    """Export then import is the identity: every tensor, the config (what depth 2 reads at position 0 included);
    decode.py and init_from= read the folder as a MiMo one."""
    model = causal_model(first_token=first_token)
    folder = exported(model, tmp_path)
    assert foreign_format(folder) == "mimo"
    loaded = load_checkpoint(folder, "cpu", "float32")
    assert loaded.config == model.config == read_foreign_config(folder)
    back, own = loaded.model.state_dict(), model.state_dict()
    assert back.keys() == own.keys()
    for name, tensor in own.items():
        assert torch.equal(back[name], tensor), name
    files = sorted(p.name for p in folder.iterdir())
    assert files == [
        "README.md", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json",
    ]  # fmt: skip


def test_depths_beyond_two_are_left_out_and_the_rest_reads_back(tmp_path):
    model = causal_model(3)
    folder = exported(model, tmp_path)
    assert "Depths 3..3 are not written" in (folder / "README.md").read_text()
    loaded = load_checkpoint(folder, "cpu", "float32")
    assert loaded.config.n_future == 2 and loaded.config.n_layers == model.config.n_layers - 1
    own = model.state_dict()
    for name, tensor in loaded.model.state_dict().items():
        assert torch.equal(tensor, own[name]), name


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"head_type": "transformer"}, r"^format=mimo carries causal heads .* not this checkpoint's transformer"),
        ({"head_type": "causal", "n_future": 1}, r"this checkpoint has one head \(model.n_future=1\)"),
        ({"head_type": "causal", "draft_vocab": 40}, r"reduced one \(model.draft_vocab=40\); train with"),
    ],
    ids=["transformer", "one-head", "draft-vocab"],
)
def test_what_the_layout_cannot_carry_is_one_sentence_and_leaves_nothing(settings, message, tmp_path):
    values = {"vocab_size": 320, "d_model": 32, "n_layers": 6, "n_heads": 4, "n_kv_heads": 2, "n_future": 2}
    model = MTPModel(ModelConfig(**{**values, **settings}))
    out = tmp_path / "mimo"
    with pytest.raises(UserError, match=message):
        export_mimo(checkpoint_of(model, tmp_path / "m.ckpt"), out)
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["m.ckpt"]


def test_the_command_names_the_format_by_its_flag(tmp_path):
    """The library names the export's ``format`` field (above); scripts/export.py spells it as its flag."""
    values = {"vocab_size": 320, "d_model": 32, "n_layers": 6, "n_heads": 4, "n_kv_heads": 2, "n_future": 2}
    checkpoint = checkpoint_of(MTPModel(ModelConfig(**values)), tmp_path / "m.ckpt")
    with pytest.raises(UserError) as refused:
        export_command.main([str(checkpoint), str(tmp_path / "mimo"), "--format", "mimo"])
    assert str(refused.value) == (
        "--format mimo carries causal heads (DeepSeek-V3's MTP modules, MiMo's layer), not this checkpoint's "
        "transformer heads; train with model=causal2 (model.head_type=causal), or export --format hf, which keeps "
        "every head for mtp to read back."
    )
    assert not (tmp_path / "mimo").exists()


def edited(folder: Path, tensors=None, config=None) -> Path:
    """The folder with some tensors replaced (None: removed) or config.json entries changed."""
    weights = safetensors_torch.load_file(str(folder / "model.safetensors"))
    for name, tensor in (tensors or {}).items():
        if tensor is None:
            weights.pop(name)
        else:
            weights[name] = tensor
    safetensors_torch.save_file(weights, str(folder / "model.safetensors"))
    settings = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**settings, **(config or {})}))
    return folder


def test_a_folder_mtp_cannot_compute_is_one_sentence(tmp_path):
    model = causal_model()
    folder = exported(model, tmp_path)
    weights = safetensors_torch.load_file(str(folder / "model.safetensors"))
    layer = [name for name in weights if name.startswith("model.mtp_layers.0.")]

    no_layer = edited(exported(model, tmp_path / "a"), dict.fromkeys(layer), {"num_nextn_predict_layers": 0})
    with pytest.raises(UserError, match=r"is a MiMo folder with no MTP layer \(num_nextn_predict_layers=0\)"):
        read_foreign_config(no_layer)
    no_tensors = edited(exported(model, tmp_path / "b"), dict.fromkeys(layer))
    with pytest.raises(UserError, match=r"is a MiMo folder with no MTP layer \(no model.mtp_layers.0.\* tensors\)"):
        load_checkpoint(no_tensors)
    bias = "model.layers.1.self_attn.k_proj.bias"
    biased = edited(exported(model, tmp_path / "c"), {bias: torch.full_like(weights[bias], 0.1)})
    with pytest.raises(UserError, match=rf"{bias} is not zero, and mtp's blocks have no q/k/v biases"):
        load_checkpoint(biased)
    norm = "model.mtp_layers.0.final_layernorm.weight"
    other_norm = edited(exported(model, tmp_path / "d"), {norm: weights[norm] * 2})
    with pytest.raises(UserError, match="final_layernorm differs from model.norm"):
        load_checkpoint(other_norm)
    lost = edited(exported(model, tmp_path / "e"), {"model.mtp_layers.0.input_proj.weight": None})
    with pytest.raises(UserError, match=r"lacks tensor model.mtp_layers.0.input_proj.weight"):
        load_checkpoint(lost)


def test_init_from_a_mimo_folder_keeps_what_its_layer_reads_at_position_0(tmp_path):
    """init_from= takes the folder's causal_first_token for heads of its type unless the command line sets it; heads
    of another type start anew and read what they are told."""
    from mtp.pretrained.init_from import settings_from_checkpoint

    folder = exported(causal_model(first_token="zero"), tmp_path)
    causal = {"head_type": "causal", "n_future": 2}
    assert settings_from_checkpoint(folder, causal, set())["causal_first_token"] == "zero"
    told = settings_from_checkpoint(folder, {**causal, "causal_first_token": "keep"}, {"causal_first_token"})
    assert told["causal_first_token"] == "keep"
    assert "causal_first_token" not in settings_from_checkpoint(folder, {"head_type": "transformer"}, set())


@pytest.mark.slow  # two training runs
def test_a_pretrained_causal_model_fine_tunes_with_its_mtp_layer_from_a_mimo_folder(make_cfg, tmp_path):
    """The documented round: pretrain with causal heads read as vLLM reads them, export as MiMo, fine-tune from the
    folder with experiment=mtp_layer (the layer's loss kept out of the trunk), export again."""
    from mtp.checkpoint.load import load_checkpoint as load
    from mtp.training.train import train

    first = make_cfg("causal2", ["model.causal_first_token=zero"])
    train(first)
    folder = tmp_path / "mimo"
    export_mimo(Path(first.paths.output_dir) / "checkpoints" / "last.ckpt", folder)
    tuned = make_cfg("causal2", ["experiment=mtp_layer", f"init_from={folder}", "trainer.max_steps=2"])
    tuned.paths.output_dir = str(tmp_path / "tuned")
    train(tuned)
    checkpoint = Path(tuned.paths.output_dir) / "checkpoints" / "last.ckpt"
    loaded = load(checkpoint)
    assert loaded.config.causal_first_token == "zero" and loaded.loss_settings["detach_heads"] is True
    export_mimo(checkpoint, tmp_path / "again")
    assert (tmp_path / "again" / "model.safetensors").is_file()
