"""Lightning callbacks of a training run: when checkpoints are written, what a signal or a non-finite loss does,
tokens/s, and what is scored while it trains (decoding, a task's learning curve)."""

from __future__ import annotations

import logging
import math
import os
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, ModelSummary, ThroughputMonitor
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.model_summary.model_summary import _format_summary_table
from torch import Tensor

from mtp.checkpoint.format import TASK_CURVE
from mtp.decode import GenerationConfig, HeadsSettings, Plan, generate
from mtp.decode.inference import InferenceModel
from mtp.errors import UserError, settings_named_by_keys
from mtp.training.parallel import data_parallel_size, is_sharded
from mtp.training.task_scores import TASKS, TaskSettings, parse_ops, row_metrics

log = logging.getLogger(__name__)


class ResumableCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint (the best by ``monitor`` after each validation, and last.ckpt), plus last.ckpt
    every ``every_n_train_steps`` steps, at the final step (``max_steps``) and when SIGTERM or Ctrl-C stops the run.

    ``every_n_train_steps`` here only adds last.ckpt saves: the best-model saves stay after validation, where the
    monitored value belongs to the weights being saved (Lightning's own ``every_n_train_steps`` would move them to
    those steps, judged by a validation loss of older weights). It bounds what a kill that cannot be caught
    (SIGKILL, an out-of-memory kill, a lost node) loses; 0 turns it off.

    The periodic and final-step saves happen at the end of a training batch, where Lightning's own step saves
    happen, so resuming from them continues mid-epoch. Lightning (2.6+) saves last.ckpt once more in
    ``on_train_end``, after the epoch loop has closed, and a run resumed from that copy would start a new epoch
    instead of finishing the interrupted one: that save is skipped here.

    SIGTERM (preemption: SLURM, Kubernetes) is Lightning's: its signal connector notes it on every process and the
    fit loop raises ``SIGTERMException`` once the running batch (and a validation in progress) has finished; this
    callback then writes last.ckpt (``mtp.training.train.train`` turns Ctrl-C into the same request).
    """

    def __init__(self, *args: Any, every_n_train_steps: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if every_n_train_steps is not None and every_n_train_steps < 0:
            raise UserError(
                f"callbacks.model_checkpoint.every_n_train_steps={every_n_train_steps} must be 0 (off) or positive."
            )
        self.last_every_n_steps = every_n_train_steps or 0
        self.saved_final_step = False

    @property
    def last_path(self) -> str | None:
        if self.dirpath is None:
            return None
        return os.path.join(self.dirpath, f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}")

    def write_last(self, trainer: L.Trainer) -> None:
        """A full (resumable) last.ckpt now."""
        trainer.save_checkpoint(self.last_path, weights_only=False)
        self.last_model_path = self.last_path

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if not self.save_last or trainer.fast_dev_run or self.dirpath is None or trainer.sanity_checking:
            return
        step = trainer.global_step
        final_step = 0 < trainer.max_steps <= step
        periodic = self.last_every_n_steps > 0 and step % self.last_every_n_steps == 0
        if final_step or periodic:
            self.write_last(trainer)
            self.saved_final_step = final_step

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.saved_final_step:
            super().on_train_end(trainer, pl_module)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException) or self.dirpath is None or not self.save_last:
            return
        self.write_last(trainer)


class NonFiniteGuard(L.Callback):
    """Stops the run when a step's loss or gradient norm is not finite, before the optimizer applies it.

    The error names the step and the last checkpoint written (whose weights predate the bad step). With
    ``skip=N`` up to N such batches are skipped instead: their gradients are dropped (set to None, so that
    AdamW leaves every parameter and its moments as they were) and a warning says so; the next one stops the
    run. The check costs one device-to-host read of one scalar per optimizer step; on several processes they
    agree before acting (one all-reduce), so that all skip or all stop together.
    """

    def __init__(self, skip: int = 0) -> None:
        if skip < 0:
            raise UserError(f"skip_nonfinite={skip} must be 0 (stop at the first non-finite loss) or positive.")
        self.skip = skip
        self.skipped = 0
        self._loss_finite: Tensor | None = None
        self._loss: Tensor | None = None

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Tensor) -> None:
        finite = torch.isfinite(loss.detach())
        self._loss = loss.detach()
        self._loss_finite = finite if self._loss_finite is None else self._loss_finite & finite

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        # fp16 with loss scaling: an overflowing gradient is the GradScaler's to skip (it lowers the scale)
        norm = None if str(trainer.precision).startswith("16") else gradient_norm(grads)
        finite = torch.isfinite(norm) if norm is not None else torch.ones((), dtype=torch.bool)
        if self._loss_finite is not None:
            finite = finite.to(self._loss_finite.device) & self._loss_finite
        loss, self._loss_finite, self._loss = self._loss, None, None
        bad = not bool(finite)  # the one host read per step
        bad = trainer.strategy.reduce_boolean_decision(bad, all=False)  # any process's bad step is everyone's
        if not bad:
            return
        step = trainer.global_step + 1  # the step this optimizer update would complete
        what = f"the loss was {_scalar(loss)} and the gradient norm {_scalar(norm)}"
        if self.skipped < self.skip:
            self.skipped += 1
            optimizer.zero_grad(set_to_none=True)
            log.warning(
                "step %d: %s; skipped this batch (%d of skip_nonfinite=%d).", step, what, self.skipped, self.skip
            )
            pl_module.log("train/skipped_nonfinite", float(self.skipped))
            return
        raise UserError(
            f"training stopped at step {step}: {what}; {_last_good(trainer)} lower optim.lr, raise "
            f"optim.warmup_steps or set skip_nonfinite=N to skip up to N such batches"
            + (f" (skip_nonfinite={self.skip} were all used)." if self.skip else ".")
        )


def gradient_norm(grads: list[Tensor]) -> Tensor | None:
    """The 2-norm of all gradients together (local shards under FSDP2: enough to tell finite from not)."""
    if not grads:
        return None
    local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(local)).float())


def _scalar(value: Tensor | None) -> str:
    if value is None:
        return "not computed"
    number = float(value.float())
    return str(number) if not math.isfinite(number) else f"{number:.4g}"


def _last_good(trainer: L.Trainer) -> str:
    callback = trainer.checkpoint_callback
    path = getattr(callback, "last_model_path", "") if callback is not None else ""
    if not (path and os.path.exists(path)):  # none written by this run yet: the one it resumed from, if any
        path = trainer.ckpt_path or ""
    if path and os.path.exists(path):
        return f"the last good checkpoint is {path}; resume from it with ckpt_path={path} and"
    return "no checkpoint was written before it; restart with"


class TokenThroughputMonitor(ThroughputMonitor):
    """Lightning's throughput monitor counting trained tokens as items: B x seq_len per (B, seq_len + n_future) batch.

    Logs ``train/device/items_per_sec`` (tokens/s per device) and, with several devices, ``train/items_per_sec``.
    """

    def __init__(self, n_future: int, window_size: int = 20) -> None:
        self.n_future = n_future
        super().__init__(batch_size_fn=self.batch_size, length_fn=self.trained_tokens, window_size=window_size)

    @staticmethod
    def batch_size(batch: Tensor) -> int:
        return batch.size(0)

    def trained_tokens(self, batch: Tensor) -> int:
        return batch.size(0) * (batch.size(1) - self.n_future)


class QuietModelSummary(ModelSummary):
    """Lightning's summary without its FLOPs column and "0 Total Flops" line: Lightning counts FLOPs only for a
    module with an ``example_input_array``, which would cost a forward of the whole model before training; mtp
    reports training speed as trained tokens per second instead (``TokenThroughputMonitor``)."""

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        if not total_flops:
            summary_data = [column for column in summary_data if column[0] != "FLOPs"]
        table = _format_summary_table(
            total_parameters, trainable_parameters, model_size, total_training_modes, total_flops, *summary_data
        )
        if not total_flops:
            table = "\n".join(line for line in table.splitlines() if not line.endswith("Total Flops"))
        logging.getLogger("lightning.pytorch.callbacks.model_summary").info("\n" + table)


class DecodeProbe(L.Callback):
    """After each validation, greedy self-speculative decoding with every head from the openings of the first
    validation windows: the tokens/forward and chained acceptance by position that decoding measures on the model's
    own continuation (``val/decoded_*``; the module's teacher-forced ``val/acceptance_pos*`` read the reference text).

    ``prompts`` openings (each half a window) of ``tokens`` new tokens. Skipped for a one-head model and for a sharded
    (FSDP2) one, whose weights no single process holds.
    """

    def __init__(self, prompts: int = 4, tokens: int = 48) -> None:
        if prompts < 0 or tokens < 0:
            raise UserError(f"callbacks.decode_probe: prompts={prompts} and tokens={tokens} must be 0 (off) or more.")
        self.prompts, self.tokens = prompts, tokens
        self._openings: Tensor | None = None

    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if batch_idx == 0:
            self._openings = batch[: self.prompts, : batch.size(1) // 2]

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        openings, self._openings = self._openings, None
        model = pl_module.model
        n = model.config.n_future
        if openings is None or n == 1 or not self.prompts or not self.tokens or is_sharded(model):
            return
        with torch.autocast(pl_module.device.type, enabled=False):
            config, heads = GenerationConfig(max_new_tokens=self.tokens), HeadsSettings(heads=n)
            _, stats = generate(model, openings.tolist(), Plan(config, heads))
        InferenceModel.release(model)  # the next validation's weights differ: no copy of these kept while training
        pl_module.log("val/decoded_tokens_per_forward", stats.tokens_per_forward, sync_dist=True)
        for j, rate in enumerate(stats.acceptance, start=1):
            pl_module.log(f"val/decoded_acceptance_pos{j}", rate, sync_dist=True)


class TaskCurve(L.Callback):
    """The run's task metric as a learning curve: at the first step, every ``every_n_steps`` optimizer steps and at
    the last (``trainer.max_steps``), the task of the training data (``task``: ``data.source.kind``) is scored on the
    first ``problems`` of its evaluation set (:data:`mtp.training.task_scores.TASKS`, as ``mtp eval-task`` scores a
    checkpoint: polynomial, exact match per operation count of ``ops``; induction, accuracy on repeated names' second
    and first tokens), logged to the run's loggers at that step as ``task/<group>_<value>`` (``task/ops_1``,
    ``task/token_second``: TensorBoard's curves), and kept as a point (step, tokens trained, rows) in the callback's
    state. The state is saved with every checkpoint, so a resumed run continues its curve and ``mtp eval-task`` puts
    a checkpoint's curve into its results (``curve``), which a sweep's page draws.

    Opt-in: ``callbacks=task_curve`` (``experiment=paper_induction`` and ``paper_polynomial`` select it). A run whose
    data has no task metric is refused when the callback is built, before any data is prepared. The score runs on
    the first process only, in float32 (outside autocast); a sharded (FSDP2) model, whose weights no single process
    holds, is not scored (a warning says so).
    """

    def __init__(
        self, task: str, every_n_steps: int = 100, problems: int | None = None, ops: str = "1-5", batch_size: int = 64
    ) -> None:
        if task not in TASKS:
            raise UserError(
                f"callbacks=task_curve scores the task of the training data, and data.source.kind={task} has no task "
                f"metric; train on data={' or data='.join(TASKS)} (experiment=paper_induction, paper_polynomial), or "
                "drop the curve with callbacks=default."
            )
        for name, value in (("every_n_steps", every_n_steps), ("problems", problems), ("batch_size", batch_size)):
            if value is not None and value < 1:
                raise UserError(f"callbacks.task_curve.{name}={value} must be at least 1.")
        self.task, self.every_n_steps = task, every_n_steps
        with settings_named_by_keys("callbacks.task_curve"):  # the library names the field; the user wrote a key
            scored_ops = parse_ops(ops)
        self.settings = TaskSettings(scored_ops, problems, 1, batch_size)
        self.points: list[dict[str, Any]] = []
        """(step, tokens, rows) of every score so far, the resumed run's included."""
        self._scored_step: int | None = None
        self._data: dict[str, Any] | None = None
        self._tokenizer = None
        self._tokens_per_step = 0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        datamodule = trainer.datamodule
        self._data, self._tokenizer = datamodule.description(), datamodule.tokenizer
        available = self._data["source"].get("eval_problems")
        if self.task == "polynomial" and self.settings.problems is not None and self.settings.problems > available:
            raise UserError(
                f"callbacks.task_curve.problems={self.settings.problems} is more than the {available} problems per "
                f"count the data keeps for evaluation (data.source.eval_problems); use at most {available}."
            )
        accumulate = trainer.accumulate_grad_batches
        self._tokens_per_step = datamodule.batch_size * datamodule.seq_len * data_parallel_size(trainer) * accumulate
        if is_sharded(pl_module.model):
            log.warning(
                "callbacks=task_curve: the model is sharded (FSDP2), so no process can score it alone: no curve."
            )

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step == 0:
            self.score(trainer, pl_module)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        due = step % self.every_n_steps == 0 or step == trainer.max_steps
        if due and step != self._scored_step:  # accumulation: several batches end at one step
            self.score(trainer, pl_module)

    def score(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Score the model now; log and keep the point."""
        step = self._scored_step = trainer.global_step
        if not trainer.is_global_zero or is_sharded(pl_module.model):
            return
        with torch.autocast(pl_module.device.type, enabled=False), torch.no_grad():
            results = TASKS[self.task](pl_module.model, self._tokenizer, self._data, self.settings)
        for logger in trainer.loggers:
            logger.log_metrics(row_metrics(results), step=step)
        self.points = [p for p in self.points if p["step"] < step]  # a step scored again replaces its point
        self.points.append({"step": step, "tokens": step * self._tokens_per_step, "rows": results["rows"]})

    def state_dict(self) -> dict[str, Any]:
        return {TASK_CURVE: list(self.points), "task": self.task}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.points = list(state_dict.get(TASK_CURVE, []))
