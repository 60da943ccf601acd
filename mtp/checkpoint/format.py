"""mtp's checkpoint format, read with ``torch.load(weights_only=True)`` and usable without Lightning (writing:
:mod:`mtp.checkpoint.save`; loading a model from it or from a foreign format: :mod:`mtp.checkpoint.load`).

The bottom layer of the artifacts: it knows the format's constants and how to check and read a file, and imports
nothing of mtp but its errors.

Lightning's checkpoint dict carries, under :data:`CHECKPOINT_KEY`, the model config and the tokenizer JSON,
so a checkpoint alone is enough to decode, and the loss config the model trained with (``loss_config``; a
checkpoint written before it keeps the loss settings in its model config:
:func:`mtp.model.config.stored_loss_settings`).
Two layouts are read:

- a single file (every strategy but FSDP's sharded save): the whole dict, weights under ``state_dict``;
- a directory (``trainer=fsdp``, Lightning's ModelParallelStrategy with ``save_distributed_checkpoint``):
  the weights and optimizer state as a torch.distributed.checkpoint (DCP) folder, every other entry in
  ``meta.pt``. Its weights load into a plain model on one process; no process group is needed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from mtp.errors import UserError

CHECKPOINT_KEY = "mtp"
CHECKPOINT_FORMAT = 1
SHARDED_META = "meta.pt"  # Lightning's name for the non-tensor part of a distributed checkpoint
TASK_CURVE = "task_curve"
"""The key of a training run's task curve in its curve callback's state (Lightning keeps each callback's state under
the checkpoint's ``callbacks``): a list of points ``{"step", "tokens", "rows"}`` (mtp.training.callbacks.TaskCurve)."""


def training_seconds(checkpoint: dict[str, Any]) -> float | None:
    """The time its run spent training up to a checkpoint, over every resume (Lightning's Timer callback keeps it as
    ``time_elapsed``); None when the run had no timer."""
    for state in checkpoint.get("callbacks", {}).values():
        if isinstance(state, dict) and isinstance(state.get("time_elapsed"), dict):
            return float(state["time_elapsed"].get("train", 0.0))
    return None


def task_curve(checkpoint: dict[str, Any]) -> list[dict[str, Any]]:
    """The task curve a checkpoint's training recorded (empty when it recorded none)."""
    for state in checkpoint.get("callbacks", {}).values():
        if isinstance(state, dict) and TASK_CURVE in state:
            return list(state[TASK_CURVE])
    return []


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
        # its message names the unpickler's detail ("Unsupported operand 101" for a text file), not the problem; it
        # stays attached as the cause
        raise UserError(
            f"checkpoint {path} is truncated or not a PyTorch checkpoint, so torch.load cannot read it; "
            "pass a complete .ckpt written by scripts/pretrain.py."
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


def model_weights(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The model's weights in a single-file checkpoint, under the model's own names (the LightningModule's
    ``model.`` prefix removed)."""
    prefix = "model."
    return {k[len(prefix) :]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
