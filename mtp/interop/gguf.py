"""GGUF files (llama.cpp's format) of the Llama architecture: config from the metadata, tensors dequantized, the
tokenizer from the metadata (needs the ``gguf`` extra: ``pip install -e '.[gguf]'``).

- **Config**: ``llama.block_count``, ``embedding_length``, ``feed_forward_length``, ``attention.head_count`` and
  ``head_count_kv``, ``rope.freq_base``, ``attention.layer_norm_rms_epsilon``, ``context_length``; the vocabulary
  is the token embedding's rows. A one-head mtp model, as a Hugging Face Llama directory gives.
- **Tensors**: every type the ``gguf`` library dequantizes (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, the
  K-quants, the IQ types, ...) becomes fp32. llama.cpp's converter permutes the rows of ``attn_q`` and ``attn_k``
  so that its rotary rotates interleaved pairs; the import undoes that permutation (mtp rotates halves, as
  Hugging Face does), as transformers' GGUF loader does. A file without ``output.weight`` ties the unembedding to
  the embedding: mtp's unembedding starts as a copy.
- **Tokenizer**: :func:`mtp.interop.tokenizer.gguf_tokenizer`, the same ids as llama.cpp's.

Refused in one sentence: another architecture, rope scaling, a head size other than width / heads, a truncated or
damaged file, a tensor type the installed ``gguf`` cannot dequantize, a missing or misshapen tensor.
"""

from __future__ import annotations

import os
import re
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mtp.errors import UserError, first_line
from mtp.interop import ModelFiles
from mtp.interop.llama import expected_shapes, ffn_multiple_for, interleaved_to_halves
from mtp.interop.tokenizer import gguf_tokenizer
from mtp.model.config import ModelConfig

INSTALL_HINT = "install the gguf extra with pip install -e '.[gguf]'"
DEFAULT_CONTEXT = 4096
"""Positions the rotary tables cover when the file does not say."""

BLOCK_NAMES = {
    # GGUF name within blk.N -> mtp name within layers.N
    "attn_norm.weight": "attention_norm.weight",
    "attn_q.weight": "attention.wq.weight",
    "attn_k.weight": "attention.wk.weight",
    "attn_v.weight": "attention.wv.weight",
    "attn_output.weight": "attention.wo.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "ffn_gate.weight": "feed_forward.w1.weight",
    "ffn_up.weight": "feed_forward.w3.weight",
    "ffn_down.weight": "feed_forward.w2.weight",
}
TOP_NAMES = {"token_embd.weight": "tok_embeddings.weight", "output_norm.weight": "norm.weight"}


def is_gguf(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a file that starts as a GGUF file does (its magic), or one named ``*.gguf``: a damaged or
    mislabelled one is then reported as such, not as a damaged PyTorch checkpoint."""
    path = Path(path)
    if not path.is_file():
        return False
    with path.open("rb") as file:
        return file.read(4) == b"GGUF" or path.suffix.lower() == ".gguf"


def open_gguf(path: Path) -> Any:
    """A ``gguf.GGUFReader`` over the file (memory-mapped: nothing is read until asked for)."""
    try:
        import gguf  # optional: the gguf extra
    except ImportError as err:
        raise UserError(f"reading {path} needs the gguf package; {INSTALL_HINT}.") from err
    try:
        return gguf.GGUFReader(path)
    except Exception as err:  # the reader raises ValueError, KeyError, IndexError... for damaged or cut files
        reason = first_line(err)
        if "is not a valid GGMLQuantizationType" in reason:  # a type id newer than the installed gguf
            type_id = re.findall(r"\d+", reason.split(" is not")[0])[-1]  # "np.uint32(99) is not a valid ..."
            raise UserError(
                f"{path} holds a tensor of type id {type_id}, which gguf {version('gguf')} does not know; upgrade "
                "gguf (pip install -U gguf) or convert the file to another type."
            ) from err
        raise UserError(f"{path} is truncated or not a GGUF file ({reason}); download or convert it again.") from err


def metadata(reader: Any, *, skip_arrays: bool = False) -> dict[str, Any]:
    """The key-value metadata as Python values (arrays as lists, unless ``skip_arrays``)."""
    values = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        if skip_arrays and len(field.data) > 1:
            continue
        values[key] = field.contents()
    return values


def read_gguf(path: Path) -> ModelFiles:
    """The model in a Llama GGUF file as a one-head mtp model (see the module docstring)."""
    reader = open_gguf(path)
    meta = metadata(reader)
    tensors = {t.name: t for t in reader.tensors}
    config = gguf_config(meta, tensors, path)
    check_gguf_tensors(tensors, config, path)  # from the header: a bad file fails before any dequantizing
    weights = {mtp_name(name): dequantized(tensor, path) for name, tensor in tensors.items()}
    if "output.weight" not in tensors:
        tied = weights["tok_embeddings.weight"].clone()  # mtp's unembedding is its own tensor
        weights["heads.outputs.0.weight"] = tied
    head_dim = config.d_model // config.n_heads
    for i in range(config.n_layers):
        for name in ("wq", "wk"):  # llama.cpp's converter interleaves their rows for its rotary
            key = f"layers.{i}.attention.{name}.weight"
            weights[key] = interleaved_to_halves(weights[key], head_dim)
    return ModelFiles(config, weights, gguf_tokenizer(meta, path))


def read_gguf_config(path: Path) -> ModelConfig:
    """The mtp config of a GGUF file, from its metadata (no tensor is dequantized)."""
    reader = open_gguf(path)
    return gguf_config(metadata(reader, skip_arrays=True), {t.name: t for t in reader.tensors}, path)


def read_gguf_tokenizer(path: Path) -> str:
    """The tokenizer JSON of a GGUF file, without reading its tensors."""
    return gguf_tokenizer(metadata(open_gguf(path)), path)


def mtp_name(name: str) -> str | None:
    """mtp's name of a GGUF tensor; None for one mtp's Llama has no place for."""
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    if name == "output.weight":
        return "heads.outputs.0.weight"
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in BLOCK_NAMES:
        return f"layers.{parts[1]}.{BLOCK_NAMES[parts[2]]}"
    return None


def check_gguf_tensors(tensors: dict[str, Any], config: ModelConfig, path: Path) -> None:
    """One sentence naming the first tensor, by its GGUF name, that mtp's Llama has no place for, or that is missing
    or misshapen (``output.weight`` may be missing: the unembedding is then tied to the embedding)."""
    for name in tensors:
        if mtp_name(name) is None:
            raise UserError(f"{path} has tensor {name}, which mtp's Llama has no place for; choose a plain Llama file.")
    for ours, shape in expected_shapes(config).items():
        name = gguf_name(ours)
        if name not in tensors:
            if name == "output.weight":
                continue
            raise UserError(f"{path} lacks tensor {name}; the file is incomplete, download or convert it again.")
        found = tuple(int(n) for n in reversed(tensors[name].shape.tolist()))  # GGUF shapes are (columns, rows)
        if found != tuple(shape):
            raise UserError(
                f"{path}: tensor {name} has shape {found}, but its metadata needs {tuple(shape)}; the file is damaged, "
                "download or convert it again."
            )


def gguf_name(ours: str) -> str:
    """The GGUF name of one of mtp's tensors (the inverse of :func:`mtp_name`)."""
    if ours == "heads.outputs.0.weight":
        return "output.weight"
    for name, mtp in TOP_NAMES.items():
        if mtp == ours:
            return name
    _, index, rest = ours.split(".", 2)
    return f"blk.{index}.{next(name for name, mtp in BLOCK_NAMES.items() if mtp == rest)}"


def gguf_config(meta: dict[str, Any], tensors: dict[str, Any], path: Path) -> ModelConfig:
    """mtp's config of a Llama GGUF file; anything mtp's model does not compute is refused in one sentence."""
    architecture = meta.get("general.architecture")
    if architecture != "llama":
        raise UserError(
            f"{path} holds a model of the {architecture or 'unnamed'} architecture, but mtp imports the llama "
            "architecture only; choose a Llama GGUF file (general.architecture = llama)."
        )

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"llama.{key}", default)
        if value is None:
            raise UserError(f"{path} lacks the metadata llama.{key}; the file is incomplete, convert it again.")
        return value

    d_model, n_heads = int(get("embedding_length")), int(get("attention.head_count"))
    n_kv_heads = int(get("attention.head_count_kv", n_heads))
    head_dim = d_model // n_heads
    scaling = meta.get("llama.rope.scaling.type", "none")
    scaled = scaling not in ("none", "linear") or float(meta.get("llama.rope.scaling.factor", 1)) != 1
    rope_dims, key_dims = int(get("rope.dimension_count", head_dim)), int(get("attention.key_length", head_dim))
    unsupported = {
        f"rope scaling {scaling}": scaled,
        "a rope frequency table (rope_freqs)": "rope_freqs.weight" in tensors,
        f"rope over {rope_dims} of {head_dim} dimensions": rope_dims != head_dim,
        f"a head size of {key_dims} (not width / heads)": key_dims != head_dim,
        "attention biases": any(name.endswith(".bias") for name in tensors),
    }
    found = [name for name, present in unsupported.items() if present]
    if found:
        raise UserError(
            f"{path} is a Llama with {', '.join(found)}, which mtp's model does not compute; choose a model without."
        )
    if "token_embd.weight" not in tensors:
        raise UserError(f"{path} lacks tensor token_embd.weight; the file is incomplete, convert it again.")
    vocab_size = int(tensors["token_embd.weight"].shape[-1])  # GGUF shapes are (columns, rows)
    try:
        return ModelConfig(
            vocab_size=vocab_size,
            d_model=d_model,
            n_layers=int(get("block_count")),
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            ffn_multiple_of=ffn_multiple_for(d_model, int(get("feed_forward_length"))),
            n_future=1,
            max_seq_len=int(get("context_length", DEFAULT_CONTEXT)),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        )
    except UserError as err:
        raise UserError(f"{path}: {err}") from err


def dequantized(tensor: Any, path: Path) -> Tensor:
    """A GGUF tensor as an fp32 torch tensor of mtp's shape (rows, columns)."""
    from gguf.quants import dequantize  # optional: the gguf extra (open_gguf has checked it is there)

    try:
        array = dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as err:
        raise UserError(
            f"{path}: tensor {tensor.name} is of type {tensor.tensor_type.name}, which the installed gguf cannot "
            "dequantize; upgrade gguf (pip install -U gguf) or convert the file to another type."
        ) from err
    except (ValueError, IndexError) as err:  # data cut short by a truncated file
        raise UserError(f"{path}: tensor {tensor.name} is damaged ({err}); the file is truncated.") from err
    shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
    return torch.from_numpy(np.array(array, dtype=np.float32).reshape(shape))  # a copy: the file is mapped read-only
