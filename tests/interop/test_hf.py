"""Export to and import from Hugging Face Llama directories: transformers reads the export with no mtp code and
computes what mtp computes; reading it back gives every tensor; any lost or misshapen tensor is named."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mtp.checkpoint.load import load_checkpoint, read_foreign
from mtp.commands import export as export_command
from mtp.commands.cli import settings_named_by_flags
from mtp.data.tokenizer import byte_tokenizer, prompt_ids
from mtp.decode import GenerationConfig, Plan, generate
from mtp.errors import SettingError, UserError
from mtp.interop.hf import MTP_CONFIG, MTP_HEADS
from mtp.pretrained.export import export_dtype, export_hf, verify_export

transformers = pytest.importorskip("transformers", reason="interop needs transformers: pip install -e '.[hf]'")
safetensors_torch = pytest.importorskip("safetensors.torch")

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["def parse(text):\n    return text.split()", "import os\nimport sys\n", "class A:\n    x = 1  # é ☃"]


@pytest.fixture(scope="module")
def exported(tiny_checkpoints, tmp_path_factory) -> Path:
    """The tiny trained mtp4 exported, sharded into files of at most 100 kB."""
    out = tmp_path_factory.mktemp("export") / "hf"
    export_hf(tiny_checkpoints["mtp4"], out, max_shard_size="100KB")
    return out


def test_transformers_loads_the_export_and_computes_head_1(exported, tiny_checkpoints):
    assert (exported / "model.safetensors.index.json").is_file() and len(list(exported.glob("model-*"))) > 2
    ours = load_checkpoint(tiny_checkpoints["mtp4"], "cpu", "float32")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    assert theirs.config.architectures == ["LlamaForCausalLM"]
    prompts = [prompt_ids(ours.tokenizer, text) for text in TEXTS]
    with torch.no_grad():
        for prompt in prompts:
            tokens = torch.tensor([prompt])
            torch.testing.assert_close(theirs(tokens).logits, ours.model(tokens)[0], rtol=0, atol=1e-5)
    greedy = GenerationConfig(max_new_tokens=24, temperature=0.0)
    for prompt in prompts:  # no attention mask given: generate() must not mask the leading end-of-text as padding
        expected = generate(ours.model, [prompt], Plan(greedy))[0][0]
        got = theirs.generate(torch.tensor([prompt]), max_new_tokens=len(expected), do_sample=False)
        assert got[0, len(prompt) :].tolist() == expected
    for text in TEXTS:  # the tokenizer: same ids as mtp's, and back to the same text
        ids = tokenizer(text)["input_ids"]
        assert ids == ours.tokenizer.encode(text).ids
        assert tokenizer.decode(ids) == text
    assert tokenizer.eos_token == "<|endoftext|>" and theirs.generation_config.eos_token_id == prompts[0][0]


def test_verify_reports_what_it_compares(exported, tiny_checkpoints, tmp_path):
    fp32 = verify_export(tiny_checkpoints["mtp4"], exported, prompts=2, new_tokens=8)
    assert fp32.round_trip_exact and fp32.max_logit_diff < 1e-5 and (fp32.rows_equal, fp32.rows) == (2, 2)
    export_hf(tiny_checkpoints["mtp4"], tmp_path / "bf16", dtype="bfloat16")
    bf16 = verify_export(tiny_checkpoints["mtp4"], tmp_path / "bf16", prompts=2, new_tokens=8)
    assert not bf16.round_trip_exact and bf16.max_logit_diff > 1e-3  # bf16 files cannot give fp32 weights back
    assert bf16.line().startswith("round_trip_exact=False max_abs_logit_diff=")


def test_verify_without_documents_long_enough_is_one_sentence_naming_no_flag(exported, tiny_checkpoints, monkeypatch):
    """The verification's row length is its own, not a setting: the data's lack is said without a --prompt-tokens."""
    monkeypatch.setattr("mtp.pretrained.export.VERIFY_TOKENS", 10**6)
    with pytest.raises(UserError, match=r"^verifying compares outputs on validation documents of at least 1000000 "):
        verify_export(tiny_checkpoints["mtp4"], exported, prompts=2, new_tokens=8)


def test_head_k_export_is_that_heads_path(tiny_checkpoints, tmp_path):
    ours = load_checkpoint(tiny_checkpoints["mtp4"], "cpu", "float32")
    export_hf(tiny_checkpoints["mtp4"], tmp_path / "head3", head=3)
    assert not (tmp_path / "head3" / "mtp_config.json").exists()  # a plain Llama: head 3 only
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "head3").eval()
    tokens = torch.tensor([prompt_ids(ours.tokenizer, TEXTS[0])])
    with torch.no_grad():
        torch.testing.assert_close(theirs(tokens).logits, ours.model(tokens)[2], rtol=0, atol=1e-5)


def random_checkpoint(path: Path, **settings) -> Path:
    """An untrained mtp checkpoint in the layout scripts/pretrain.py writes (no training: cheap)."""
    from mtp.checkpoint.format import CHECKPOINT_FORMAT, CHECKPOINT_KEY
    from mtp.model import MTPModel
    from mtp.model.config import ModelConfig

    torch.manual_seed(0)
    config = ModelConfig(**{"vocab_size": 300, "d_model": 64, "n_layers": 6, "n_heads": 4, "n_kv_heads": 2, **settings})
    meta = {"format": CHECKPOINT_FORMAT, "model_config": config.to_dict(), "tokenizer": byte_tokenizer().to_str()}
    state = {f"model.{k}": v for k, v in MTPModel(config).state_dict().items()}
    torch.save({CHECKPOINT_KEY: meta, "state_dict": state, "global_step": 0}, path)
    return path


@pytest.mark.parametrize("head_type", ["transformer", pytest.param("causal", marks=pytest.mark.slow)])  # causal: slow
def test_round_trip_gives_every_tensor_back_and_names_any_lost_one(tmp_path, head_type):
    checkpoint = random_checkpoint(tmp_path / "model.ckpt", head_type=head_type)
    out = tmp_path / "hf"
    export_hf(checkpoint, out)
    original = load_checkpoint(checkpoint, "cpu", "float32")
    back = read_foreign(out)
    assert back.config == original.config
    state = original.model.state_dict()
    assert back.weights.keys() == state.keys()
    for name, tensor in state.items():
        assert torch.equal(back.weights[name], tensor), name
    assert back.tokenizer == original.tokenizer.to_str()
    meta = json.loads((out / MTP_CONFIG).read_text())  # an export written before LossConfig: loss settings in it
    meta["model_config"] |= {"loss": "sequential", "loss_weights": None, "loss_chunk": 0, "head_loss": "distill"}
    (out / MTP_CONFIG).write_text(json.dumps(meta))
    assert read_foreign(out).config == original.config

    for file in (out / "model.safetensors", out / MTP_HEADS):
        complete = safetensors_torch.load_file(file)
        for name in complete:
            safetensors_torch.save_file({k: v for k, v in complete.items() if k != name}, file)
            with pytest.raises(UserError, match=f"lacks tensor {name}(;| )"):
                read_foreign(out)
        misshapen = dict(complete)
        name = next(iter(complete))
        misshapen[name] = complete[name][..., :-1].contiguous()
        safetensors_torch.save_file(misshapen, file)
        with pytest.raises(UserError, match=f"tensor {name} has shape"):
            read_foreign(out)
        safetensors_torch.save_file(complete, file)
    assert len(read_foreign(out).weights) == len(state)  # restored: the failures above were the deletions


def tiny_llama(tmp_path: Path, **overrides) -> Path:
    """A random LlamaForCausalLM saved with save_pretrained, shaped like size=tiny, with mtp's byte tokenizer."""
    torch.manual_seed(0)
    settings = dict(
        vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=False,
    )  # fmt: skip
    config = transformers.LlamaConfig(**{**settings, **overrides})
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # sharper attention than the default init, so that positions matter
        for name, p in model.named_parameters():
            if "proj" in name:
                p.normal_(0, 0.1)
    out = tmp_path / "llama"
    model.save_pretrained(out)
    byte_tokenizer().save(str(out / "tokenizer.json"))
    return out


@pytest.mark.slow
def test_a_random_llama_imports_trains_four_heads_and_decodes_self_speculatively(make_cfg, tmp_path):
    from mtp.training.train import train

    llama = tiny_llama(tmp_path)
    reference = transformers.AutoModelForCausalLM.from_pretrained(llama).eval()
    imported = load_checkpoint(llama, "cpu", "float32")
    assert imported.config.n_future == 1 and imported.config.n_layers == 4
    tokens = torch.randint(0, 512, (2, 50), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(imported.model(tokens)[0], reference(tokens).logits, rtol=0, atol=1e-5)

    cfg = make_cfg("mtp4", [f"init_from={llama}", "freeze=trunk", "trainer.max_steps=2"])
    train(cfg)
    trained = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
    grown = load_checkpoint(trained, "cpu", "float32")
    assert grown.config.n_future == 4 and grown.config.n_layers == 4 + 3
    for name, tensor in imported.model.state_dict().items():  # the frozen trunk is the Llama's, bit for bit
        if name.startswith(("tok_embeddings", "layers.")) and not name.startswith("layers.3."):
            assert torch.equal(grown.model.state_dict()[name], tensor), name
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "decode.py"), str(trained), "--self-speculative", "--compare"]
        + ["--heads", "4", "--prompt", "def f(", "--max-new-tokens", "16", "--device", "cpu"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "method=heads" in result.stdout and "heads=4" in result.stdout


def test_new_heads_of_an_imported_llama_start_as_its_last_block(tmp_path):
    from mtp.model import MTPModel
    from mtp.model.config import ModelConfig
    from mtp.pretrained.init_from import Start

    start = Start.read(tiny_llama(tmp_path))
    model = MTPModel(ModelConfig(**{**start.grown(start.config.to_dict() | {"n_future": 3}), "n_future": 3}))
    start.load_into(model)
    for block in model.heads.layers:
        for name, tensor in block.state_dict().items():
            assert torch.equal(tensor, start.weights[f"layers.3.{name}"]), name


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"attention_bias": True}, "Llama with attention_bias"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope type linear"),
        ({"intermediate_size": 100}, "SwiGLU width of 100"),
    ],
)
def test_llamas_mtp_cannot_compute_are_refused_by_name(tmp_path, overrides, message):
    with pytest.raises(UserError, match=message):
        read_foreign(tiny_llama(tmp_path, **overrides))


def test_other_architectures_and_broken_directories_are_one_sentence(tmp_path):
    llama = tiny_llama(tmp_path)
    config = json.loads((llama / "config.json").read_text())
    (llama / "config.json").write_text(json.dumps({**config, "model_type": "mistral", "architectures": ["Mistral"]}))
    with pytest.raises(UserError, match="holds a Mistral model; mtp imports LlamaForCausalLM"):
        load_checkpoint(llama)
    (llama / "config.json").write_text(json.dumps(config))
    (llama / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(UserError, match="model.safetensors is damaged"):
        load_checkpoint(llama)
    (llama / "model.safetensors").unlink()
    with pytest.raises(UserError, match="no model.safetensors or pytorch_model.bin"):
        load_checkpoint(llama)


def export_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "export.py"), *map(str, args)], capture_output=True, text=True,
        timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def test_the_exports_settings_are_named_by_their_fields_and_by_the_commands_flags(tmp_path, capsys):
    """The library names export_hf's parameters; scripts/export.py spells them as its flags, in the same sentence.
    Each is refused before the checkpoint is read (it does not exist here)."""
    missing = tmp_path / "none.ckpt"
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    with pytest.raises(SettingError, match="^dtype=float16 is not one of float32, bfloat16.$"):
        export_hf(missing, tmp_path / "a", dtype="float16")
    with pytest.raises(SettingError, match=f"^{taken} exists and is not empty; .* pass force to replace it.$"):
        export_hf(missing, taken)
    with pytest.raises(
        UserError, match=f"^{taken} exists and is not empty; choose a new directory or pass --force to "
    ):
        export_command.main([str(missing), str(taken)])
    with pytest.raises(UserError, match=r"^--max-shard-size 5XB is not a size like 5GB, 500MB or 2000000 \(bytes\).$"):
        export_command.main([str(missing), str(tmp_path / "a"), "--max-shard-size", "5XB"])
    with (
        pytest.raises(UserError, match="^--dtype float16 is not one of float32, bfloat16.$"),
        settings_named_by_flags(),
    ):
        export_dtype("float16")
    with pytest.raises(SystemExit):  # the command's own choices: argparse names the flag and the choices
        export_command.main([str(missing), str(tmp_path / "a"), "--dtype", "bad"])
    assert "argument --dtype: invalid choice: 'bad' (choose from " in capsys.readouterr().err
    assert [p.name for p in taken.iterdir()] == ["keep.txt"] and not (tmp_path / "a").exists()


@pytest.mark.slow
def test_export_refuses_bad_input_and_leaves_nothing_half_written(tiny_checkpoints, tmp_path, monkeypatch):
    not_mtp = tmp_path / "model.ckpt"
    torch.save({"state_dict": {}}, not_mtp)
    with pytest.raises(UserError, match="is not an mtp checkpoint"):
        export_hf(not_mtp, tmp_path / "a")
    with pytest.raises(UserError, match="^max_shard_size=5XB is not a size"):
        export_hf(tiny_checkpoints["mtp4"], tmp_path / "a", max_shard_size="5XB")
    with pytest.raises(UserError, match="head 5 does not exist"):
        export_hf(tiny_checkpoints["mtp4"], tmp_path / "a", head=5)

    import mtp.pretrained.export as export

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "_write_tokenizer", full_disk)
    with pytest.raises(UserError, match="No space left on device"):
        export_hf(tiny_checkpoints["mtp4"], tmp_path / "a")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ckpt"]  # no partial directory, no output

    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    refused = export_cli(tiny_checkpoints["mtp4"], out)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1] == (
        f"error: {out} exists and is not empty; choose a new directory or pass --force to replace it."
    )
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    forced = export_cli(tiny_checkpoints["mtp4"], out, "--force", "--dtype", "bfloat16")
    assert forced.returncode == 0, forced.stderr[-2000:]
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").is_file()
    assert "model.safetensors" in forced.stdout and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["model.ckpt", "taken"]
    )
    assert next(iter(safetensors_torch.load_file(out / "model.safetensors").values())).dtype == torch.bfloat16
