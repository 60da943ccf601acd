"""LightningModule: trains the MTP model it is given (built where the run is assembled,
:func:`mtp.training.train.build`): steps, metrics, AdamW + schedule, sharding in ``configure_model``."""

from __future__ import annotations

import logging
import math
from functools import partial
from typing import Any

import lightning as L
import torch
from lightning.pytorch.plugins.precision import HalfPrecision, MixedPrecision
from lightning.pytorch.strategies import ModelParallelStrategy
from tokenizers import Tokenizer
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from mtp.checkpoint.format import CHECKPOINT_FORMAT, CHECKPOINT_KEY
from mtp.data.tokenizer import eot_id
from mtp.errors import UserError
from mtp.interop.chat import ModelChat
from mtp.model.transformer import IGNORE, MTPModel
from mtp.training.loss import answer_targets, cross_entropy, head_logits, mtp_loss, split_window, unembed, window_states
from mtp.training.loss_config import LossConfig
from mtp.training.metrics import AcceptanceByPosition, ExpectedTokensPerForward
from mtp.training.optim import OptimConfig, parameter_groups, warmup_cosine
from mtp.training.parallel import data_parallel_size, parallelize
from mtp.training.trunk_cache import TrunkCache, available_memory, cache_budget, cache_room

log = logging.getLogger(__name__)


class MTPLitModule(L.LightningModule):
    """Training of the MTP model ``model`` (built, and grown from ``init_from`` and frozen if asked, where the run is
    assembled: :func:`mtp.training.train.build`); the rest of the settings come from the config's ``module`` node:
    ``loss`` (:class:`mtp.training.loss_config.LossConfig`'s settings, the config's ``loss`` group, checked against
    the model's here) and ``optim`` (:class:`mtp.training.optim.OptimConfig`'s).

    ``draft_tokens_loaded``: the reduced draft vocabulary came with the model's checkpoint (else the data chooses it).
    With the trunk frozen, ``trunk_cache_gb`` keeps up to that many GiB of the trunk's outputs of training windows, so
    that later epochs run only the heads (mtp.training.trunk_cache). ``compile`` and ``activation_checkpointing`` are
    applied per block in ``configure_model`` (see mtp.training.parallel), together with FSDP2 sharding over the
    strategy's data-parallel mesh when it is Lightning's ModelParallelStrategy (``trainer=fsdp``). Decoding during
    validation is a callback's (:class:`mtp.training.callbacks.DecodeProbe`).
    """

    def __init__(
        self,
        model: MTPModel,
        loss: dict[str, Any] | None = None,
        optim: dict[str, Any] | None = None,
        compile: bool = False,
        activation_checkpointing: bool = False,
        draft_tokens_loaded: bool = False,
        trunk_cache_gb: float = 0.0,
        trunk_cache_dir: str | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["model"])  # the model's settings travel as its config (on_save_checkpoint)
        self.model, self.config = model, model.config
        self.loss = LossConfig.from_dict(loss or {})
        self.loss.check_model(self.config)
        self.optim = OptimConfig(**(optim or {}))
        self.compile_blocks, self.activation_checkpointing = compile, activation_checkpointing
        self.draft_tokens_loaded = draft_tokens_loaded
        self.chat = ModelChat()
        """What the model training started from declares about chat (``init_from``); saved with the checkpoint."""
        if trunk_cache_gb < 0:
            raise UserError(f"trunk_cache_gb={trunk_cache_gb} must be 0 (off) or a positive number of gigabytes.")
        self.trunk_cache = None
        self.answer_tokens: tuple[int, int] | None = None
        """The ids of ``loss.answers_after`` and end-of-text, once the data's tokenizer is known (:meth:`setup`)."""
        if trunk_cache_gb > 0:
            TrunkCache.check_frozen(self.model)
            budget, note = cache_budget(int(trunk_cache_gb * 2**30), *cache_room(trunk_cache_dir))
            if note is not None:
                log.info(note)
            self.trunk_cache = TrunkCache(self.model, budget, trunk_cache_dir)
        self._parallelized = False
        n, vocab = self.config.n_future, self.config.vocab_size
        self.val_loss = nn.ModuleList(MeanMetric() for _ in range(n))
        self.val_acc = nn.ModuleList(MulticlassAccuracy(vocab, average="micro", ignore_index=IGNORE) for _ in range(n))
        self.val_tokens_per_forward = ExpectedTokensPerForward()
        self.val_acceptance = AcceptanceByPosition(n - 1)

    @property
    def n_future(self) -> int:
        return self.config.n_future

    def setup(self, stage: str) -> None:
        world = self.trainer.world_size
        if self.trunk_cache is not None and self.trunk_cache.folder is not None and world > 1:
            memory = available_memory()
            budget, _ = cache_budget(self.trunk_cache.max_bytes, memory // world if memory else None, "")
            log.info(
                f"trunk cache: each of the {world} processes keeps its rows in memory ({budget / 2**30:.1f} GiB at "
                "most), not in trunk_cache_dir (a cache file serves one process)"
            )
            self.trunk_cache.folder, self.trunk_cache.max_bytes = None, budget
        datamodule = self.trainer.datamodule
        vocab_size = getattr(datamodule, "vocab_size", None)
        if vocab_size is not None:
            self.check_vocab_size(vocab_size)
        self.answer_tokens = self.answer_token_ids(getattr(datamodule, "tokenizer", None))
        if self.config.draft_vocab and not self.draft_tokens_loaded and hasattr(datamodule, "token_counts"):
            self.choose_draft_tokens(torch.from_numpy(datamodule.token_counts("train")))

    def answer_token_ids(self, tokenizer: Tokenizer | None) -> tuple[int, int] | None:
        """The ids of ``loss.answers_after`` (one token) and of end-of-text in the data's tokenizer (None: every token
        is scored)."""
        text = self.loss.answers_after
        if text is None:
            return None
        if tokenizer is None:
            raise UserError(f"loss.answers_after={text!r} needs the data's tokenizer, and this datamodule has none.")
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        if len(ids) != 1:
            raise UserError(
                f"loss.answers_after={text!r} is {len(ids)} tokens of the data's tokenizer, and it must be one; give "
                "the single character (or token) that precedes each answer, such as '='."
            )
        return ids[0], eot_id(tokenizer)

    def choose_draft_tokens(self, counts: Tensor) -> None:
        """Heads 2..n score the model.draft_vocab most frequent tokens of the training data, (vocab_size,) counts (ties
        to the lower id, so every process chooses the same); a resumed run's checkpoint restores its own after this."""
        counts = torch.cat([counts, counts.new_zeros(max(0, self.config.vocab_size - counts.numel()))])
        most = torch.sort(counts, descending=True, stable=True).indices[: self.config.draft_vocab]
        self.model.draft_tokens.copy_(most.sort().values)
        self.model.weights_changed()

    def configure_model(self) -> None:
        if self._parallelized:  # Lightning calls this again for every later fit/validate on the same module
            return
        self._parallelized = True
        mesh, tp_mesh, mp_policy = self._sharding()
        parallelize(
            self.model,
            activation_checkpointing=self.activation_checkpointing,
            compile=self.compile_blocks,
            mesh=mesh,
            mp_policy=mp_policy,
            tp_mesh=tp_mesh,
        )

    def _sharding(self) -> tuple[Any, Any, Any]:
        """(FSDP2 mesh, tensor-parallel mesh, mixed-precision policy) under ModelParallelStrategy, else (None, None,
        None): the strategy's data-parallel mesh (every process with ``trainer=fsdp``; None where tensor parallelism
        leaves one process in it), its tensor-parallel mesh when larger than one process (``trainer=tp``:
        mtp.training.strategy.MeshStrategy), and bf16 parameters with fp32 gradient reduction when the trainer's
        precision plugin computes in bf16 (``bf16-mixed``, ``bf16-true``)."""
        if not isinstance(self.trainer.strategy, ModelParallelStrategy):
            return None, None, None
        from torch.distributed.fsdp import MixedPrecisionPolicy  # distributed: imported only for a sharded run

        mesh, tp_mesh = self.device_mesh["data_parallel"], self.device_mesh["tensor_parallel"]
        if tp_mesh.size() == 1:
            tp_mesh = None
        elif mesh.size() == 1:  # tensor parallelism alone: nothing to shard over
            mesh = None
        plugin = self.trainer.precision_plugin
        if isinstance(plugin, MixedPrecision | HalfPrecision) and plugin.precision in ("bf16-mixed", "bf16-true"):
            return mesh, tp_mesh, MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        return mesh, tp_mesh, None

    def check_vocab_size(self, vocab_size: int) -> None:
        """The tokenizer's ids must all fit the model's embedding."""
        if vocab_size > self.config.vocab_size:
            raise UserError(
                f"the tokenizer has {vocab_size} tokens but model.vocab_size={self.config.vocab_size}; "
                f"set model.vocab_size >= {vocab_size} or shrink data.tokenizer.vocab_size."
            )

    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        weights = self.head_weights()
        head1_weights = self.loss.head1_weights_at(self.progress()) if self.loss.head1_targets else None
        out = mtp_loss(
            self.model, batch, self.loss, trunk=self.trunk_cache, weights=weights, answers=self.answer_tokens,
            head1_weights=head1_weights,
        )  # fmt: skip
        self.log("train/loss", out.total, prog_bar=True)
        for k in out.heads:  # a head with nothing to train is not computed (a frozen head 1: see trained_heads)
            self.log(f"train/loss_head{k}", out.per_head[k - 1])
            if self.loss.loss_weights_schedule != "constant":
                self.log(f"train/weight_head{k}", weights[k - 1])
        if out.head1_future is not None:  # head 1 against tokens t+2..t+k (loss.head1_targets)
            for j, (loss, weight) in enumerate(zip(out.head1_future, head1_weights[1:], strict=True), start=2):
                self.log(f"train/loss_head1_t{j}", loss)
                self.log(f"train/weight_head1_t{j}", weight)
        return out.total

    def progress(self) -> float:
        """This step's place in the run: the optimizer steps taken over the steps the run will take (what the
        learning-rate schedule reads too)."""
        return self.trainer.global_step / max(1, self.trainer.estimated_stepping_batches)

    def head_weights(self) -> list[float]:
        """The head weights of this step under ``loss.loss_weights_schedule`` (:meth:`progress`)."""
        if self.loss.loss_weights_schedule == "constant":
            return self.loss.weights(self.n_future)
        return self.loss.weights_at(self.progress(), self.n_future)

    def on_train_epoch_end(self) -> None:
        if self.trunk_cache is not None and self.trainer.world_size == 1:  # processes would share one file
            self.trunk_cache.save()

    def validation_step(self, batch: Tensor, batch_idx: int) -> None:
        states, targets = window_states(self.model, batch)
        if self.answer_tokens is not None:  # the loss and accuracy of what training scores
            targets = answer_targets(batch, targets, *self.answer_tokens)
        predictions = []
        for k, logits, target in head_logits(self.model, states, targets):
            # the loss over the tokens head k scores (all, or a reduced draft vocabulary); accuracy over every token
            self.val_loss[k - 1].update(cross_entropy(logits, target), weight=(target != IGNORE).sum())
            prediction = self.model.head_tokens(k, logits.argmax(dim=-1))  # (B, T) token ids
            self.val_acc[k - 1].update(prediction.flatten(), targets[k - 1].flatten())
            predictions.append(prediction)
            del logits  # before the next head's are computed: one head's (B, T, V) alive at a time
        if self.model.heads.conditions_on_tokens and self.n_future > 1:
            predictions = self.greedy_chain_predictions(batch, predictions[0])
        self.val_tokens_per_forward.update(torch.stack(predictions))
        self.val_acceptance.update(torch.stack(predictions))
        for k in range(1, self.n_future + 1):
            self.log(f"val/loss_head{k}", self.val_loss[k - 1], prog_bar=k == 1)
            self.log(f"val/acc_head{k}", self.val_acc[k - 1])
        self.log("val/expected_tokens_per_forward", self.val_tokens_per_forward)

    def greedy_chain_predictions(self, batch: Tensor, head1: Tensor) -> list[Tensor]:
        """Every head's argmax when heads condition on the tokens greedy decoding will have accepted: head 1's
        argmaxes (what an accepted draft equals), not the reference text. head1: (B, T) head 1's argmax."""
        inputs, targets = split_window(batch, self.n_future)
        T = inputs.size(1)
        following = targets[:-1].clone()  # the reference only where head 1's argmax runs out (beyond the measured span)
        for j in range(1, self.n_future):
            following[j - 1, :, : T - j + 1] = head1[:, j - 1 :]
        states = self.model.head_states(inputs, following=following)
        heads = range(2, self.n_future + 1)
        return [head1] + [self.model.head_tokens(k, unembed(self.model, k, states[k - 1]).argmax(-1)) for k in heads]

    def on_validation_epoch_end(self) -> None:
        # exp of head 1's token-weighted mean loss: the perplexity of its logits, without a second pass over them
        self.log("val/ppl", self.val_loss[0].compute().exp())
        if self.n_future > 1:
            for j, rate in enumerate(self.val_acceptance.compute().reshape(-1).tolist(), start=1):
                self.log(f"val/acceptance_pos{j}", rate)
        self.val_acceptance.reset()

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = torch.optim.AdamW(
            parameter_groups(self.model, self.optim.weight_decay),
            lr=self.optim.lr,
            betas=self.optim.betas,
            eps=self.optim.eps,
            fused=self.optim.use_fused(
                cuda=self.device.type == "cuda",
                loss_scaling=str(self.trainer.precision).startswith("16"),
                clipping=bool(self.trainer.gradient_clip_val),
            ),
        )
        total_steps = self.trainer.estimated_stepping_batches
        if not math.isfinite(total_steps):
            raise UserError(
                "the learning-rate schedule needs a finite run; set trainer.max_steps or trainer.max_epochs."
            )
        schedule = partial(
            warmup_cosine,
            warmup_steps=self.optim.warmup_steps,
            total_steps=int(total_steps),
            min_lr_ratio=self.optim.min_lr_ratio,
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "name": "lr"}}

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        """Lightning's step, then the model told that its weights changed: decoding during training (the DecodeProbe,
        a task curve) packs them afresh."""
        super().optimizer_step(*args, **kwargs)
        self.model.weights_changed()

    def configure_gradient_clipping(
        self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None, gradient_clip_algorithm=None
    ) -> None:
        """Clip a fused optimizer's gradients here: Lightning's mixed-precision plugin refuses to clip them (with fp16
        loss scaling a fused step unscales the gradients itself). Without a loss scale (bf16, fp32; fp16 with fused is
        refused in configure_optimizers) they are the true gradients, so torch.nn.utils clips them as Lightning would,
        DTensor shards under FSDP2 included."""
        if not optimizer.defaults.get("fused") or not gradient_clip_val:
            super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
            return
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if gradient_clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(params, gradient_clip_val)
        else:
            torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        datamodule = self.trainer.datamodule
        checkpoint[CHECKPOINT_KEY] = {
            "format": CHECKPOINT_FORMAT,
            "model_config": self.config.to_dict(),
            "loss_config": self.loss.to_dict(),  # how it trained: a resumed run keeps it (train.resumed_loss)
            "tokenizer": datamodule.tokenizer.to_str(),
            "data": datamodule.description(),  # where held-out prompts come from (bench_decode)
            "tokens_per_step": self.tokens_per_step(),  # with global_step: what the run has trained on
            "threads": torch.get_num_threads(),  # how its training time was spent (the Timer's, in "callbacks")
        }
        if self.chat.template:  # the start model's chat template: decode and bench_decode speak to it as to the start
            checkpoint[CHECKPOINT_KEY]["chat"] = self.chat.to_dict()

    def tokens_per_step(self) -> int | None:
        """Tokens one optimizer step trains on, over every process (None: a datamodule without batches of windows)."""
        batch_size = getattr(self.trainer.datamodule, "batch_size", None)
        seq_len = getattr(self.trainer.datamodule, "seq_len", None)
        if batch_size is None or seq_len is None:
            return None
        return batch_size * seq_len * data_parallel_size(self.trainer) * self.trainer.accumulate_grad_batches

    @property
    def flops_per_batch(self) -> int | None:
        """Approximate training FLOPs of one batch (6 x matmul parameters x tokens, plus attention)."""
        batch_size = getattr(self.trainer.datamodule, "batch_size", None)
        seq_len = getattr(self.trainer.datamodule, "seq_len", None)
        if batch_size is None or seq_len is None:
            return None
        c = self.config
        block = sum(p.numel() for p in self.model.layers[0].parameters())
        head_blocks = c.n_future - 1 if c.head_blocks else 0  # a shared depth runs at every depth
        n_blocks = c.n_layer_blocks + head_blocks
        others = self.model.heads.per_depth_parameters()  # causal input projections, medusa residual blocks
        unembeddings = c.n_future * c.d_model * c.vocab_size
        blocks = n_blocks * block + others
        attention = 6 * n_blocks * c.d_model * seq_len  # QK^T and AV, causal
        return int(batch_size * seq_len * (6 * (blocks + unembeddings) + attention))
