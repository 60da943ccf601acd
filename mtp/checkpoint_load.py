"""Checkpoints, read with ``torch.load(weights_only=True)`` and usable without Lightning (writing: mtp.checkpoint_save).

Lightning's checkpoint dict carries, under :data:`CHECKPOINT_KEY`, the model config and the tokenizer JSON,
so a checkpoint alone is enough to decode. Two layouts are read:

- a single file (every strategy but FSDP's sharded save): the whole dict, weights under ``state_dict``;
- a directory (``trainer=fsdp``, Lightning's ModelParallelStrategy with ``save_distributed_checkpoint``):
  the weights and optimizer state as a torch.distributed.checkpoint (DCP) folder, every other entry in
  ``meta.pt``. Its weights load into a plain model on one process; no process group is needed.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from mtp.config import ModelConfig
from mtp.errors import UserError, first_line
from mtp.model import MTPModel

CHECKPOINT_KEY = "mtp"
CHECKPOINT_FORMAT = 1
SHARDED_META = "meta.pt"  # Lightning's name for the non-tensor part of a distributed checkpoint
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def read_checkpoint(path: str | os.PathLike, map_location: Any = "cpu", mmap: bool = False) -> dict[str, Any]:
    """The checkpoint dict, after checking that it exists, is complete and is an mtp checkpoint.

    For a sharded checkpoint (a directory) this is the dict without its tensors (no ``state_dict``).
    ``mmap=True`` maps tensors instead of reading them: a cheap check of a large file.
    """
    path = Path(path)
    if path.is_dir():
        file, sharded = path / SHARDED_META, True
        if not file.is_file():
            raise UserError(
                f"checkpoint folder {path} has no {SHARDED_META}; pass a .ckpt file or folder written by "
                "scripts/pretrain.py, a Hugging Face Llama directory (config.json) or a Meta one (params.json)."
            )
    elif path.is_file():
        file, sharded = path, False
    else:
        raise UserError(f"checkpoint {path} does not exist; pass the path of a .ckpt written by scripts/pretrain.py.")
    try:
        checkpoint = torch.load(file, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as err:  # torch.load raises many types for damaged files (EOFError, KeyError, BadZipFile, ...)
        raise UserError(
            f"checkpoint {path} is truncated or not a PyTorch checkpoint ({first_line(err)}); "
            "use a complete .ckpt written by scripts/pretrain.py."
        ) from err
    complete = isinstance(checkpoint, dict) and CHECKPOINT_KEY in checkpoint and (sharded or "state_dict" in checkpoint)
    if not complete:
        raise UserError(
            f"{path} is not an mtp checkpoint (no '{CHECKPOINT_KEY}' entry); use one written by scripts/pretrain.py."
        )
    if checkpoint[CHECKPOINT_KEY].get("format") != CHECKPOINT_FORMAT:
        raise UserError(
            f"{path} has mtp checkpoint format {checkpoint[CHECKPOINT_KEY].get('format')}, "
            f"but this version of mtp reads format {CHECKPOINT_FORMAT}; load it with a matching mtp."
        )
    return checkpoint


def check_checkpoint(path: str | os.PathLike) -> None:
    """Fail with one sentence if ``path`` is not a complete mtp checkpoint, without reading its tensors."""
    read_checkpoint(path, mmap=not Path(path).is_dir())


@dataclass
class LoadedCheckpoint:
    model: MTPModel
    tokenizer: Tokenizer
    config: ModelConfig
    global_step: int
    data: dict[str, Any]
    """The training data's source and validation fraction (empty for checkpoints that predate it)."""


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The decoding dtype policy: ``auto`` is bf16 on CUDA and fp32 elsewhere."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise UserError(f"dtype {name!r} is not one of auto, {', '.join(DTYPES)}.")
    return DTYPES[name]


def load_checkpoint(
    path: str | os.PathLike, device: str | torch.device = "cpu", dtype: str = "auto"
) -> LoadedCheckpoint:
    """Model (eval mode, on ``device``, weights in ``dtype``: auto, float32 or bfloat16) and tokenizer, from an mtp
    checkpoint or a Hugging Face Llama / Meta multi-token directory (:mod:`mtp.interop`).

    Rotary tables stay fp32 in every dtype, so that positions are exact.
    """
    from mtp.interop import foreign_format, read_foreign

    device = torch.device(device)
    resolve_dtype(dtype, device)  # a bad dtype fails before any reading
    if foreign_format(path):  # a Hugging Face Llama or Meta directory, or a GGUF file
        files = read_foreign(path)
        model = MTPModel.with_weights(files.config, files.weights)
        loaded = LoadedCheckpoint(model, Tokenizer.from_str(files.tokenizer), files.config, 0, {})
    else:
        checkpoint = read_checkpoint(path, map_location=device)
        meta = checkpoint[CHECKPOINT_KEY]
        config = ModelConfig.from_dict(meta["model_config"])
        if Path(path).is_dir():
            model = MTPModel(config).to(device)
            _load_sharded_weights(Path(path), model)
        else:
            model = MTPModel.with_weights(config, model_weights(checkpoint))
        tokenizer = Tokenizer.from_str(meta["tokenizer"])
        loaded = LoadedCheckpoint(model, tokenizer, config, checkpoint.get("global_step", 0), meta.get("data", {}))
    model.eval()
    model.to(device=device, dtype=resolve_dtype(dtype, device))
    model.rope_cos, model.rope_sin = model.rope_cos.float(), model.rope_sin.float()
    return loaded


def model_weights(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The model's weights in a single-file checkpoint, under the model's own names (the LightningModule's
    ``model.`` prefix removed)."""
    prefix = "model."
    return {k[len(prefix) :]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}


def _load_sharded_weights(path: Path, model: MTPModel) -> None:
    """Fill ``model`` from the ``state_dict`` entries of a DCP folder (the LightningModule's ``model.*`` keys)."""
    import torch.distributed.checkpoint as dcp

    state = {f"model.{name}": tensor for name, tensor in model.state_dict().items()}
    try:
        with warnings.catch_warnings():  # DCP warns that it loads in one process even when told so (no_dist)
            warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
            dcp.load({"state_dict": state}, storage_reader=dcp.FileSystemReader(path), no_dist=True)
    except Exception as err:  # DCP wraps missing keys and damaged shards alike
        raise UserError(
            f"checkpoint folder {path} could not be read ({first_line(err)}); "
            "use a complete checkpoint written by scripts/pretrain.py."
        ) from err
