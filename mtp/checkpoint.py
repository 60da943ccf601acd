"""Checkpoints, read with ``torch.load(weights_only=True)`` and usable without Lightning (writing: mtp.checkpointing).

Lightning's checkpoint dict carries, under :data:`CHECKPOINT_KEY`, the model config and the
tokenizer JSON, so a checkpoint alone is enough to decode.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from mtp.config import ModelConfig
from mtp.errors import UserError
from mtp.model import MTPModel

CHECKPOINT_KEY = "mtp"
CHECKPOINT_FORMAT = 1


def read_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    """The raw checkpoint dict, after checking that the file exists, is complete and is an mtp checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist; pass the path of a .ckpt written by scripts/pretrain.py.")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch.load raises many types for damaged files (EOFError, KeyError, BadZipFile, ...)
        raise UserError(
            f"checkpoint {path} is truncated or not a PyTorch checkpoint ({str(err).splitlines()[0]}); "
            "use a complete .ckpt written by scripts/pretrain.py."
        ) from err
    if not isinstance(checkpoint, dict) or CHECKPOINT_KEY not in checkpoint or "state_dict" not in checkpoint:
        raise UserError(
            f"{path} is not an mtp checkpoint (no '{CHECKPOINT_KEY}' entry); use one written by scripts/pretrain.py."
        )
    if checkpoint[CHECKPOINT_KEY].get("format") != CHECKPOINT_FORMAT:
        raise UserError(
            f"{path} has mtp checkpoint format {checkpoint[CHECKPOINT_KEY].get('format')}, "
            f"but this version of mtp reads format {CHECKPOINT_FORMAT}; load it with a matching mtp."
        )
    return checkpoint


@dataclass
class LoadedCheckpoint:
    model: MTPModel
    tokenizer: Tokenizer
    config: ModelConfig
    global_step: int
    data: dict[str, Any]
    """The training data's source and validation fraction (empty for checkpoints that predate it)."""


def load_checkpoint(path: str | os.PathLike, device: str | torch.device = "cpu") -> LoadedCheckpoint:
    """Model (eval mode, on ``device``) and tokenizer from a checkpoint written by scripts/pretrain.py."""
    checkpoint = read_checkpoint(path, map_location=device)
    meta = checkpoint[CHECKPOINT_KEY]
    config = ModelConfig.from_dict(meta["model_config"])
    model = MTPModel(config).to(device)
    prefix = "model."
    state = {k[len(prefix) :]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
    model.load_state_dict(state)
    model.eval()
    tokenizer = Tokenizer.from_str(meta["tokenizer"])
    return LoadedCheckpoint(model, tokenizer, config, checkpoint.get("global_step", 0), meta.get("data", {}))
