"""Meta's released multi-token checkpoints (``facebook/multi-token-prediction``): ``params.json`` +
``consolidated.00.pth`` + a sentencepiece ``tokenizer.model``.

Their model is mtp's ``transformer`` head type with the names of mtp's earlier layout (``layers`` = trunk + head 1's
block, ``extra_heads`` = heads 2..n, one ``norm``, one ``output``), so the import renames the heads' tensors
(:func:`mtp.model.heads.current_names`) and converts one convention: Meta's rotary rotates interleaved pairs (2i, 2i +
1) of each attention head, mtp's (like Hugging Face's) rotates (i, i + head_dim / 2); the rows of ``wq`` and ``wk`` are
permuted so that both compute the same attention (:func:`interleaved_to_halves`, the permutation of transformers'
Llama conversion script).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from mtp.errors import UserError, first_line
from mtp.interop import ModelFiles
from mtp.interop.llama import check_tensors, expected_shapes, ffn_multiple_for, interleaved_to_halves
from mtp.interop.tokenizer import directory_tokenizer
from mtp.model.config import ModelConfig
from mtp.model.heads import current_names

DEFAULT_CONTEXT = 4096
"""Positions the rotary tables cover when params.json does not say (Meta's 7B multi-token models saw 4096)."""


def read_meta_config(path: Path) -> ModelConfig:
    """The mtp config of a Meta directory; the weights are mapped, not read (two shapes are read off them)."""
    tensors = _read_consolidated(path)
    return meta_config(_read_params(path), tensors, path)


def read_meta(path: Path) -> ModelFiles:
    params = _read_params(path)
    tensors = _read_consolidated(path)
    tensors.pop("rope.freqs", None)  # a precomputed table some Llama releases carry; mtp computes its own
    if "output.weight" in tensors:
        tensors["outputs.0.weight"] = tensors.pop("output.weight")  # the earlier layout's name: renamed below
    tensors = current_names(tensors)
    config = meta_config(params, tensors, path)
    check_tensors(tensors, expected_shapes(config), path / "consolidated.00.pth")
    head_dim = config.d_model // config.n_heads
    for name in list(tensors):
        if name.endswith(("attention.wq.weight", "attention.wk.weight")):
            tensors[name] = interleaved_to_halves(tensors[name], head_dim)
    return ModelFiles(config, tensors, directory_tokenizer(path))


def meta_config(params: dict, tensors: dict[str, Tensor], path: Path) -> ModelConfig:
    """mtp's config for Meta's ``params.json`` (vocabulary and SwiGLU width read off the tensors' shapes)."""
    try:
        d_model, n_layers, n_heads = params["dim"], params["n_layers"], params["n_heads"]
    except KeyError as err:
        raise UserError(f"{path / 'params.json'} lacks {err.args[0]}; is it a Meta Llama params.json?") from err
    for name in ("tok_embeddings.weight", "layers.0.feed_forward.w1.weight"):
        if name not in tensors:
            raise UserError(f"{path / 'consolidated.00.pth'} lacks tensor {name}; the file is incomplete.")
    vocab_size = params.get("vocab_size") or -1
    if vocab_size <= 0:
        vocab_size = tensors["tok_embeddings.weight"].shape[0]
    return ModelConfig(
        vocab_size=vocab_size,
        d_model=d_model,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=params.get("n_kv_heads") or n_heads,
        ffn_multiple_of=ffn_multiple_for(d_model, tensors["layers.0.feed_forward.w1.weight"].shape[0]),
        n_future=params.get("n_future_tokens", 1),
        head_type="transformer",
        max_seq_len=params.get("max_seq_len", DEFAULT_CONTEXT),
        rope_theta=float(params.get("rope_theta", 10000.0)),
        norm_eps=params.get("norm_eps", 1e-5),
    )


def _read_params(path: Path) -> dict:
    try:
        params = json.loads((path / "params.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"{path / 'params.json'} could not be read as JSON ({err}).") from err
    unsupported = [key for key in ("use_scaled_rope", "moe_args", "vision_chunk_size") if params.get(key)]
    if unsupported:
        raise UserError(f"{path / 'params.json'} asks for {unsupported[0]}, which mtp's model does not compute.")
    return params


def _read_consolidated(path: Path) -> dict[str, Tensor]:
    shards = sorted(path.glob("consolidated.*.pth"))
    if not shards:
        raise UserError(f"{path} has params.json but no consolidated.00.pth; copy the weights beside it.")
    if len(shards) > 1:
        raise UserError(
            f"{path} holds {len(shards)} model-parallel shards; mtp reads one consolidated.00.pth (merge the shards "
            "first, e.g. with transformers' convert_llama_weights_to_hf and import that directory)."
        )
    try:
        state = torch.load(shards[0], map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # torch.load raises many types for damaged files
        raise UserError(f"{shards[0]} is damaged or not a PyTorch file ({first_line(err)}).") from err
    if not isinstance(state, dict):
        raise UserError(f"{shards[0]} does not hold a state dict.")
    return dict(state)
