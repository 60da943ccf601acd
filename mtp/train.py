"""train(cfg): instantiate datamodule, module, callbacks, loggers and trainer from a Hydra config, then fit."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hydra
import lightning as L
from omegaconf import DictConfig, OmegaConf, open_dict

from mtp.checkpoint_load import check_checkpoint
from mtp.checkpoint_save import AtomicCheckpointIO
from mtp.lit import MTPLitModule


def instantiate_group(group: DictConfig | None) -> list[Any]:
    """Instantiate every entry of a callbacks/logger group that names a ``_target_``."""
    if not group:
        return []
    return [
        hydra.utils.instantiate(node) for node in group.values() if isinstance(node, DictConfig) and "_target_" in node
    ]


def build(
    cfg: DictConfig, callbacks: Sequence[L.Callback] = ()
) -> tuple[L.LightningDataModule, MTPLitModule, L.Trainer]:
    """The datamodule, the module and the trainer described by ``cfg``, plus extra ``callbacks``.

    Nothing is prepared here: the Trainer calls the datamodule's ``prepare_data`` and ``setup`` (on every
    process of a distributed run) and the module's ``setup`` and ``configure_model``.
    """
    if cfg.get("seed") is not None:
        L.seed_everything(cfg.seed, workers=True)
    module = MTPLitModule(  # validates the model config before any data work
        model=OmegaConf.to_container(cfg.model, resolve=True),
        optim=OmegaConf.to_container(cfg.optim, resolve=True),
        compile=bool(cfg.get("compile", False)),
        activation_checkpointing=bool(cfg.get("activation_checkpointing", False)),
        init_from=cfg.get("init_from"),
        freeze=cfg.get("freeze", "none"),
    )
    if module.start_tokenizer is not None:  # data tokenized as the model it starts from was
        with open_dict(cfg):
            cfg.data.tokenizer = {
                "kind": "pretrained",
                "path": save_tokenizer(module.start_tokenizer, cfg.data.cache_dir),
            }
    datamodule = hydra.utils.instantiate(cfg.data, _convert_="all")
    trainer = hydra.utils.instantiate(
        cfg.trainer,
        callbacks=instantiate_group(cfg.get("callbacks")) + list(callbacks),
        logger=instantiate_group(cfg.get("logger")) or False,
        plugins=[AtomicCheckpointIO()],
    )
    return datamodule, module, trainer


def save_tokenizer(tokenizer_json: str, cache_dir: str) -> str:
    """Write a tokenizer JSON under the data cache, named by its content (atomically: no half-written file)."""
    digest = hashlib.sha256(tokenizer_json.encode()).hexdigest()[:16]
    path = Path(cache_dir) / f"tokenizer-{digest}.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(tokenizer_json)
        os.replace(partial, path)
    return str(path)


def train(cfg: DictConfig, callbacks: Sequence[L.Callback] = ()) -> dict[str, float]:
    """Fit as configured (with extra ``callbacks``, if given); returns the final logged metrics."""
    ckpt_path = cfg.get("ckpt_path")
    if ckpt_path:
        check_checkpoint(ckpt_path)  # a missing, truncated or foreign checkpoint fails here, before any work
    datamodule, module, trainer = build(cfg, callbacks)
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    report(trainer, metrics)
    return metrics


def report(trainer: L.Trainer, metrics: dict[str, float]) -> None:
    if not trainer.is_global_zero:
        return
    shown = ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()) if k.startswith("val/"))
    if shown:
        print(f"final validation: {shown}")
    checkpoint = trainer.checkpoint_callback and trainer.checkpoint_callback.last_model_path
    if checkpoint and Path(checkpoint).exists():  # a file, or a folder for a sharded checkpoint
        print(f"checkpoint: {checkpoint}")
    for logger in trainer.loggers:
        if logger.log_dir is None:
            continue
        print(f"tensorboard logs: {logger.log_dir}  (view: tensorboard --logdir {Path(logger.log_dir).parent.parent})")
