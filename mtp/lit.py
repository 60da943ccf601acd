"""LightningModule: builds the MTP model from plain config, runs steps, logs metrics, sets up AdamW + schedule."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from mtp.checkpoint_format import CHECKPOINT_FORMAT, CHECKPOINT_KEY
from mtp.config import ModelConfig
from mtp.decode import GenerationConfig, generate
from mtp.errors import UserError
from mtp.init_from import Start, check_freeze
from mtp.init_from import freeze as apply_freeze
from mtp.loss import cross_entropy, head_logits, mtp_loss, split_window, window_states
from mtp.metrics import AcceptanceByPosition, ExpectedTokensPerForward
from mtp.model import IGNORE, MTPModel
from mtp.optim import OptimConfig, parameter_groups, warmup_cosine
from mtp.parallel import is_sharded, parallelize
from mtp.trunk_cache import TrunkCache


class MTPLitModule(L.LightningModule):
    """Training of an MTP model from plain settings.

    ``init_from`` (a checkpoint) and ``freeze`` start from a trained model: see mtp.init_from. With the trunk frozen,
    ``trunk_cache_gb`` keeps up to that many GiB of the trunk's outputs of training windows, so that later epochs run
    only the heads (mtp.trunk_cache).
    ``compile`` and ``activation_checkpointing`` are applied per block in ``configure_model`` (see
    mtp.parallel), together with FSDP2 sharding over every process when the strategy is Lightning's
    ModelParallelStrategy (``trainer=fsdp``).
    """

    def __init__(
        self,
        model: dict[str, Any],
        optim: dict[str, Any] | None = None,
        compile: bool = False,
        activation_checkpointing: bool = False,
        init_from: str | None = None,
        freeze: str = "none",
        val_decode_prompts: int = 4,
        val_decode_tokens: int = 48,
        trunk_cache_gb: float = 0.0,
        trunk_cache_dir: str | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        check_freeze(freeze, init_from)
        start = Start.read(init_from) if init_from else None
        self.config = ModelConfig.from_dict(start.grown(dict(model)) if start else dict(model))
        self.optim = OptimConfig(**(optim or {}))
        self.compile_blocks, self.activation_checkpointing = compile, activation_checkpointing
        self.model = MTPModel(self.config)
        self.start_tokenizer = None
        """The tokenizer JSON of the ``init_from`` checkpoint: the data must be tokenized with it."""
        self.draft_tokens_loaded = False
        """Whether the reduced draft vocabulary came with the init_from checkpoint (else the data chooses it)."""
        if start is not None:
            loaded = start.load_into(self.model)
            apply_freeze(self.model, freeze, loaded)
            self.start_tokenizer = start.tokenizer
            self.draft_tokens_loaded = "draft_tokens" in loaded
        if trunk_cache_gb < 0:
            raise UserError(f"trunk_cache_gb={trunk_cache_gb} must be 0 (off) or a positive number of gigabytes.")
        self.trunk_cache = None
        if trunk_cache_gb > 0:
            TrunkCache.check_frozen(self.model)
            self.trunk_cache = TrunkCache(self.model, int(trunk_cache_gb * 2**30), trunk_cache_dir)
        self._parallelized = False
        n, vocab = self.config.n_future, self.config.vocab_size
        self.val_loss = nn.ModuleList(MeanMetric() for _ in range(n))
        self.val_acc = nn.ModuleList(MulticlassAccuracy(vocab, average="micro") for _ in range(n))
        self.val_tokens_per_forward = ExpectedTokensPerForward()
        self.val_acceptance = AcceptanceByPosition(n - 1)
        self.val_decode_prompts, self.val_decode_tokens = val_decode_prompts, val_decode_tokens
        self._decode_prompts: Tensor | None = None  # openings of the first validation windows, decoded at epoch end

    @property
    def n_future(self) -> int:
        return self.config.n_future

    def setup(self, stage: str) -> None:
        datamodule = self.trainer.datamodule
        vocab_size = getattr(datamodule, "vocab_size", None)
        if vocab_size is not None:
            self.check_vocab_size(vocab_size)
        if self.config.draft_vocab and not self.draft_tokens_loaded and hasattr(datamodule, "token_counts"):
            self.choose_draft_tokens(torch.from_numpy(datamodule.token_counts("train")))

    def choose_draft_tokens(self, counts: Tensor) -> None:
        """Heads 2..n score the model.draft_vocab most frequent tokens of the training data, (vocab_size,) counts (ties
        to the lower id, so every process chooses the same); a resumed run's checkpoint restores its own after this."""
        counts = torch.cat([counts, counts.new_zeros(max(0, self.config.vocab_size - counts.numel()))])
        most = torch.sort(counts, descending=True, stable=True).indices[: self.config.draft_vocab]
        self.model.draft_tokens.copy_(most.sort().values)

    def configure_model(self) -> None:
        if self._parallelized:  # Lightning calls this again for every later fit/validate on the same module
            return
        self._parallelized = True
        mesh, mp_policy = self._sharding()
        parallelize(
            self.model,
            activation_checkpointing=self.activation_checkpointing,
            compile=self.compile_blocks,
            mesh=mesh,
            mp_policy=mp_policy,
        )

    def _sharding(self) -> tuple[Any, Any]:
        """(mesh, mixed-precision policy) for FSDP2 under ModelParallelStrategy, else (None, None)."""
        if not isinstance(self.trainer.strategy, ModelParallelStrategy):
            return None, None
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy

        # Shard over every process (Lightning's own mesh splits them into data x tensor parallel; mtp uses no TP)
        mesh = init_device_mesh(self.trainer.strategy.root_device.type, (self.trainer.world_size,))
        if str(self.trainer.precision).startswith("bf16"):
            return mesh, MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        return mesh, None

    def check_vocab_size(self, vocab_size: int) -> None:
        """The tokenizer's ids must all fit the model's embedding."""
        if vocab_size > self.config.vocab_size:
            raise UserError(
                f"the tokenizer has {vocab_size} tokens but model.vocab_size={self.config.vocab_size}; "
                f"set model.vocab_size >= {vocab_size} or shrink data.tokenizer.vocab_size."
            )

    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        out = mtp_loss(self.model, batch, trunk=self.trunk_cache)
        self.log("train/loss", out.total, prog_bar=True)
        for k in out.heads:  # a head with nothing to train is not computed (a frozen head 1: see trained_heads)
            self.log(f"train/loss_head{k}", out.per_head[k - 1])
        return out.total

    def on_train_epoch_end(self) -> None:
        if self.trunk_cache is not None and self.trainer.world_size == 1:  # processes would share one file
            self.trunk_cache.save()

    def validation_step(self, batch: Tensor, batch_idx: int) -> None:
        if batch_idx == 0:
            self._decode_prompts = batch[: self.val_decode_prompts, : batch.size(1) // 2]
        states, targets = window_states(self.model, batch)
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
        return [head1] + [self.model.head_tokens(k, self.model.head_logits(k, states[k - 1]).argmax(-1)) for k in heads]

    def on_validation_epoch_end(self) -> None:
        # exp of head 1's token-weighted mean loss: the perplexity of its logits, without a second pass over them
        self.log("val/ppl", self.val_loss[0].compute().exp())
        if self.n_future > 1:
            for j, rate in enumerate(self.val_acceptance.compute().reshape(-1).tolist(), start=1):
                self.log(f"val/acceptance_pos{j}", rate)
            self.log_decoded_validation()
        self.val_acceptance.reset()

    def log_decoded_validation(self) -> None:
        """Greedy self-speculative decoding with all heads from the openings of a few validation windows: measured
        tokens/forward and chained acceptance by position, what decoding gets on the model's own continuation
        (the teacher-forced estimates above read the reference text instead). Skipped for a sharded (FSDP2) model,
        whose weights no single process holds."""
        prompts = self._decode_prompts
        self._decode_prompts = None
        if prompts is None or self.val_decode_prompts < 1 or self.val_decode_tokens < 1 or is_sharded(self.model):
            return
        config = GenerationConfig(max_new_tokens=self.val_decode_tokens, heads=self.n_future)
        with torch.autocast(self.device.type, enabled=False):
            _, stats = generate(self.model, prompts.tolist(), config)
        self.log("val/decoded_tokens_per_forward", stats.tokens_per_forward, sync_dist=True)
        for j, rate in enumerate(stats.acceptance, start=1):
            self.log(f"val/decoded_acceptance_pos{j}", rate, sync_dist=True)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = torch.optim.AdamW(
            parameter_groups(self.model, self.optim.weight_decay),
            lr=self.optim.lr,
            betas=self.optim.betas,
            eps=self.optim.eps,
            fused=self.device.type == "cuda",
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

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        datamodule = self.trainer.datamodule
        checkpoint[CHECKPOINT_KEY] = {
            "format": CHECKPOINT_FORMAT,
            "model_config": self.config.to_dict(),
            "tokenizer": datamodule.tokenizer.to_str(),
            "data": datamodule.description(),  # where held-out prompts come from (bench_decode)
        }

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
