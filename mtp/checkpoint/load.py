"""Loading a model from any checkpoint mtp reads: its own format (:mod:`mtp.checkpoint.format`), a Hugging Face
Llama or Meta multi-token directory, or a GGUF file (the readers of :mod:`mtp.interop`). The one place that
dispatches on a path's format; the exporters and everything that decodes sit above it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from mtp.checkpoint.format import (
    CHECKPOINT_KEY,
    SHARDED_META,
    model_weights,
    read_checkpoint,
    task_curve,
    training_seconds,
)
from mtp.errors import UserError, first_line
from mtp.interop import ModelFiles, gguf, hf, meta, mimo
from mtp.interop import tokenizer as foreign_tokenizer
from mtp.interop.chat import ModelChat, gguf_chat, hf_chat
from mtp.model import MTPModel
from mtp.model.config import ModelConfig, stored_loss_settings, stored_model_config
from mtp.model.heads import legacy_name

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class LoadedCheckpoint:
    model: MTPModel
    tokenizer: Tokenizer
    config: ModelConfig
    global_step: int
    data: dict[str, Any]
    """The training data's source and validation fraction (empty for checkpoints that predate it)."""
    loss_settings: dict[str, Any] = field(default_factory=dict)
    """The loss settings the model trained with, as stored (:func:`~mtp.model.config.stored_loss_settings`; the
    training layer's :class:`~mtp.training.loss_config.LossConfig` reads them); empty for a model from another
    format."""
    curve: list[dict[str, Any]] = field(default_factory=list)
    """The task curve its training recorded (``callbacks=task_curve``; empty without one)."""
    train_seconds: float | None = None
    """The time its training took, over every resume (None: not recorded)."""
    tokens_per_step: int | None = None
    """Tokens one optimizer step trained on, over every process (None: not recorded)."""
    train_threads: int | None = None
    """The CPU threads of each training process (None: not recorded)."""


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
    device = torch.device(device)
    resolve_dtype(dtype, device)  # a bad dtype fails before any reading
    if foreign_format(path):  # a Hugging Face Llama or Meta directory, or a GGUF file
        files = read_foreign(path)
        model = MTPModel.with_weights(files.config, files.weights)
        loaded = LoadedCheckpoint(model, Tokenizer.from_str(files.tokenizer), files.config, 0, {})
    else:
        checkpoint = read_checkpoint(path, map_location=device)
        meta = checkpoint[CHECKPOINT_KEY]
        config = stored_model_config(meta["model_config"])
        loss = stored_loss_settings(meta["model_config"], meta.get("loss_config"))
        if Path(path).is_dir():
            model = MTPModel(config).to(device)
            _load_sharded_weights(Path(path), model)
        else:
            model = MTPModel.with_weights(config, model_weights(checkpoint))
        tokenizer = Tokenizer.from_str(meta["tokenizer"])
        step, data = checkpoint.get("global_step", 0), meta.get("data", {})
        loaded = LoadedCheckpoint(
            model, tokenizer, config, step, data, loss, task_curve(checkpoint), training_seconds(checkpoint),
            meta.get("tokens_per_step"), meta.get("threads"),
        )  # fmt: skip
    model.eval()
    model.to(device=device, dtype=resolve_dtype(dtype, device))
    model.rope_cos, model.rope_sin = model.rope_cos.float(), model.rope_sin.float()
    return loaded


def _load_sharded_weights(path: Path, model: MTPModel) -> None:
    """Fill ``model`` from the ``state_dict`` entries of a DCP folder (the LightningModule's ``model.*`` keys), of
    today's layout or the earlier one (:func:`mtp.model.heads.current_names`)."""
    import torch.distributed.checkpoint as dcp  # here: importing it costs about a second of every command's start

    try:
        stored = dcp.FileSystemReader(path).read_metadata().state_dict_metadata  # "state_dict.model.<name>" keys
        state = {}
        for name, tensor in model.state_dict().items():
            old = legacy_name(name)
            legacy = f"state_dict.model.{name}" not in stored and f"state_dict.model.{old}" in stored
            stored_as = old if legacy else name
            state[f"model.{stored_as}"] = tensor
        with warnings.catch_warnings():  # DCP warns that it loads in one process even when told so (no_dist)
            warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
            dcp.load({"state_dict": state}, storage_reader=dcp.FileSystemReader(path), no_dist=True)
    except Exception as err:  # DCP wraps missing keys and damaged shards alike
        raise UserError(
            f"checkpoint folder {path} could not be read ({first_line(err)}); "
            "use a complete checkpoint written by scripts/pretrain.py."
        ) from err


def foreign_format(path: str | os.PathLike) -> str | None:
    """``"hf"``, ``"mimo"`` (a Hugging Face folder of MiMo's architecture, :mod:`mtp.interop.mimo`) or ``"meta"`` for
    a directory in one of those layouts, ``"gguf"`` for a GGUF file; None for anything else."""
    path = Path(path)
    if path.is_file():
        return "gguf" if gguf.is_gguf(path) else None
    if not path.is_dir():
        return None
    if (path / "params.json").is_file():
        return "meta"
    if (path / "config.json").is_file():
        try:
            return "mimo" if mimo.is_mimo(hf.read_json(path / "config.json")) else "hf"
        except UserError:  # unreadable: reading it as a Llama says why
            return "hf"
    return None


_READERS = {
    "meta": (meta.read_meta, meta.read_meta_config),
    "hf": (hf.read_hf, hf.read_hf_config),
    "mimo": (mimo.read_mimo, mimo.read_mimo_config),
    "gguf": (gguf.read_gguf, gguf.read_gguf_config),
}
"""Each foreign format's readers: the whole model, and its config alone."""


def _reader(path: str | os.PathLike, part: int) -> Callable[[Path], object]:
    kind = foreign_format(path)
    if kind is None:
        raise ValueError(f"{path} is neither a Hugging Face nor a Meta directory nor a GGUF file")
    return _READERS[kind][part]


def read_foreign(path: str | os.PathLike) -> ModelFiles:
    """The model in a Hugging Face Llama or Meta directory or a GGUF file; a missing or wrong tensor is one sentence
    naming it."""
    return _reader(path, 0)(Path(path))


def read_foreign_config(path: str | os.PathLike) -> ModelConfig:
    """The model config of a Hugging Face Llama or Meta directory or a GGUF file, without reading its weights."""
    return _reader(path, 1)(Path(path))


def read_foreign_tokenizer(path: str | os.PathLike) -> str:
    """The tokenizer JSON of a Hugging Face or Meta directory or a GGUF file, without reading its weights."""
    if foreign_format(path) == "gguf":
        return gguf.read_gguf_tokenizer(Path(path))

    return foreign_tokenizer.directory_tokenizer(Path(path))


def is_model(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a model (an mtp checkpoint, a Hugging Face or Meta directory, a GGUF file), not a
    tokenizer.json."""
    path = Path(path)
    return path.suffix == ".ckpt" or (path.is_dir() and (path / SHARDED_META).is_file()) or bool(foreign_format(path))


def model_tokenizer(path: str | os.PathLike) -> str:
    """The tokenizer JSON of the model at ``path`` (see :func:`is_model`), read without its tensors."""
    if foreign_format(path):
        return read_foreign_tokenizer(path)
    return read_checkpoint(path, mmap=Path(path).is_file())[CHECKPOINT_KEY]["tokenizer"]


def model_chat(path: str | os.PathLike, tokenizer: Tokenizer | None = None) -> ModelChat:
    """The chat template and the start and end tokens the model at ``path`` declares (:mod:`mtp.interop.chat`): a
    GGUF file's metadata (its start and end tokens only given its ``tokenizer``), a Hugging Face directory's
    ``tokenizer_config.json``, an mtp checkpoint's entry (those of the model its training started from); none for
    a model that declares no template."""
    path = Path(path)
    kind = foreign_format(path)
    if kind == "gguf":
        return gguf_chat(path, tokenizer)
    if kind in ("hf", "mimo"):
        return hf_chat(path)
    if kind is None and is_model(path) and path.exists():
        return ModelChat.from_dict(read_checkpoint(path, mmap=path.is_file())[CHECKPOINT_KEY].get("chat"))
    return ModelChat()


def chat_template_of(path: str | os.PathLike) -> str | None:
    """The chat template (Jinja text) the model at ``path`` declares (:func:`model_chat`), without its weights."""
    return model_chat(path).template
