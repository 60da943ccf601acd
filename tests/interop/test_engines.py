"""Draft heads exported in the engines' layouts (EAGLE-3 for vLLM, SGLang and llama.cpp; Medusa for vLLM), read back
by small forwards written from vLLM's modules (vllm/model_executor/models/llama_eagle3.py: the decoder layer, the
model's forward and compute_logits; medusa.py: ResidualBlock and compute_logits), never from mtp's code: they give mtp's
draft logits from the exported files alone."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mtp.checkpoint.format import CHECKPOINT_FORMAT, CHECKPOINT_KEY
from mtp.data.tokenizer import byte_tokenizer
from mtp.errors import UserError
from mtp.interop.engines import EAGLE3_ARCHITECTURE
from mtp.model import MTPModel
from mtp.model.config import ModelConfig
from mtp.pretrained.export import export_draft
from mtp.training.loss_config import LossConfig

safetensors_torch = pytest.importorskip("safetensors.torch", reason="exports need safetensors: pip install -e '.[hf]'")
pytest.importorskip("transformers", reason="exports need transformers: pip install -e '.[hf]'")


def checkpoint_of(model: MTPModel, path: Path) -> Path:
    """An mtp checkpoint file holding ``model`` (as training writes one, its tokenizer a byte tokenizer)."""
    meta = {
        "format": CHECKPOINT_FORMAT,
        "model_config": model.config.to_dict(),
        "loss_config": LossConfig().to_dict(),
        "tokenizer": byte_tokenizer().to_str(),
        "data": {},
    }
    state = {f"model.{name}": tensor for name, tensor in model.state_dict().items()}
    torch.save({"state_dict": state, CHECKPOINT_KEY: meta, "global_step": 0}, path)
    return path


def parallel_head_as_eagle3(model: MTPModel) -> MTPModel:
    """Head 2 of a model of ``transformer`` heads as the one-draft EAGLE-3 draft it equals: the fused state is the
    input of the last layer (``fc`` passes it through: all three of its layer ids name the last layer), head 2's block
    reads it with the embedding half of q/k/v zero, then the shared norm and unembedding. Only the first draft is
    the same: a parallel head 3 does not read head 2's state, as EAGLE-3's second draft would."""
    config = model.config
    assert config.head_type == "transformer" and config.n_future > 1
    last = config.n_layer_blocks - 1
    values = {**config.to_dict(), "head_type": "eagle3", "n_future": 2, "eagle3_layers": [last] * 3}
    values["n_layers"] = config.n_layer_blocks + 1
    draft = MTPModel(ModelConfig.from_dict(values))
    source, d = model.state_dict(), config.d_model
    weights = {name: tensor for name, tensor in source.items() if name.startswith(("tok_embeddings.", "layers."))}
    weights |= {"norm.weight": source["norm.weight"], "heads.outputs.0.weight": source["heads.outputs.0.weight"]}
    if config.draft_vocab:
        weights["draft_tokens"] = source["draft_tokens"]
    block = model.heads.block(2)
    for name, tensor in block.state_dict().items():
        if name == "attention_norm.weight":
            weights["heads.layer.attention_norm.embedding_norm.weight"] = torch.ones_like(tensor)
            weights["heads.layer.attention_norm.state_norm.weight"] = tensor
        elif name.startswith("attention.w") and name[len("attention.w")] in "qkv":
            weights[f"heads.layer.{name}"] = torch.cat([torch.zeros_like(tensor), tensor], dim=1)  # (out, 2d)
        else:
            weights[f"heads.layer.{name}"] = tensor
    eye = torch.eye(d, dtype=source["norm.weight"].dtype)
    weights["heads.fc.weight"] = torch.cat([torch.zeros(d, 2 * d, dtype=eye.dtype), eye], dim=1)  # (d, 3d)
    weights["heads.norm.weight"] = source["norm.weight"]
    weights["heads.outputs.1.weight"] = source["heads.outputs.0.weight"]
    draft.load_state_dict(weights)
    return draft.eval()


def model_of(seed: int = 0, **settings) -> MTPModel:
    """A random model, every norm weight away from 1 (a lost or swapped norm shows), draft vocabulary shuffled."""
    torch.manual_seed(seed)
    config = ModelConfig(vocab_size=320, d_model=32, n_layers=7, n_heads=4, n_kv_heads=2, n_future=3, **settings)
    model = MTPModel(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)
            elif name.startswith("heads.residuals"):  # medusa's zero-initialised layers
                parameter.normal_(0, 0.05)
        if config.draft_vocab:
            chosen = torch.randperm(config.vocab_size, generator=torch.Generator().manual_seed(seed))
            model.draft_tokens.copy_(chosen[: config.draft_vocab].sort().values)
    return model


def rms_norm(x, weight, eps):  # vLLM's RMSNorm
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate(x, positions, theta):  # vLLM's default rotary embedding (neox style: halves), x (T, heads, head_dim)
    half = x.size(-1) // 2
    inv_freq = 1.0 / theta ** (torch.arange(0, half * 2, 2, dtype=torch.float32) / (half * 2))
    angles = positions[:, None].float() * inv_freq  # (T, half)
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Eagle3Reference:
    """vLLM's Eagle3LlamaForCausalLM over a draft directory: ``combine_hidden_states`` (fc), the decoder layer of
    layer_idx 0 (embeds and hidden states normed apart and concatenated, embeds first; the residual is the hidden
    state), the final norm returning (normed, prenorm), ``compute_logits`` over the draft vocabulary spread to the
    target's by d2t. Attention runs over a cache of (position, key, value), as vLLM's paged attention does."""

    def __init__(self, directory: Path):
        import json

        self.w = safetensors_torch.load_file(str(directory / "model.safetensors"))
        self.c = json.loads((directory / "config.json").read_text())
        self.cache: list[tuple[int, torch.Tensor, torch.Tensor]] = []

    def combine_hidden_states(self, aux):  # (T, 3H) -> (T, H)
        return aux @ self.w["fc.weight"].T

    def layer(self, positions, embeds, hidden_states):
        """One decoder-layer pass over T new positions (their keys and values added to the cache)."""
        c, w = self.c, self.w
        eps, heads, kv_heads = c["rms_norm_eps"], c["num_attention_heads"], c["num_key_value_heads"]
        head_dim = c["hidden_size"] // heads
        residual = hidden_states
        x = torch.cat(
            [
                rms_norm(embeds, w["midlayer.input_layernorm.weight"], eps),
                rms_norm(hidden_states, w["midlayer.hidden_norm.weight"], eps),
            ],
            dim=-1,
        )
        q = (x @ w["midlayer.self_attn.q_proj.weight"].T).view(-1, heads, head_dim)
        k = (x @ w["midlayer.self_attn.k_proj.weight"].T).view(-1, kv_heads, head_dim)
        v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(-1, kv_heads, head_dim)
        q, k = rotate(q, positions, c["rope_theta"]), rotate(k, positions, c["rope_theta"])
        self.cache += [(int(p), k[i], v[i]) for i, p in enumerate(positions)]
        out = []
        for i, p in enumerate(positions):  # each query attends to every cached key at or before its position
            seen = [(kk, vv) for pos, kk, vv in self.cache if pos <= p]
            keys = torch.stack([kk for kk, _ in seen]).repeat_interleave(heads // kv_heads, dim=1)  # (n, heads, hd)
            values = torch.stack([vv for _, vv in seen]).repeat_interleave(heads // kv_heads, dim=1)
            scores = torch.einsum("hd,nhd->hn", q[i], keys) / head_dim**0.5
            out.append(torch.einsum("hn,nhd->hd", scores.softmax(-1), values).reshape(-1))
        attn = torch.stack(out) @ w["midlayer.self_attn.o_proj.weight"].T
        residual = attn + residual  # post_attention_layernorm(hidden_states, residual)
        h = rms_norm(residual, w["midlayer.post_attention_layernorm.weight"], eps)
        mlp = F.silu(h @ w["midlayer.mlp.gate_proj.weight"].T) * (h @ w["midlayer.mlp.up_proj.weight"].T)
        hidden = mlp @ w["midlayer.mlp.down_proj.weight"].T
        prenorm = hidden + residual  # self.norm(hidden_states, residual): (normed, prenorm)
        return rms_norm(prenorm, self.w["norm.weight"], eps), prenorm

    def compute_logits(self, normed):
        logits = normed @ self.w["lm_head.weight"].T
        if "d2t" not in self.w:
            return logits
        targets = torch.arange(self.c["draft_vocab_size"]) + self.w["d2t"]
        full = logits.new_full((logits.size(0), self.c["vocab_size"]), float("-inf"))
        full[:, targets] = logits
        return full


@pytest.mark.parametrize("draft_vocab", [0, 40], ids=["every-token", "reduced"])
def test_an_eagle3_export_drafts_what_mtp_drafts_read_as_vllm_reads_it(draft_vocab, tmp_path):
    """The exported draft, read as vLLM's module reads it: the first draft at every position of a sequence (the target's
    three layers' inputs fused, the token after each position), then a second draft one position further from its own
    state and the first's token, equal mtp's heads 2 and 3 (fp32, within 1e-4)."""
    model = model_of(head_type="eagle3", eagle3_layers=[3, 0, 2], draft_vocab=draft_vocab)
    out = tmp_path / "draft"
    export_draft(checkpoint_of(model, tmp_path / "m.ckpt"), out, "eagle3")
    reference = Eagle3Reference(out)
    c = reference.c
    assert c["architectures"] == [EAGLE3_ARCHITECTURE] and c["num_hidden_layers"] == 1
    assert c["eagle_aux_hidden_state_layer_ids"] == c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [3, 0, 2]
    assert c["draft_vocab_size"] == (draft_vocab or 320) and c["target_hidden_size"] == 32
    assert "midlayer.self_attn.q_proj.weight" in reference.w and "embed_tokens.weight" not in reference.w
    if draft_vocab:  # d2t round-trips: draft id + offset = the target id mtp's draft scores
        targets = torch.arange(draft_vocab) + reference.w["d2t"]
        assert torch.equal(targets, model.draft_tokens) and reference.w["d2t"].dtype == torch.int64
        assert torch.equal(reference.w["t2d"].nonzero()[:, 0], model.draft_tokens)
    tokens = torch.randint(0, 320, (1, 12), generator=torch.Generator().manual_seed(1))
    T = 10
    following = torch.stack([tokens[:, j : j + T] for j in (1, 2)])
    with torch.no_grad():
        expected = model(tokens[:, :T], following=following)  # (3, 1, T, V)
        features = model.trunk_features(tokens[:, :T])[0]  # the target's layers' inputs (its own check: test_hf)
        aux = features[:, : 3 * 32]
        embed = model.tok_embeddings.weight  # the engines' draft takes the target's embedding
        positions = torch.arange(T)
        normed, prenorm = reference.layer(positions, embed[tokens[0, 1 : T + 1]], reference.combine_hidden_states(aux))
        torch.testing.assert_close(reference.compute_logits(normed), expected[1, 0], rtol=0, atol=1e-4)
        for i in range(T):  # draft 2 from position i: a chain entry at i + 1 (dropped after, as vLLM's would be)
            kept = list(reference.cache)
            reference.cache = [entry for entry in kept if entry[0] <= i]
            second, _ = reference.layer(positions[i : i + 1] + 1, embed[tokens[0, i + 2 : i + 3]], prenorm[i : i + 1])
            torch.testing.assert_close(reference.compute_logits(second)[0], expected[2, 0, i], rtol=0, atol=1e-4)
            reference.cache = kept


@pytest.mark.parametrize("draft_vocab", [0, 40], ids=["every-token", "reduced"])
def test_a_medusa_export_drafts_what_mtp_drafts_read_as_vllm_reads_it(draft_vocab, tmp_path):
    """vLLM's Medusa over the export: each head's residual blocks on the target's final normed state, its lm_head, and
    token_map spreading a truncated vocabulary back over the target's."""
    model = model_of(head_type="medusa", medusa_layers=2, draft_vocab=draft_vocab)
    out = tmp_path / "draft"
    export_draft(checkpoint_of(model, tmp_path / "m.ckpt"), out, "medusa")
    w = safetensors_torch.load_file(str(out / "model.safetensors"))
    import json

    c = json.loads((out / "config.json").read_text())
    assert (c["model_type"], c["num_heads"], c["num_hidden_layers"]) == ("medusa", 2, 2)
    assert c["truncated_vocab_size"] == (draft_vocab or 320)
    tokens = torch.randint(0, 320, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = model(tokens)  # (3, 1, 9, V)
        hidden = rms_norm(model.trunk(tokens)[0], model.norm.weight, model.config.norm_eps)  # vLLM's last hidden states
        for h in range(2):
            x = hidden
            for j in range(2):
                x = x + F.silu(x @ w[f"blocks.{h}.layers.{j}.weight"].T)
            logits = x @ w[f"lm_heads.{h}.weight"].T
            if "token_map" in w:
                full = logits.new_full((logits.size(0), 320), float("-inf"))
                full[:, w["token_map"]] = logits
                logits = full
            torch.testing.assert_close(logits, expected[h + 1, 0], rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    ("settings", "layout", "message"),
    [
        ({"head_type": "linear"}, "eagle3", r"^format=eagle3 cannot carry this checkpoint's linear heads \(eagle3 "),
        ({}, "medusa", "^format=medusa cannot carry this checkpoint's transformer heads"),
        ({"head_type": "eagle3"}, "medusa", "medusa carries medusa heads\\); train heads of that type"),
        ({"n_future": 1}, "eagle3", "cannot carry this checkpoint's no draft heads \\(model.n_future=1\\)"),
    ],
)
def test_a_head_type_a_layout_cannot_carry_is_one_sentence_and_nothing_is_written(settings, layout, message, tmp_path):
    torch.manual_seed(0)
    values = {"vocab_size": 320, "d_model": 32, "n_layers": 7, "n_heads": 4, "n_kv_heads": 2, "n_future": 3}
    model = MTPModel(ModelConfig(**(values | settings)))
    with pytest.raises(UserError, match=message):
        export_draft(checkpoint_of(model, tmp_path / "m.ckpt"), tmp_path / "draft", layout)
    assert not (tmp_path / "draft").exists() and not list(tmp_path.glob(".draft*"))


def test_a_parallel_head_2_is_a_one_draft_eagle3():
    """What engines-docs say of transformer heads: head 2 equals a one-draft EAGLE-3 whose fc passes the last layer's
    input through (the embedding half of q/k/v zero); the draft's second step is no parallel head 3."""
    model = model_of(draft_vocab=40)
    draft = parallel_head_as_eagle3(model)
    tokens = torch.randint(0, 320, (2, 11), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model(tokens[:, :9], following=torch.stack([tokens[:, 1:10], tokens[:, 2:11]]))
        got = draft(tokens[:, :9], following=tokens[None, :, 1:10])
    torch.testing.assert_close(got[:2], expected[:2], rtol=0, atol=1e-5)
