"""Hugging Face Llama directories: read one (written by :mod:`mtp.pretrained.export`, or a Llama trained elsewhere) as
an mtp model.

An exported directory is a standard ``LlamaForCausalLM`` that transformers, vLLM, TGI and llama.cpp's converter
read with no code of ours: ``config.json``, ``generation_config.json``, ``model.safetensors`` (or shards
``model-0000i-of-0000n.safetensors`` with ``model.safetensors.index.json`` above ``max_shard_size``), and the
tokenizer (``tokenizer.json``, ``tokenizer_config.json``; end-of-text is eos). The weights are head 1's path
(trunk, head 1's block, the shared norm, head 1's unembedding), or head k's with ``head=k``.

With head 1, every other tensor of the model goes beside them, so that the directory carries the whole MTP model:

- ``mtp_heads.safetensors``: the tensors not on head 1's path, under mtp's own names (``heads.layers.0.*``,
  ``heads.outputs.1.weight``, ``heads.inputs.*``, ``heads.residuals.*``);
- ``mtp_config.json``: ``{"format": 1, "model_config": {...}, "head_path": 1, "heads_file": ...}``, the
  model's full config (:class:`mtp.model.config.ModelConfig`).

Reading the directory back (:func:`read_hf`) gives the same state dict, tensor for tensor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mtp.errors import UserError, first_line
from mtp.interop import ModelFiles
from mtp.interop.llama import check_tensors, expected_shapes, ffn_multiple_for, head_path_names, llama_config
from mtp.interop.tokenizer import directory_tokenizer
from mtp.model.config import ModelConfig, stored_model_config
from mtp.model.heads import current_names

MTP_CONFIG, MTP_HEADS = "mtp_config.json", "mtp_heads.safetensors"
MTP_FORMAT = 1
INSTALL_HINT = "install the interop extra with pip install -e '.[hf]'"


def read_hf(path: Path) -> ModelFiles:
    """A Hugging Face Llama directory as an mtp model: head 1's path from the Llama weights, the other heads
    from ``mtp_heads.safetensors`` when ``mtp_config.json`` names them (else a one-head model)."""
    config = read_hf_config(path)
    hf = read_json(path / "config.json")
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
        heads = current_names(_load_safetensors(heads_file))  # exports before the heads were a module too
        check_tensors(heads, rest, heads_file)
        weights.update(heads)
    return ModelFiles(config, weights, directory_tokenizer(path))


def read_hf_config(path: Path) -> ModelConfig:
    """The mtp config of a Hugging Face Llama directory (``config.json``, and ``mtp_config.json`` if present), without
    reading its weights."""
    hf = read_json(path / "config.json")
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
        raise UserError(
            f"{path} holds a {name} model; mtp imports LlamaForCausalLM (model_type llama) and MiMoForCausalLM only."
        )
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
    meta = read_json(path / MTP_CONFIG)
    if meta.get("format") != MTP_FORMAT or meta.get("head_path") != 1:
        raise UserError(
            f"{path / MTP_CONFIG} has format {meta.get('format')} and head path {meta.get('head_path')}; this mtp "
            f"reads format {MTP_FORMAT} with head path 1 (an export of head k > 1's path is a plain Llama: delete "
            "the file)."
        )
    config = stored_model_config(meta["model_config"])  # the loss settings an earlier export kept there are dropped
    ours, theirs = llama_config(config), llama_config(derived)
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads"):
        if ours[key] != theirs[key]:
            raise UserError(
                f"{path}: config.json has {key}={theirs[key]} but {MTP_CONFIG} describes {ours[key]}; the two were "
                "not written together (export again)."
            )
    return config


def read_tensors(path: Path) -> dict[str, Tensor]:
    """The weights of a Hugging Face directory: single or sharded safetensors, or ``pytorch_model.bin``."""
    for index_name, single in (
        ("model.safetensors.index.json", "model.safetensors"),
        ("pytorch_model.bin.index.json", "pytorch_model.bin"),
    ):
        if (path / index_name).is_file():
            files = sorted(set(read_json(path / index_name).get("weight_map", {}).values()))
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
        from safetensors.torch import load_file  # optional: the hf extra
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


def read_json(file: Path) -> dict[str, Any]:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"{file} could not be read as JSON ({err}).") from err
