"""train(cfg): instantiate datamodule, module, callbacks, loggers and trainer from a Hydra config, then fit."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hydra
import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import InstantiationException
from hydra.types import RunMode
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from mtp.checkpoint.format import CHECKPOINT_KEY, read_checkpoint
from mtp.checkpoint.load import is_model, model_tokenizer
from mtp.checkpoint.save import AtomicCheckpointIO
from mtp.data.packing import writing_to_cache
from mtp.errors import UserError
from mtp.interop.chat import ModelChat
from mtp.model import MTPModel
from mtp.model.config import ModelConfig, stored_loss_settings
from mtp.pretrained.init_from import Start, check_freeze, freeze, settings_from_checkpoint
from mtp.pretrained.reference import register_resolver
from mtp.training.callbacks import ResumableCheckpoint
from mtp.training.lit import MTPLitModule
from mtp.training.loss_config import LossConfig
from mtp.training.parallel import check_tensor_parallel, check_tensor_parallel_loss
from mtp.training.strategy import MeshStrategy

register_resolver()  # ${reference_model:}, for a config composed without the pretrain command
log = logging.getLogger(__name__)  # under Hydra: the console and the run folder's <task>.log (conf/hydra/default.yaml)


def instantiate(node: DictConfig, **kwargs: Any) -> Any:
    """Hydra's instantiate, with a UserError raised by the target passed on as it is (Hydra wraps it)."""
    try:
        return hydra.utils.instantiate(node, **kwargs)
    except InstantiationException as err:
        if isinstance(err.__cause__, UserError):
            raise err.__cause__ from None
        raise


def instantiate_group(group: DictConfig | None) -> list[Any]:
    """Instantiate every entry of a callbacks/logger group that names a ``_target_``."""
    if not group:
        return []
    return [instantiate(node) for node in group.values() if isinstance(node, DictConfig) and "_target_" in node]


def build(
    cfg: DictConfig, callbacks: Sequence[L.Callback] = ()
) -> tuple[L.LightningDataModule, MTPLitModule, L.Trainer]:
    """The datamodule, the module and the trainer described by ``cfg``, plus extra ``callbacks``.

    Nothing is prepared here: the Trainer calls the datamodule's ``prepare_data`` and ``setup`` (on every
    process of a distributed run) and the module's ``setup`` and ``configure_model``.
    """
    if cfg.get("seed") is not None:
        L.seed_everything(cfg.seed, workers=True)
    model, start, loaded = build_model(cfg)  # validates the model config before any data work
    module = instantiate(cfg.module, model=model, draft_tokens_loaded="draft_tokens" in loaded, _convert_="all")
    warn_distilling_a_moving_teacher(module.model, module.loss)
    module.chat = start.chat if start is not None else ModelChat()  # the start's chat template travels on
    start_tokenizer = start.tokenizer if start is not None else None  # the data is tokenized as that model was
    datamodule = instantiate(cfg.data, tokenizer=data_tokenizer(cfg, start_tokenizer), _convert_="all")
    loggers = instantiate_group(cfg.get("logger"))
    configured = instantiate_group(cfg.get("callbacks"))
    if not loggers:  # logger=null: nothing to monitor the learning rate into (Lightning refuses the monitor then)
        configured = [c for c in configured if not isinstance(c, LearningRateMonitor)]
    trainer = instantiate(
        cfg.trainer,
        callbacks=configured + list(callbacks),
        logger=loggers or False,
        plugins=[AtomicCheckpointIO()],
    )
    if isinstance(trainer.strategy, MeshStrategy):  # a model tensor parallelism cannot split: said before any data
        check_tensor_parallel(module.model.config, trainer.strategy.tensor_parallel_size, type(module.model.heads))
        check_tensor_parallel_loss(module.loss.detach_heads, trainer.strategy.tensor_parallel_size)
    return datamodule, module, trainer


def build_model(cfg: DictConfig) -> tuple[MTPModel, Start | None, set[str]]:
    """The model to train, from ``cfg.model``; with ``init_from``, grown from that checkpoint (its shapes: only the
    model settings the user typed may differ; its weights) and frozen as ``freeze`` asks. Also the checkpoint read,
    if any, and the names of the parameters loaded from it."""
    settings, init_from, mode = (
        OmegaConf.to_container(cfg.model, resolve=True),
        cfg.get("init_from"),
        cfg.get("freeze", "none"),
    )
    check_freeze(mode, init_from)
    if not init_from:
        return MTPModel(ModelConfig.from_dict(settings)), None, set()
    settings = settings_from_checkpoint(init_from, settings, explicit_settings(cfg, "model"))  # from its header: cheap
    start = Start.read(init_from)
    model = MTPModel(ModelConfig.from_dict(start.grown(settings)))
    loaded = start.load_into(model)
    freeze(model, mode, loaded)
    return model, start, loaded


def warn_distilling_a_moving_teacher(model: MTPModel, loss: LossConfig) -> None:
    """Warn that distillation from head 1 while the trunk trains moves head 1 itself, which can collapse it."""
    if loss.head_loss != "ce" and any(p.requires_grad for p in model.trunk_blocks.parameters()):
        log.warning(
            "loss.head_loss=%s with a trunk that trains: the heads' distillation term also moves the trunk and the "
            "shared unembedding that make head 1's distribution, and on the default run it collapsed head 1 "
            "(val/acc_head1 0.151 -> 0.034); distil heads on a frozen trunk (init_from=... freeze=loaded) or keep "
            "loss.head_loss=ce.",
            loss.head_loss,
        )


def explicit_settings(cfg: DictConfig, group: str) -> set[str]:
    """The settings of ``group`` (``model``, ``loss``) the command line set (``model.d_model=512``, ``+model.x=...``),
    from Hydra's record of the overrides, read by Hydra's own parser: in the config when composed with
    ``return_hydra_config``, else in the running Hydra app; a preset's own values (``model=mtp4``, ``size=small``) are
    not among them."""
    if "hydra" in cfg:
        overrides = cfg.hydra.overrides.task
    elif HydraConfig.initialized():
        overrides = HydraConfig.get().overrides.task
    else:
        overrides = []
    keys = (override.key_or_group for override in OverridesParser.create().parse_overrides(list(overrides)))
    return {key.removeprefix(f"{group}.") for key in keys if key.startswith(f"{group}.")}


def resumed_loss(cfg: DictConfig, checkpoint: dict[str, Any]) -> DictConfig:
    """``cfg`` with the loss settings of the run a checkpoint continues: each that the checkpoint recorded (a
    checkpoint written before the loss settings had their own config recorded them among the model's:
    :func:`mtp.model.config.stored_loss_settings`), unless the command line sets it (``loss.head_loss=ce``)."""
    meta = checkpoint[CHECKPOINT_KEY]
    stored = stored_loss_settings(meta["model_config"], meta.get("loss_config"))
    explicit = explicit_settings(cfg, "loss")
    kept = {name: value for name, value in stored.items() if name not in explicit and cfg.loss.get(name) != value}
    if not kept:
        return cfg
    log.info(
        "resuming with the checkpoint's loss settings %s (set them on the command line to change them)",
        " ".join(f"loss.{name}={value}" for name, value in kept.items()),
    )
    return OmegaConf.merge(cfg, {"loss": kept})


def data_tokenizer(cfg: DictConfig, start_tokenizer: str | None) -> dict[str, Any]:
    """The data's tokenizer settings: the tokenizer of the model training starts from, if any (the data is tokenized
    as that model was); else ``data.tokenizer``, where a model's path (``data.tokenizer.path=TARGET.ckpt``, a Hugging
    Face or Meta directory, a GGUF file: a draft for that model) becomes the path of its tokenizer's JSON."""
    settings = OmegaConf.to_container(cfg.data.tokenizer, resolve=True)
    if start_tokenizer is None and settings.get("kind") == "pretrained" and settings.get("path"):
        if is_model(settings["path"]):
            start_tokenizer = model_tokenizer(settings["path"])
    if start_tokenizer is None:
        return settings
    return {"kind": "pretrained", "path": save_tokenizer(start_tokenizer, cfg.data.cache_dir)}


def save_tokenizer(tokenizer_json: str, cache_dir: str) -> str:
    """Write a tokenizer JSON under the data cache, named by its content (atomically: no half-written file)."""
    digest = hashlib.sha256(tokenizer_json.encode()).hexdigest()[:16]
    path = Path(cache_dir) / f"tokenizer-{digest}.json"
    if not path.exists():
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            with writing_to_cache(path):
                path.parent.mkdir(parents=True, exist_ok=True)
                partial.write_text(tokenizer_json)
                os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
    return str(path)


def train(cfg: DictConfig, callbacks: Sequence[L.Callback] = ()) -> dict[str, float]:
    """Fit as configured (with extra ``callbacks``, if given); returns the final logged metrics."""
    ckpt_path = cfg.get("ckpt_path")
    if ckpt_path:  # a missing, truncated or foreign checkpoint fails here, before any work
        cfg = resumed_loss(cfg, read_checkpoint(ckpt_path, mmap=not Path(ckpt_path).is_dir()))
    datamodule, module, trainer = build(cfg, callbacks)
    with CtrlCAsSigterm() as ctrl_c:
        try:
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
        except SIGTERMException:
            raise Interrupted(trainer, "SIGINT" if ctrl_c.pressed else "SIGTERM") from None
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    report(trainer, metrics)
    return metrics


class CtrlCAsSigterm:
    """While training, a first Ctrl-C asks for what SIGTERM does (stop after the running step, with last.ckpt: see
    ResumableCheckpoint); a second one stops at once, unsaved. Outside the main thread it does nothing."""

    def __init__(self) -> None:
        self.pressed = False
        self._previous: Any = None

    def __enter__(self) -> CtrlCAsSigterm:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = True
        log.warning("Ctrl-C: stopping after this step and saving last.ckpt (Ctrl-C again: stop now, unsaved)")
        os.kill(os.getpid(), signal.SIGTERM)  # Lightning's signal connector takes it from here


class Interrupted(SystemExit):
    """SIGTERM or Ctrl-C stopped the run between two steps, after last.ckpt was written (see ResumableCheckpoint).

    Exits with 128 + the signal's number, as a process killed by it would (143 for SIGTERM, 130 for SIGINT), so
    that schedulers see an interrupted run rather than a finished one.
    """

    def __init__(self, trainer: L.Trainer, name: str) -> None:
        saver = next((c for c in trainer.callbacks if isinstance(c, ResumableCheckpoint)), None)
        self.signal_name, self.step = name, trainer.global_step
        self.checkpoint = saver.last_model_path if saver is not None and saver.last_model_path else None
        super().__init__(128 + int(getattr(signal, name)))
        if trainer.is_global_zero:
            sweep = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
            where = (
                f"wrote {self.checkpoint}; "
                + ("run the same sweep again to continue it" if sweep else f"continue with ckpt_path={self.checkpoint}")
                if self.checkpoint
                else "no checkpoint was written (checkpointing is off)"
            )
            log.warning("%s stopped the run after step %d: %s", name, self.step, where)


LEADING_METRICS = (
    "val/loss_head1",
    "val/ppl",
    "val/acc_head1",
    "val/decoded_tokens_per_forward",
    "val/expected_tokens_per_forward",
)
"""What the final validation line starts with: next-token quality, then what decoding will get."""


def metric_order(name: str) -> tuple[int, int, str]:
    """The leading metrics first, then the per-head and per-position ones by number (head 10 after head 2)."""
    if name in LEADING_METRICS:
        return (0, LEADING_METRICS.index(name), name)
    number = re.search(r"(\d+)$", name)
    return (1, int(number.group(1)) if number else 0, name)


def report(trainer: L.Trainer, metrics: dict[str, float]) -> None:
    if not trainer.is_global_zero:
        return
    names = sorted((k for k in metrics if k.startswith("val/")), key=metric_order)
    shown = ", ".join(f"{k}={metrics[k]:.4g}" for k in names)
    if shown:
        log.info("final validation: %s", shown)
    checkpoint = trainer.checkpoint_callback and trainer.checkpoint_callback.last_model_path
    if checkpoint and Path(checkpoint).exists():  # a file, or a folder for a sharded checkpoint
        log.info("checkpoint: %s", checkpoint)
    for logger in trainer.loggers:
        if logger.log_dir is None:
            continue
        runs = Path(logger.log_dir).parent.parent
        log.info("tensorboard logs: %s  (view: tensorboard --logdir %s)", logger.log_dir, runs)
