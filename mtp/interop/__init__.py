"""Conversions between mtp models and other formats (no foreign package is imported at module level).

Models come in from two kinds of directory and one kind of file besides mtp's own checkpoints:

- a Hugging Face Llama directory (``config.json`` + safetensors or ``pytorch_model.bin``): its next-token path
  becomes the trunk and head 1; ``mtp_heads.safetensors`` + ``mtp_config.json``, if present (written by
  ``scripts/export.py``), add the other heads (:mod:`mtp.interop.hf`);
- a Meta multi-token directory (``params.json`` + ``consolidated.00.pth``, ``n_future_tokens`` heads)
  (:mod:`mtp.interop.meta`);
- a GGUF file of the Llama architecture (llama.cpp's format, quantized or not) (:mod:`mtp.interop.gguf`).

:func:`read_foreign` reads any of them into a :class:`ModelFiles`: what an mtp checkpoint would have held.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from mtp.config import ModelConfig


@dataclass
class ModelFiles:
    """A model read from a foreign directory: its config, weights under mtp's names, and tokenizer JSON."""

    config: ModelConfig
    weights: dict[str, Tensor]
    tokenizer: str


def foreign_format(path: str | os.PathLike) -> str | None:
    """``"hf"`` or ``"meta"`` for a directory in one of those layouts, ``"gguf"`` for a GGUF file; None for anything
    else."""
    path = Path(path)
    if path.is_file():
        from mtp.interop.gguf import is_gguf

        return "gguf" if is_gguf(path) else None
    if not path.is_dir():
        return None
    if (path / "params.json").is_file():
        return "meta"
    if (path / "config.json").is_file():
        return "hf"
    return None


def read_foreign(path: str | os.PathLike) -> ModelFiles:
    """The model in a Hugging Face Llama or Meta directory or a GGUF file; a missing or wrong tensor is one sentence
    naming it."""
    kind = foreign_format(path)
    if kind == "meta":
        from mtp.interop.meta import read_meta

        return read_meta(Path(path))
    if kind == "hf":
        from mtp.interop.hf import read_hf

        return read_hf(Path(path))
    if kind == "gguf":
        from mtp.interop.gguf import read_gguf

        return read_gguf(Path(path))
    raise ValueError(f"{path} is neither a Hugging Face nor a Meta directory nor a GGUF file")


def read_foreign_config(path: str | os.PathLike) -> ModelConfig:
    """The model config of a Hugging Face Llama or Meta directory or a GGUF file, without reading its weights."""
    kind = foreign_format(path)
    if kind == "meta":
        from mtp.interop.meta import read_meta_config

        return read_meta_config(Path(path))
    if kind == "hf":
        from mtp.interop.hf import read_hf_config

        return read_hf_config(Path(path))
    if kind == "gguf":
        from mtp.interop.gguf import read_gguf_config

        return read_gguf_config(Path(path))
    raise ValueError(f"{path} is neither a Hugging Face nor a Meta directory nor a GGUF file")


def read_foreign_tokenizer(path: str | os.PathLike) -> str:
    """The tokenizer JSON of a Hugging Face or Meta directory or a GGUF file, without reading its weights."""
    if foreign_format(path) == "gguf":
        from mtp.interop.gguf import read_gguf_tokenizer

        return read_gguf_tokenizer(Path(path))
    from mtp.interop.tokenizer import directory_tokenizer

    return directory_tokenizer(Path(path))
