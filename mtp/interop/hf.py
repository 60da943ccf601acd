"""Hugging Face Llama directories: export an mtp model to one, read one (or a Llama trained elsewhere) back.

An exported directory is a standard ``LlamaForCausalLM`` that transformers, vLLM, TGI and llama.cpp's converter
read with no code of ours: ``config.json``, ``generation_config.json``, ``model.safetensors`` (or shards
``model-0000i-of-0000n.safetensors`` with ``model.safetensors.index.json`` above ``max_shard_size``), and the
tokenizer (``tokenizer.json``, ``tokenizer_config.json``; end-of-text is eos). The weights are head 1's path
(trunk, head 1's block, the shared norm, head 1's unembedding), or head k's with ``head=k``.

With head 1, every other tensor of the model goes beside them, so that the directory carries the whole MTP model:

- ``mtp_heads.safetensors``: the tensors not on head 1's path, under mtp's own names (``extra_heads.0.*``,
  ``outputs.1.weight``, ``extra_inputs.*``, ``medusa_heads.*``);
- ``mtp_config.json``: ``{"format": 1, "model_config": {...}, "head_path": 1, "heads_file": ...}``, the
  model's full config (:class:`mtp.config.ModelConfig`).

Reading the directory back (:func:`read_hf`) gives the same state dict, tensor for tensor.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mtp.config import ModelConfig
from mtp.errors import UserError, first_line
from mtp.interop import ModelFiles
from mtp.interop.llama import ffn_multiple_for, head_path_names, llama_config
from mtp.model import MTPModel

MTP_CONFIG, MTP_HEADS = "mtp_config.json", "mtp_heads.safetensors"
MTP_FORMAT = 1
EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
INSTALL_HINT = "install the interop extra with pip install -e '.[hf]'"


@dataclass
class Exported:
    directory: Path
    files: dict[str, int]
    """Every file written and its size in bytes."""


def export_hf(
    checkpoint: str | os.PathLike,
    out_dir: str | os.PathLike,
    head: int = 1,
    force: bool = False,
    max_shard_size: str = "5GB",
    dtype: str = "float32",
) -> Exported:
    """Write ``checkpoint``'s head path as a Hugging Face Llama directory (see the module docstring).

    Everything is written into a temporary directory beside ``out_dir`` and renamed into place at the end, so
    a failure leaves nothing half-written; an existing non-empty ``out_dir`` is replaced only with ``force``.
    """
    from mtp.checkpoint_load import load_checkpoint

    out_dir = Path(out_dir)
    check_output_dir(out_dir, force)
    if dtype not in EXPORT_DTYPES:
        raise UserError(f"--dtype {dtype} is not one of {', '.join(EXPORT_DTYPES)}.")
    shard_bytes = parse_size(max_shard_size)
    safetensors_torch, transformers = _interop_packages("exporting to Hugging Face")
    loaded = load_checkpoint(checkpoint, "cpu", "float32")
    config, model = loaded.config, loaded.model
    names = head_path_names(config, head)  # refuses heads that are not a Llama
    weights = model.state_dict()
    cast = EXPORT_DTYPES[dtype]
    path_tensors = {hf: weights[ours].to(cast).contiguous() for hf, ours in names.items()}

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    partial = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        _write_weights(partial, path_tensors, shard_bytes, safetensors_torch)
        eot = _write_tokenizer(partial, loaded.tokenizer, config, transformers)
        hf_config = transformers.LlamaConfig(
            **llama_config(config), bos_token_id=eot, eos_token_id=eot, architectures=["LlamaForCausalLM"]
        )
        hf_config.dtype = dtype  # what from_pretrained loads the weights as, unless told otherwise
        hf_config.save_pretrained(partial)
        # no pad_token_id: prompts start with end-of-text, and generate() would mask a pad id it finds in them
        transformers.GenerationConfig(bos_token_id=eot, eos_token_id=eot).save_pretrained(partial)
        if head == 1:
            on_path = set(names.values())
            rest = {name: t.to(cast).contiguous() for name, t in weights.items() if name not in on_path}
            if rest:
                safetensors_torch.save_file(rest, partial / MTP_HEADS, metadata={"format": "pt"})
            meta = {
                "format": MTP_FORMAT,
                "model_config": config.to_dict(),
                "head_path": 1,
                "heads_file": MTP_HEADS if rest else None,
                "note": "model.safetensors holds head 1's path under Llama names; mtp_heads.safetensors every "
                "other tensor under mtp's names (mtp.model.MTPModel). Read back with mtp's init_from= or decode.py.",
            }
            (partial / MTP_CONFIG).write_text(json.dumps(meta, indent=2) + "\n")
        mode = 0o666 & ~_umask()  # safetensors creates its files private (0600); give every file the usual mode
        for file in partial.iterdir():
            file.chmod(mode)
        files = {p.name: p.stat().st_size for p in sorted(partial.iterdir())}
        _move_into_place(partial, out_dir)
    except OSError as err:
        raise UserError(f"writing {out_dir} failed ({err.strerror or err}); nothing was left there.") from err
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return Exported(out_dir, files)


@dataclass
class Verified:
    round_trip_exact: bool
    max_logit_diff: float
    tokens_equal: int
    tokens: int
    rows_equal: int
    rows: int

    def line(self) -> str:
        return (
            f"round_trip_exact={self.round_trip_exact} max_abs_logit_diff={self.max_logit_diff:.3g} "
            f"greedy_tokens_equal={self.tokens_equal}/{self.tokens} greedy_rows_equal={self.rows_equal}/{self.rows}"
        )


def verify_export(checkpoint: str | os.PathLike, out_dir: Path, prompts: int = 8, new_tokens: int = 128) -> Verified:
    """Read the export back with mtp (every tensor equal?) and with transformers (head 1's logits and greedy
    ``generate`` against mtp's on held-out prompts of the checkpoint's own data)."""
    from mtp.benchmarks.decode_runs import held_out_prompts
    from mtp.checkpoint_load import load_checkpoint
    from mtp.decode import GenerationConfig, generate

    _, transformers = _interop_packages("verifying an export")
    original = load_checkpoint(checkpoint, "cpu", "float32")
    ours = original.model.state_dict()
    exact = False
    if (out_dir / MTP_CONFIG).is_file():
        back = read_hf(out_dir).weights
        exact = back.keys() == ours.keys() and all(torch.equal(back[k].float(), ours[k]) for k in ours)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out_dir).float().eval()
    rows = held_out_prompts(original.data, original.tokenizer, prompts, 256)
    greedy = GenerationConfig(max_new_tokens=new_tokens, temperature=0.0)
    diff, equal, total, same_rows = 0.0, 0, 0, 0
    with torch.no_grad():
        for row in rows:
            tokens = torch.tensor([row])
            diff = max(diff, (original.model(tokens)[0] - theirs(tokens).logits).abs().max().item())
            prompt = row[:65]
            expected = generate(original.model, [prompt], greedy)[0][0]
            got = theirs.generate(torch.tensor([prompt]), max_new_tokens=len(expected), do_sample=False)
            got = got[0, len(prompt) :].tolist()
            equal += sum(a == b for a, b in zip(expected, got, strict=False))  # generate may stop at eos
            total, same_rows = total + len(expected), same_rows + (expected == got)
    return Verified(exact, diff, equal, total, same_rows, len(rows))


def check_output_dir(out_dir: Path, force: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir} is a file; give a directory to export into.")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise UserError(f"{out_dir} exists and is not empty; choose a new directory or pass --force to replace it.")


def parse_size(size: str) -> int:
    """Bytes in a size like 5GB, 500MB or 2000000."""
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    text = str(size).strip().upper()
    unit = next((u for u in sorted(units, key=len, reverse=True) if text.endswith(u)), "")
    try:
        value = float(text[: len(text) - len(unit)]) * units.get(unit, 1)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise UserError(f"--max-shard-size {size} is not a size like 5GB, 500MB or 2000000 (bytes).")
    return int(value)


def _interop_packages(task: str):
    try:
        import safetensors.torch as safetensors_torch
        import transformers
    except ImportError as err:
        raise UserError(f"{task} needs transformers and safetensors; {INSTALL_HINT}.") from err
    return safetensors_torch, transformers


def _write_weights(directory: Path, tensors: dict[str, Tensor], shard_bytes: int, safetensors_torch) -> None:
    """``model.safetensors``, or shards of at most ``shard_bytes`` (a larger tensor gets a shard of its own) and
    the index transformers reads."""
    shards: list[dict[str, Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    if len(shards) == 1:
        safetensors_torch.save_file(shards[0], directory / "model.safetensors", metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        safetensors_torch.save_file(shard, directory / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _write_tokenizer(directory: Path, tokenizer, config: ModelConfig, transformers) -> int:
    """tokenizer.json and tokenizer_config.json (end-of-text as eos, bos and pad); returns end-of-text's id."""
    from mtp.data.tokenizer import eot_id

    eot = eot_id(tokenizer)
    token = tokenizer.id_to_token(eot)
    wrapped = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=token,
        bos_token=token,
        pad_token=token,
        model_max_length=config.max_seq_len,
        clean_up_tokenization_spaces=False,
    )
    wrapped.save_pretrained(directory)
    (directory / "tokenizer.json").write_text(tokenizer.to_str())  # mtp's own JSON, byte for byte
    settings = json.loads((directory / "tokenizer_config.json").read_text())
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"  # the name every transformers version knows
    (directory / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    return eot


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _move_into_place(partial: Path, out_dir: Path) -> None:
    """Rename ``partial`` to ``out_dir``; an existing ``out_dir`` is moved aside first and removed after."""
    old = None
    if out_dir.exists():
        old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
        os.replace(out_dir, old)
    os.replace(partial, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------- reading


def read_hf(path: Path) -> ModelFiles:
    """A Hugging Face Llama directory as an mtp model: head 1's path from the Llama weights, the other heads
    from ``mtp_heads.safetensors`` when ``mtp_config.json`` names them (else a one-head model)."""
    from mtp.interop.tokenizer import directory_tokenizer

    config = read_hf_config(path)
    hf = _read_json(path / "config.json")
    tensors = read_tensors(path)
    if "lm_head.weight" not in tensors and hf.get("tie_word_embeddings") and "model.embed_tokens.weight" in tensors:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()  # mtp's unembedding is its own
    names = head_path_names(config, 1)
    expected = expected_shapes(config)
    check_tensors(tensors, {hf_name: expected[ours] for hf_name, ours in names.items()}, path)
    weights = {ours: tensors[hf_name] for hf_name, ours in names.items()}
    rest = {name: shape for name, shape in expected.items() if name not in weights}
    if rest:
        heads_file = path / MTP_HEADS
        if not heads_file.is_file():
            raise UserError(f"{path} has {MTP_CONFIG} with {config.n_future} heads but no {MTP_HEADS}; export again.")
        heads = _load_safetensors(heads_file)
        check_tensors(heads, rest, heads_file)
        weights.update(heads)
    return ModelFiles(config, weights, directory_tokenizer(path))


def read_hf_config(path: Path) -> ModelConfig:
    """The mtp config of a Hugging Face Llama directory (``config.json``, and ``mtp_config.json`` if present), without
    reading its weights."""
    hf = _read_json(path / "config.json")
    try:
        check_llama(hf, path)
        return _model_config(hf, path)
    except KeyError as err:
        raise UserError(f"{path / 'config.json'} lacks {err.args[0]}; is it a Llama config?") from err


def check_llama(hf: dict[str, Any], path: Path) -> None:
    """Refuse, in one sentence, a config that is not a plain Llama (mtp computes nothing else)."""
    architecture = (hf.get("architectures") or [None])[0]
    if hf.get("model_type") != "llama" or architecture not in (None, "LlamaForCausalLM"):
        name = architecture or hf.get("model_type") or "unknown"
        raise UserError(f"{path} holds a {name} model; mtp imports LlamaForCausalLM (model_type llama) only.")
    rope = hf.get("rope_scaling") or hf.get("rope_parameters") or {}  # transformers 4 / 5 spell it differently
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    heads, width = hf["num_attention_heads"], hf["hidden_size"]
    unsupported = {
        "attention_bias": bool(hf.get("attention_bias")),
        "mlp_bias": bool(hf.get("mlp_bias")),
        f"hidden_act={hf.get('hidden_act')}": hf.get("hidden_act", "silu") != "silu",
        f"rope type {rope_type}": rope_type != "default",
        f"head_dim={hf.get('head_dim')} (not hidden_size / num_attention_heads)": hf.get("head_dim", width // heads)
        * heads
        != width,
    }
    found = [name for name, present in unsupported.items() if present]
    if found:
        raise UserError(f"{path} is a Llama with {', '.join(found)}, which mtp's model does not compute.")


def _model_config(hf: dict[str, Any], path: Path) -> ModelConfig:
    """The mtp config: ``mtp_config.json``'s, checked against config.json, or a one-head model from config.json."""
    rope = hf.get("rope_parameters") or {}
    derived = ModelConfig(
        vocab_size=hf["vocab_size"],
        d_model=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"],
        n_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        ffn_multiple_of=ffn_multiple_for(hf["hidden_size"], hf["intermediate_size"]),
        n_future=1,
        max_seq_len=hf.get("max_position_embeddings", 4096),
        rope_theta=float(hf.get("rope_theta", rope.get("rope_theta", 10000.0))),
        norm_eps=hf.get("rms_norm_eps", 1e-6),
    )
    if not (path / MTP_CONFIG).is_file():
        return derived
    meta = _read_json(path / MTP_CONFIG)
    if meta.get("format") != MTP_FORMAT or meta.get("head_path") != 1:
        raise UserError(
            f"{path / MTP_CONFIG} has format {meta.get('format')} and head path {meta.get('head_path')}; this mtp "
            f"reads format {MTP_FORMAT} with head path 1 (exports with --head k are plain Llamas: delete the file)."
        )
    config = ModelConfig.from_dict(meta["model_config"])
    ours, theirs = llama_config(config), llama_config(derived)
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads"):
        if ours[key] != theirs[key]:
            raise UserError(
                f"{path}: config.json has {key}={theirs[key]} but {MTP_CONFIG} describes {ours[key]}; the two were "
                "not written together (export again)."
            )
    return config


def expected_shapes(config: ModelConfig) -> dict[str, torch.Size]:
    """Every tensor of a model with this config, and its shape (built on the meta device: no memory)."""
    with torch.device("meta"):
        return {name: t.shape for name, t in MTPModel(config).state_dict().items()}


def check_tensors(tensors: dict[str, Tensor], expected: dict[str, torch.Size], source: Path) -> None:
    """One sentence naming the first missing, misshapen or unexpected tensor."""
    missing = [name for name in expected if name not in tensors]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UserError(f"{source} lacks tensor {missing[0]}{more}; the files are incomplete, export or copy again.")
    for name, shape in expected.items():
        if tensors[name].shape != shape:
            raise UserError(
                f"{source}: tensor {name} has shape {tuple(tensors[name].shape)}, but the config needs {tuple(shape)}."
            )
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise UserError(
            f"{source} has tensor {unexpected[0]} that the config does not describe (a different architecture?)."
        )


def read_tensors(path: Path) -> dict[str, Tensor]:
    """The weights of a Hugging Face directory: single or sharded safetensors, or ``pytorch_model.bin``."""
    for index_name, single in (
        ("model.safetensors.index.json", "model.safetensors"),
        ("pytorch_model.bin.index.json", "pytorch_model.bin"),
    ):
        if (path / index_name).is_file():
            files = sorted(set(_read_json(path / index_name).get("weight_map", {}).values()))
            break
        if (path / single).is_file():
            files = [single]
            break
    else:
        raise UserError(f"{path} has config.json but no model.safetensors or pytorch_model.bin; copy the weights.")
    tensors: dict[str, Tensor] = {}
    for file in files:
        if not (path / file).is_file():
            raise UserError(f"{path} lacks the weight file {file} that its index names; copy it.")
        tensors.update(_load_safetensors(path / file) if file.endswith(".safetensors") else _load_bin(path / file))
    return tensors


def _load_safetensors(file: Path) -> dict[str, Tensor]:
    try:
        from safetensors.torch import load_file
    except ImportError as err:
        raise UserError(f"reading {file} needs safetensors; {INSTALL_HINT}.") from err
    try:
        return load_file(file)
    except Exception as err:  # safetensors raises its own error types for truncated headers and data
        raise UserError(f"{file} is damaged or not a safetensors file ({first_line(err)}).") from err


def _load_bin(file: Path) -> dict[str, Tensor]:
    try:
        return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:
        raise UserError(f"{file} is damaged or not a PyTorch weights file ({first_line(err)}).") from err


def _read_json(file: Path) -> dict[str, Any]:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"{file} could not be read as JSON ({err}).") from err
