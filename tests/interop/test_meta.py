"""Meta's multi-token checkpoint layout (params.json + consolidated.00.pth + sentencepiece tokenizer.model) imports
and computes what Meta's own model code computes: interleaved rotary, trunk = layers[:-1], heads = [layers[-1]] +
extra_heads, one norm and one output."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mtp.checkpoint.load import load_checkpoint
from mtp.errors import UserError
from mtp.model import MTPModel
from mtp.model.config import ModelConfig

spm = pytest.importorskip("sentencepiece", reason="Meta's tokenizer needs sentencepiece: pip install -e '.[hf]'")
pytest.importorskip("transformers", reason="the tokenizer conversion needs transformers: pip install -e '.[hf]'")

ROOT = Path(__file__).resolve().parents[2]
PARAMS = {"dim": 64, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "multiple_of": 32, "norm_eps": 1e-5,
          "rope_theta": 500.0, "vocab_size": -1, "n_future_tokens": 2, "max_seq_len": 128}  # fmt: skip
TEXTS = ["def f(x):\n    return x  +  1\n", "import os, sys  # é ☃ 12345", "  leading spaces\n\n\ttab"]


def train_sentencepiece() -> bytes:
    """A tiny BPE sentencepiece model with Llama's settings (no normalization, byte fallback, digits split)."""
    lines = [line for f in sorted((Path(json.__file__).parent).glob("*.py")) for line in f.read_text().splitlines()]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines + TEXTS), model_writer=model, vocab_size=600, model_type="bpe",
        byte_fallback=True, split_digits=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
    )  # fmt: skip
    return model.getvalue()


def meta_tensors(vocab: int) -> dict[str, torch.Tensor]:
    """Random weights under Meta's names; attention projections large enough that positions matter."""
    g = torch.Generator().manual_seed(0)
    d, hd, kv, ffn = 64, 16, 2, 192

    def block(prefix: str) -> dict[str, torch.Tensor]:
        shapes = {"attention.wq": (d, d), "attention.wk": (kv * hd, d), "attention.wv": (kv * hd, d),
                  "attention.wo": (d, d), "feed_forward.w1": (ffn, d), "feed_forward.w3": (ffn, d),
                  "feed_forward.w2": (d, ffn)}  # fmt: skip
        out = {f"{prefix}.{name}.weight": torch.randn(shape, generator=g) * 0.15 for name, shape in shapes.items()}
        out[f"{prefix}.attention_norm.weight"] = torch.rand(d, generator=g) + 0.5
        out[f"{prefix}.ffn_norm.weight"] = torch.rand(d, generator=g) + 0.5
        return out

    tensors = {"tok_embeddings.weight": torch.randn(vocab, d, generator=g)}
    for i in range(3):  # n_layers - n_future_tokens + 1
        tensors.update(block(f"layers.{i}"))
    tensors.update(block("extra_heads.0"))
    tensors["norm.weight"] = torch.rand(d, generator=g) + 0.5
    tensors["output.weight"] = torch.randn(vocab, d, generator=g) * 0.2
    tensors["rope.freqs"] = torch.zeros(8)  # some releases carry it; ignored
    return tensors


@pytest.fixture(scope="module")
def meta_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("meta")
    (out / "tokenizer.model").write_bytes(train_sentencepiece())
    vocab = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model")).vocab_size()
    torch.save(meta_tensors(vocab), out / "consolidated.00.pth")
    (out / "params.json").write_text(json.dumps(PARAMS))
    return out


def meta_forward(tensors: dict[str, torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
    """Logits of every head, (n_future, B, T, V), computed as Meta's llama/model.py does (complex rotary)."""
    d, n_heads, n_kv, eps = PARAMS["dim"], PARAMS["n_heads"], PARAMS["n_kv_heads"], PARAMS["norm_eps"]
    hd, T = d // n_heads, tokens.size(1)
    freqs = 1.0 / (PARAMS["rope_theta"] ** (torch.arange(0, hd, 2)[: hd // 2].float() / hd))
    freqs_cis = torch.polar(torch.ones(T, hd // 2), torch.outer(torch.arange(T).float(), freqs))

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rotary(x):  # x (B, T, heads, hd): consecutive pairs as complex numbers
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * freqs_cis[None, :, None, :]).flatten(3)

    def block(x, p):
        h = norm(x, tensors[f"{p}.attention_norm.weight"])
        B = x.size(0)
        q = rotary((h @ tensors[f"{p}.attention.wq.weight"].T).view(B, T, n_heads, hd))
        k = rotary((h @ tensors[f"{p}.attention.wk.weight"].T).view(B, T, n_kv, hd))
        v = (h @ tensors[f"{p}.attention.wv.weight"].T).view(B, T, n_kv, hd)
        k, v = (t.repeat_interleave(n_heads // n_kv, dim=2) for t in (k, v))
        scores = (q.transpose(1, 2) @ k.transpose(1, 2).transpose(2, 3)) / hd**0.5
        scores = scores + torch.full((T, T), float("-inf")).triu(1)
        attn = (scores.softmax(-1) @ v.transpose(1, 2)).transpose(1, 2).reshape(B, T, d)
        x = x + attn @ tensors[f"{p}.attention.wo.weight"].T
        h = norm(x, tensors[f"{p}.ffn_norm.weight"])
        ffn = F.silu(h @ tensors[f"{p}.feed_forward.w1.weight"].T) * (h @ tensors[f"{p}.feed_forward.w3.weight"].T)
        return x + ffn @ tensors[f"{p}.feed_forward.w2.weight"].T

    trunk = tensors["tok_embeddings.weight"][tokens]
    for i in range(2):
        trunk = block(trunk, f"layers.{i}")
    heads = [block(trunk, "layers.2"), block(trunk, "extra_heads.0")]
    return torch.stack([norm(h, tensors["norm.weight"]) @ tensors["output.weight"].T for h in heads])


def test_imported_meta_checkpoint_computes_what_meta_code_computes(meta_dir):
    loaded = load_checkpoint(meta_dir, "cpu", "float32")
    assert loaded.config.n_future == 2 and loaded.config.n_layers == 4 and loaded.config.rope_theta == 500.0
    tensors = torch.load(meta_dir / "consolidated.00.pth", weights_only=True)
    tokens = torch.randint(0, tensors["output.weight"].shape[0], (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = meta_forward(tensors, tokens)
        torch.testing.assert_close(loaded.model(tokens), expected, rtol=0, atol=1e-5)
        # the same tensors without the rotary conversion compute something else: the check above sees it
        raw = MTPModel(loaded.config)
        raw.load_state_dict({("outputs.0.weight" if k == "output.weight" else k): v for k, v in tensors.items()
                             if k != "rope.freqs"})  # fmt: skip
        assert (raw(tokens) - expected).abs().max() > 0.1
    assert expected.std() > 1.0  # logits far from zero: the tolerance is tight


def test_meta_tokenizer_converts_to_the_same_ids_and_text(meta_dir):
    loaded = load_checkpoint(meta_dir, "cpu", "float32")
    sp = spm.SentencePieceProcessor(model_file=str(meta_dir / "tokenizer.model"))
    for text in TEXTS:
        ids = loaded.tokenizer.encode(text).ids
        assert ids == [sp.bos_id()] + sp.encode(text)  # Llama starts every text with BOS
        assert loaded.tokenizer.decode(ids) == sp.decode(sp.encode(text)) == text


@pytest.mark.slow
def test_decode_reads_a_meta_directory_self_speculatively(meta_dir):
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "decode.py"), str(meta_dir), "--self-speculative", "--compare"]
        + ["--heads", "2", "--prompt", "def f(", "--max-new-tokens", "12", "--device", "cpu"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "heads=2" in result.stdout


def test_broken_meta_directories_are_one_sentence(meta_dir, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("params.json", "tokenizer.model"):
        (broken / name).write_bytes((meta_dir / name).read_bytes())
    tensors = torch.load(meta_dir / "consolidated.00.pth", weights_only=True)
    lost = "layers.1.attention.wk.weight"
    torch.save({k: v for k, v in tensors.items() if k != lost}, broken / "consolidated.00.pth")
    with pytest.raises(UserError, match="lacks tensor layers.1.attention.wk.weight"):
        load_checkpoint(broken)
    torch.save(tensors, broken / "consolidated.01.pth")
    with pytest.raises(UserError, match="holds 2 model-parallel shards"):
        load_checkpoint(broken)
    (broken / "consolidated.01.pth").unlink()
    (broken / "params.json").write_text(json.dumps({k: v for k, v in PARAMS.items() if k != "dim"}))
    with pytest.raises(UserError, match="params.json lacks dim"):
        load_checkpoint(broken)


def test_meta_config_matches_params():
    from mtp.interop.meta import meta_config

    tensors = meta_tensors(600)
    config = meta_config(PARAMS, {**tensors, "outputs.0.weight": tensors["output.weight"]}, Path("."))
    assert config.ffn_hidden == 192 and config.n_kv_heads == 2 and config.vocab_size == 600
    assert ModelConfig.from_dict(config.to_dict()) == config
