import logging
import math
import weakref
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from conftest import compose_train
from hydra.utils import instantiate
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, ModelSummary, ThroughputMonitor
from lightning.pytorch.loggers import TensorBoardLogger
from omegaconf import OmegaConf, open_dict
from torch.utils.data import DataLoader
from torchmetrics.text import Perplexity

from mtp.checkpoint.format import read_checkpoint
from mtp.checkpoint.load import load_checkpoint
from mtp.checkpoint.save import AtomicCheckpointIO
from mtp.data.tokenizer import byte_tokenizer
from mtp.errors import UserError
from mtp.model import MTPModel
from mtp.model.config import ModelConfig
from mtp.model.transformer import IGNORE
from mtp.training.lit import MTPLitModule
from mtp.training.loss import answer_targets, mtp_loss, split_window
from mtp.training.loss_config import LossConfig
from mtp.training.optim import OptimConfig, parameter_groups, warmup_cosine
from mtp.training.train import instantiate_group, metric_order, train

PRESETS = ["mtp1", "mtp2", "mtp4", "mtp8", "byte1", "byte8"]


@pytest.mark.parametrize(  # the default and a byte model everyday; the other presets with the slow tests
    "preset", [pytest.param(p, marks=[] if p in ("mtp4", "byte8") else [pytest.mark.slow]) for p in PRESETS]
)
def test_fast_dev_run_every_model_preset(make_cfg, preset):
    cfg = make_cfg(preset, ["debug=fdr"])
    metrics = train(cfg)
    n = cfg.model.n_future
    assert {f"val/loss_head{k}" for k in range(1, n + 1)} <= metrics.keys()
    assert 1.0 <= metrics["val/expected_tokens_per_forward"] <= n


@pytest.mark.slow  # ~3 s: a debug preset trained
def test_overfit_debug_preset_rebuilds_the_training_loader(make_cfg):
    """debug=overfit makes Lightning rebuild the training DataLoader with its own sampler: it must still run."""
    metrics = train(make_cfg("mtp2", ["debug=overfit", "trainer.max_steps=3", "trainer.val_check_interval=3"]))
    assert "train/loss" in metrics


def test_the_model_summary_has_no_flops_line_when_nothing_counted_them(caplog):
    """Lightning counts FLOPs only for a module with an example input; without one its summary printed a FLOPs column
    of zeros and "0 Total Flops". The summary keeps every other line."""
    from lightning.pytorch.utilities.model_summary import summarize

    from mtp.training.callbacks import QuietModelSummary

    module = L.LightningModule()
    module.layer = torch.nn.Linear(4, 4)
    summary = summarize(module, max_depth=1)
    with caplog.at_level("INFO"):
        QuietModelSummary.summarize(
            summary._get_summary_data(),
            summary.total_parameters,
            summary.trainable_parameters,
            summary.model_size,
            summary.total_training_modes,
            total_flops=summary.total_flops,
        )
    text = caplog.text
    assert "Total params" in text and "layer" in text and "Linear" in text
    assert "Flops" not in text and "FLOPs" not in text


def test_every_config_group_instantiates_to_its_classes_and_settings(make_cfg):
    cfg = make_cfg("mtp2")
    run = cfg.paths.output_dir
    callbacks = {type(c).__name__: c for c in instantiate_group(cfg.callbacks)}
    assert list(callbacks) == [
        "ResumableCheckpoint",
        "NonFiniteGuard",
        "LearningRateMonitor",
        "TokenThroughputMonitor",
        "DecodeProbe",
        "QuietModelSummary",
        "Timer",
    ]
    checkpoint, guard, lr_monitor, throughput, probe, summary, timer = callbacks.values()
    assert timer._duration is None  # it times the run, and never stops it
    assert isinstance(checkpoint, ModelCheckpoint) and isinstance(throughput, ThroughputMonitor)
    assert type(lr_monitor) is LearningRateMonitor and isinstance(summary, ModelSummary)
    expected = {
        "dirpath": f"{run}/checkpoints",
        "filename": "step{step:06d}",
        "monitor": "val/loss_head1",
        "mode": "min",
        "save_top_k": 1,
        "save_last": True,
        "auto_insert_metric_name": False,
    }
    assert {key: getattr(checkpoint, key) for key in expected} == expected
    assert checkpoint.last_every_n_steps == 100
    assert (guard.skip, guard.skipped) == (0, 0)
    assert throughput.n_future == 2 and throughput.kwargs == {"window_size": 20}
    assert throughput.trained_tokens(torch.zeros(4, 34)) == 4 * 32
    assert summary._max_depth == 1 and (probe.prompts, probe.tokens) == (4, 48)
    module = instantiate(cfg.module, model=MTPModel(ModelConfig.from_dict(cfg.model)), _convert_="all")
    assert isinstance(module, MTPLitModule) and module.optim.lr == cfg.optim.lr and module.trunk_cache is None
    assert (lr_monitor.logging_interval, lr_monitor.log_momentum, lr_monitor.log_weight_decay) == ("step", False, False)

    (logger,) = instantiate_group(cfg.logger)
    assert type(logger) is TensorBoardLogger
    assert (logger.save_dir, logger.name, logger.version, logger._default_hp_metric) == (run, "tensorboard", "", False)
    assert logger.log_dir == f"{run}/tensorboard/"

    trainer = instantiate(cfg.trainer, logger=False, enable_checkpointing=False)
    assert type(trainer) is L.Trainer and type(trainer.accelerator) is CPUAccelerator
    assert (trainer.max_steps, trainer.max_epochs, trainer.val_check_interval) == (4, -1, 2)
    assert (trainer.limit_val_batches, trainer.log_every_n_steps) == (2, 1)
    assert (trainer.gradient_clip_val, trainer.accumulate_grad_batches) == (1.0, 1)
    assert (trainer.precision, trainer.num_devices, trainer.default_root_dir) == ("32-true", 1, run)
    assert trainer.logger is None and trainer.checkpoint_callback is None


@pytest.mark.parametrize(
    "override",
    ["debug=fdr", "debug=overfit", "debug=limit", "experiment=mtp4_base_gpu"]
    + [f"trainer={trainer}" for trainer in ("cpu", "gpu", "ddp")]
    + [f"size={size}" for size in ("tiny", "small", "base", "large", "trend_1m", "trend_3m", "trend_10m")]
    + ["data/tokenizer=byte", "data/tokenizer=pretrained"],
)
def test_every_preset_composes_into_valid_settings(make_cfg, override):
    cfg = make_cfg("mtp4", override.split())
    model = ModelConfig.from_dict(OmegaConf.to_container(cfg.model, resolve=True))  # every size fits every preset
    assert (model.n_future, model.n_layers, model.d_model) == (4, cfg.model.n_layers, cfg.model.d_model)
    assert model.n_layer_blocks == cfg.model.n_layers - 3  # one block per extra head, the rest is trunk
    trainer_args = OmegaConf.to_container(cfg.trainer, resolve=True)
    trainer_args.update(accelerator="cpu", devices=1, strategy="auto", precision="32-true", logger=False)
    trainer = instantiate(trainer_args, enable_checkpointing=False)
    assert isinstance(trainer, L.Trainer)
    assert trainer.max_steps == (1 if cfg.trainer.fast_dev_run else cfg.trainer.max_steps)  # fdr: one step


def test_default_config_is_mtp4_on_the_stdlib_corpus():
    cfg = compose_train([])
    assert cfg.model.n_future == 4 and cfg.data.source.kind == "stdlib" and cfg.data.tokenizer.kind == "bpe"
    assert compose_train(["model=byte8"]).data.tokenizer.kind == "byte"
    assert OmegaConf.to_container(cfg.trainer, resolve=False)["max_steps"] > 0


def test_run_logs_metrics_and_writes_a_checkpoint_with_its_tokenizer(make_cfg, caplog):
    cfg = make_cfg("mtp2")
    with caplog.at_level(logging.INFO, logger="mtp"):  # Python logging: Hydra's handlers show and file them
        metrics = train(cfg)
    run = Path(cfg.paths.output_dir)
    last = run / "checkpoints" / "last.ckpt"
    assert last.is_file()
    said = [r.getMessage() for r in caplog.records if r.name == "mtp.training.train"]
    assert f"checkpoint: {last}" in said and any(m.startswith("final validation: val/") for m in said)
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert {"train/loss", "train/loss_head1", "train/loss_head2", "val/ppl", "val/acc_head2"} <= metrics.keys()
    # Lightning's LearningRateMonitor: one key per parameter group (decayed matrices, then norms), the rate the
    # last step (step 3 of 4) trained with; none logged by hand under plain "lr"
    last_lr = cfg.optim.lr * warmup_cosine(3, cfg.optim.warmup_steps, 4, cfg.optim.min_lr_ratio)
    assert "lr" not in metrics
    assert metrics["lr/pg1"] == metrics["lr/pg2"] == pytest.approx(last_lr, rel=1e-6)
    assert metrics["val/ppl"] == pytest.approx(math.exp(metrics["val/loss_head1"]), rel=1e-6)
    loaded = load_checkpoint(last)
    assert loaded.config.n_future == 2 and loaded.global_step == 4
    ids = loaded.tokenizer.encode("def f(x):\n    return x\n").ids
    assert loaded.tokenizer.decode(ids) == "def f(x):\n    return x\n"
    with torch.no_grad():
        assert loaded.model(torch.tensor([ids])).shape == (2, 1, len(ids), 512)


@pytest.mark.slow  # ~3 s: a run with its event file read back
def test_tensorboard_holds_the_documented_curves(make_cfg):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = make_cfg("mtp2", ["trainer.max_steps=25", "trainer.val_check_interval=25", "optim.warmup_steps=5"])
    train(cfg)
    events = EventAccumulator(str(Path(cfg.paths.output_dir) / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    # every step's learning rate, as the warmup (5 steps) + cosine schedule gives it, for both parameter groups
    schedule = [cfg.optim.lr * warmup_cosine(step, 5, 25, cfg.optim.min_lr_ratio) for step in range(25)]
    for group in ("lr/pg1", "lr/pg2"):
        logged = [(event.step, event.value) for event in events.Scalars(group)]
        assert logged == [(step, pytest.approx(lr, rel=1e-6)) for step, lr in enumerate(schedule)], group
    assert "lr" not in tags
    expected = {
        "train/loss",
        "train/loss_head1",
        "train/loss_head2",
        "val/loss_head2",
        "val/acc_head1",
        "val/ppl",
    }
    assert expected | {"val/expected_tokens_per_forward", "train/device/items_per_sec"} <= tags
    assert {"val/acceptance_pos1", "val/decoded_tokens_per_forward", "val/decoded_acceptance_pos1"} <= tags


def tiny_module(n_future: int) -> MTPLitModule:
    torch.manual_seed(0)
    config = {"vocab_size": 64, "d_model": 32, "n_layers": 4, "n_heads": 2, "n_kv_heads": 1, "n_future": n_future}
    return MTPLitModule(model=MTPModel(ModelConfig(**config)))


def validate(module: MTPLitModule, batches: list[torch.Tensor]) -> dict[str, float]:
    """A real validation run (Lightning's loop, metrics and logging) over the given batches."""
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    (metrics,) = trainer.validate(module, dataloaders=DataLoader(batches, batch_size=None), verbose=False)
    return metrics


def test_training_and_validation_score_only_the_answers():
    """With loss.answers_after, a training step's loss and validation's are the answers' alone (marker 5, end 9)."""
    module = tiny_module(n_future=2)
    module.loss.answers_after = "="
    module.answer_token_ids = lambda tokenizer: (5, 9)  # what setup resolves from the data's tokenizer
    module.answer_tokens = (5, 9)
    batch = torch.randint(10, 64, (2, 20))
    batch[:, 3], batch[:, 9], batch[:, 12] = 5, 9, 5
    module.log = lambda *args, **kwargs: None  # outside a Trainer
    answers = mtp_loss(module.model, batch, module.loss, answers=(5, 9)).total
    assert module.training_step(batch, 0).item() == pytest.approx(answers.item(), rel=1e-6)
    assert answers.item() != pytest.approx(mtp_loss(module.model, batch, module.loss).total.item(), rel=1e-3)
    del module.log
    metrics = validate(module, [batch])
    inputs, targets = split_window(batch, 2)
    kept = answer_targets(batch, targets, 5, 9)[0]
    with torch.no_grad():
        logits = module.model(inputs)[0]
    expected = F.cross_entropy(logits[kept != IGNORE], kept[kept != IGNORE])
    assert metrics["val/loss_head1"] == pytest.approx(expected.item(), rel=1e-5)


def test_answers_after_resolves_to_one_token_of_the_datas_tokenizer():
    module = tiny_module(n_future=1)
    module.loss.answers_after = "="
    assert module.answer_token_ids(byte_tokenizer()) == (ord("="), 256)
    module.loss.answers_after = "=="
    with pytest.raises(UserError, match=r"^loss.answers_after='==' is 2 tokens of the data's tokenizer"):
        module.answer_token_ids(byte_tokenizer())


def test_validation_perplexity_is_exp_of_the_token_weighted_head1_loss():
    """val/ppl is exp of val/loss_head1, which weights each batch by its tokens: it equals the perplexity of head 1's
    logits over all validation tokens (computed here apart), with batches of 64 and 8 tokens whose losses differ."""
    module = tiny_module(n_future=2)
    with torch.no_grad():
        module.model.heads.outputs[0].weight.mul_(30)  # confident, often wrong: losses far from log(64), unequal
    batches = [torch.randint(0, 64, (4, 18)), torch.randint(0, 64, (1, 10))]
    metrics = validate(module, batches)
    perplexity = Perplexity()
    with torch.no_grad():
        for batch in batches:
            inputs, targets = split_window(batch, 2)
            perplexity.update(module.model(inputs)[0], targets[0])
    assert metrics["val/ppl"] == pytest.approx(math.exp(metrics["val/loss_head1"]), rel=1e-6)
    assert metrics["val/ppl"] == pytest.approx(perplexity.compute().item(), rel=1e-5)


def test_validation_keeps_one_heads_logits_alive_at_a_time():
    module = tiny_module(n_future=3)
    head_logits, alive, leaks = module.model.head_logits, [], []

    def watched(k: int, state: torch.Tensor) -> torch.Tensor:
        leaks.extend(k for ref in alive if ref() is not None)  # an earlier head's logits, still referenced
        logits = head_logits(k, state)
        alive.append(weakref.ref(logits))
        return logits

    module.model.head_logits = watched  # the instance attribute shadows the method
    validate(module, [torch.randint(0, 64, (2, 12))])
    assert len(alive) == 3 and leaks == []


def test_validation_decodes_with_every_head(make_cfg):
    """Measured tokens/forward and chained acceptance by position, causal heads included."""
    metrics = train(make_cfg("causal4", ["model.vocab_size=512", "trainer.max_steps=2"]))
    assert 1 <= metrics["val/decoded_tokens_per_forward"] <= 4
    for j in (1, 2, 3):
        assert 0 <= metrics[f"val/decoded_acceptance_pos{j}"] <= 1
        assert 0 <= metrics[f"val/acceptance_pos{j}"] <= 1


def test_resume_continues_the_run(make_cfg, tmp_path):
    first = make_cfg("mtp2", ["trainer.max_steps=3"])
    train(first)
    last = Path(first.paths.output_dir) / "checkpoints" / "last.ckpt"
    assert read_checkpoint(last)["global_step"] == 3
    second = make_cfg("mtp2", ["trainer.max_steps=6", f"ckpt_path={last}"])
    with open_dict(second):
        second.paths.output_dir = str(tmp_path / "resumed")
    train(second)
    resumed = read_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    assert resumed["global_step"] == 6
    first_state = read_checkpoint(last)
    # the optimizer's step counter continued from the first run rather than restarting
    step_counts = [s["step"].item() for s in resumed["optimizer_states"][0]["state"].values()]
    assert set(step_counts) == {6.0}
    assert first_state["lr_schedulers"][0]["last_epoch"] == 3 and resumed["lr_schedulers"][0]["last_epoch"] == 6


@pytest.mark.slow  # ~3 s: two runs
def test_resuming_a_checkpoint_keeps_its_loss_settings_unless_the_command_line_sets_them(make_cfg, tmp_path, caplog):
    """A checkpoint written before the loss settings had their own config kept them in its model config: a run
    resumed from it trains with them (and records them as today's checkpoints do), each one the command line sets
    excepted."""
    first = make_cfg("mtp2", ["trainer.max_steps=2", "loss.head_loss=ce+distill", "loss.distill_top_k=4"])
    train(first)
    checkpoint = read_checkpoint(Path(first.paths.output_dir) / "checkpoints" / "last.ckpt")
    meta = checkpoint["mtp"]
    assert meta["loss_config"] == LossConfig(head_loss="ce+distill", distill_top_k=4).to_dict()
    old = {("loss" if name == "mode" else name): value for name, value in meta.pop("loss_config").items()}
    meta["model_config"] |= old  # the layout of a checkpoint written before LossConfig
    legacy = tmp_path / "legacy.ckpt"
    torch.save(checkpoint, legacy)

    def resumed(*overrides: str) -> dict:
        cfg = make_cfg("mtp2", ["trainer.max_steps=3", f"ckpt_path={legacy}", *overrides])
        with open_dict(cfg):
            cfg.paths.output_dir = str(tmp_path / "resumed" / str(len(overrides)))
        train(cfg)
        return read_checkpoint(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt")["mtp"]["loss_config"]

    with caplog.at_level(logging.INFO, logger="mtp"):
        kept = resumed()
    assert kept == LossConfig(head_loss="ce+distill", distill_top_k=4).to_dict()
    assert "resuming with the checkpoint's loss settings loss.head_loss=ce+distill loss.distill_top_k=4" in caplog.text
    assert resumed("loss.distill_top_k=3")["distill_top_k"] == 3


class RecordBatches(L.Callback):
    def __init__(self) -> None:
        self.batches: list[torch.Tensor] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batches.append(batch.clone())


@pytest.mark.parametrize(  # without validation: with the slow tests
    "validation",
    [["trainer.val_check_interval=2"], pytest.param(["trainer.limit_val_batches=0"], marks=pytest.mark.slow)],
)
def test_resume_mid_epoch_continues_the_data_order(make_cfg, tmp_path, validation):
    """A resumed run trains on the batches the uninterrupted run would have seen next, not the epoch's first ones.

    The first run stops at step 3, between validations (or with none at all: then nothing but the final-step
    save may write last.ckpt), so its last.ckpt is the one written at the final step.
    """
    straight, first, resumed = RecordBatches(), RecordBatches(), RecordBatches()
    train(make_cfg("mtp1", ["trainer.max_steps=6", *validation]), callbacks=[straight])
    cfg = make_cfg("mtp1", ["trainer.max_steps=3", *validation])
    train(cfg, callbacks=[first])
    last = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
    cfg = make_cfg("mtp1", ["trainer.max_steps=6", *validation, f"ckpt_path={last}"])
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path / "resumed")
    train(cfg, callbacks=[resumed])
    assert len(straight.batches) == 6 and len(first.batches) == 3 and len(resumed.batches) == 3
    for a, b in zip(straight.batches, first.batches + resumed.batches, strict=True):
        assert torch.equal(a, b)


@pytest.mark.slow  # ~4 s: two runs
def test_the_corpus_is_prepared_once_and_a_resume_checkpoint_read_once(make_cfg, tmp_path, monkeypatch):
    """The Trainer drives the datamodule (prepare_data, then setup reuses it); the resume file is checked
    without reading its tensors (mmap) and read in full only by Lightning's restore."""
    import mtp.checkpoint.load
    import mtp.data.datamodule

    first = make_cfg("mtp2", ["trainer.max_steps=2"])
    train(first)
    last = Path(first.paths.output_dir) / "checkpoints" / "last.ckpt"

    prepared, loads = [], []
    real_prepare, real_load = mtp.data.datamodule.prepare, torch.load
    monkeypatch.setattr(mtp.data.datamodule, "prepare", lambda *a, **k: prepared.append(1) or real_prepare(*a, **k))
    monkeypatch.setattr(
        mtp.checkpoint.load.torch,
        "load",
        lambda f, *a, **k: loads.append(k.get("mmap", False)) or real_load(f, *a, **k),
    )
    resumed = make_cfg("mtp2", ["trainer.max_steps=4", f"ckpt_path={last}"])
    with open_dict(resumed):
        resumed.paths.output_dir = str(tmp_path / "resumed")
    train(resumed)
    assert len(prepared) == 1
    assert loads == [True, False]  # the check (mapped), then the one full read


def test_tokenizer_larger_than_model_vocabulary(make_cfg):
    cfg = make_cfg("mtp2", ["data.tokenizer.vocab_size=600"])
    with pytest.raises(UserError, match="tokenizer has 600 tokens but model.vocab_size=512"):
        train(cfg)


def test_seq_len_longer_than_validation_data(make_cfg):
    cfg = make_cfg("mtp2", ["data.seq_len=100000"])
    with pytest.raises(UserError, match="longer than the whole validation split"):
        train(cfg)


def test_bad_resume_checkpoints(make_cfg, tmp_path):
    missing = make_cfg("mtp2", [f"ckpt_path={tmp_path / 'nope.ckpt'}"])
    with pytest.raises(UserError, match="does not exist"):
        train(missing)
    truncated = tmp_path / "truncated.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1000)}, "mtp": {"format": 1}}, truncated)
    truncated.write_bytes(truncated.read_bytes()[:200])
    with pytest.raises(UserError, match="truncated or not a PyTorch checkpoint"):
        train(make_cfg("mtp2", [f"ckpt_path={truncated}"]))
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(3)}}, foreign)
    with pytest.raises(UserError, match="not an mtp checkpoint"):
        train(make_cfg("mtp2", [f"ckpt_path={foreign}"]))
    text = tmp_path / "notes.ckpt"
    text.write_text("hello")
    with pytest.raises(UserError, match="truncated or not a PyTorch checkpoint"):
        load_checkpoint(text)


def test_checkpoints_load_with_weights_only_and_never_unpickle_objects(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("executed",))

    path = tmp_path / "evil.ckpt"
    torch.save({"mtp": {"format": 1}, "state_dict": {}, "payload": Evil()}, path)
    with pytest.raises(UserError, match="truncated or not a PyTorch checkpoint"):
        read_checkpoint(path)


def test_atomic_save_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "ckpt" / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"x": torch.ones(2)}, target)
    assert target.is_file()

    def dies(obj, f, *args, **kwargs):  # interrupted half-way through writing
        f.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dies)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"x": torch.zeros(2)}, target)
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.ckpt"]
    monkeypatch.undo()
    assert torch.load(target, weights_only=True)["x"].sum() == 2


def test_warmup_then_cosine():
    lrs = [warmup_cosine(s, warmup_steps=10, total_steps=110, min_lr_ratio=0.1) for s in range(111)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(0.55) and lrs[110] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))


class RecordFused(L.Callback):
    def on_train_start(self, trainer, pl_module) -> None:
        self.fused = trainer.optimizers[0].defaults.get("fused")
        self.optimizer_dtype = trainer.optimizers[0].param_groups[0]["params"][0].dtype

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        """A form built before the first optimizer step, and one asked for after it (no validation in between): the
        module says its step changed the weights, so the second is built anew and holds them, not the first's."""
        from mtp.decode.inference import InferenceModel
        from mtp.training.parallel import is_sharded

        model = pl_module.model
        if is_sharded(model) or batch_idx > 1:  # never decoded in training (the DecodeProbe skips it)
            return
        form = InferenceModel.of(model, model.config.n_future)
        if batch_idx == 1:
            self.form_current = torch.equal(form.head1_output.weight, model.unembedding(1).weight * model.norm.weight)

    def on_train_end(self, trainer, pl_module) -> None:
        """Whether the DecodeProbe left an inference form built after the last validation (it drops them: no copy of
        the weights held through training)."""
        from mtp.decode.inference import _built
        from mtp.training.parallel import is_sharded

        if not is_sharded(pl_module.model):
            self.forms_left = bool(_built.get(pl_module.model))


def test_fused_adamw_trains_in_bf16_mixed_with_gradient_clipping(make_cfg):
    """Lightning's mixed-precision plugin refuses to clip a fused optimizer's gradients (the GPU kit's first run on an
    H200 stopped there: the default trainer=gpu is bf16-mixed, fused AdamW and gradient_clip_val 1); the module clips
    them itself. Runs on the CPU with optim.fused=true."""
    record = RecordFused()
    steps = ["trainer.max_steps=2", "trainer.val_check_interval=2", "trainer.limit_val_batches=1"]
    cfg = make_cfg("mtp4", ["trainer.precision=bf16-mixed", "optim.fused=true", *steps])
    assert cfg.trainer.gradient_clip_val > 0
    metrics = train(cfg, callbacks=[record])
    assert record.fused is True and math.isfinite(metrics["train/loss"])
    assert "val/decoded_tokens_per_forward" in metrics  # the probe decoded after the last step...
    assert record.forms_left is False  # ...and kept no copy of the weights it decoded with
    assert record.form_current  # a form asked for after an optimizer step holds the step's weights


@pytest.mark.slow
def test_fused_adamw_under_fsdp2_in_bf16_mixed_keeps_fp32_weights_in_the_optimizer(make_cfg):
    """The GPU kit's FSDP2 run on one CPU process: fused AdamW's gradients clipped under ModelParallelStrategy, fp32
    master weights in the optimizer (the module's own parameters are FSDP2's gathered bf16 ones after a forward)."""
    record = RecordFused()
    fsdp = ["trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=1", "trainer.precision=bf16-mixed"]
    steps = ["trainer.max_steps=2", "trainer.val_check_interval=2", "trainer.limit_val_batches=1"]
    metrics = train(make_cfg("mtp4", [*fsdp, "optim.fused=true", *steps]), callbacks=[record])
    assert record.fused is True and record.optimizer_dtype == torch.float32
    assert math.isfinite(metrics["train/loss"])


@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_a_fused_optimizers_gradients_are_clipped_as_lightning_clips(algorithm):
    """The module's own clipping of a fused optimizer equals Lightning's of the same gradients with an unfused one."""
    clipped = {}
    for fused in (True, False):
        torch.manual_seed(0)
        module = MTPLitModule(
            MTPModel(ModelConfig(vocab_size=50, d_model=16, n_layers=3, n_heads=2, n_kv_heads=1, n_future=2))
        )
        for p in module.parameters():
            p.grad = torch.randn_like(p) * 3
        optimizer = torch.optim.AdamW(module.parameters(), fused=fused)
        if fused:
            module.configure_gradient_clipping(optimizer, 0.5, algorithm)
        else:  # Lightning's own path (no precision plugin reads a plain fp32 optimizer's gradients otherwise)
            if algorithm == "norm":
                torch.nn.utils.clip_grad_norm_(list(module.parameters()), 0.5)
            else:
                torch.nn.utils.clip_grad_value_(list(module.parameters()), 0.5)
        clipped[fused] = torch.cat([p.grad.flatten() for p in module.parameters()])
    assert torch.equal(clipped[True], clipped[False])
    bound = clipped[True].norm() if algorithm == "norm" else clipped[True].abs().max()
    assert bound.item() == pytest.approx(0.5, rel=1e-5)


def test_decoding_after_a_fused_step_decodes_the_new_weights():
    """A fused AdamW step writes the weights in place (bumping not even their version counters); the inference form
    cached by the last generate is rebuilt once the training side says the weights changed, as the training module
    does after every step (:meth:`MTPLitModule.optimizer_step`; RecordFused checks it in a run)."""
    from mtp.decode.inference import InferenceModel

    torch.manual_seed(0)
    model = MTPModel(ModelConfig(vocab_size=50, d_model=16, n_layers=3, n_heads=2, n_kv_heads=1, n_future=2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    before = InferenceModel.of(model, 2)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()
    model.weights_changed()
    after = InferenceModel.of(model, 2)
    assert after is not before
    x = torch.randn(1, 16)
    # stale weights would differ by ~1 after a step at lr 0.1; the packed product rounds apart by ~1e-7
    assert torch.allclose(after.head1_output(x), model.unembedding(1)(x * model.norm.weight), atol=1e-5)


def test_fused_setting():
    assert OptimConfig().use_fused(cuda=True, loss_scaling=False, clipping=True)
    assert not OptimConfig().use_fused(cuda=False, loss_scaling=False, clipping=True)
    assert not OptimConfig().use_fused(cuda=True, loss_scaling=True, clipping=True)  # fp16 + clipping: unfused
    assert OptimConfig(fused=True).use_fused(cuda=False, loss_scaling=True, clipping=False)
    with pytest.raises(UserError, match="optim.fused=true cannot clip fp16 gradients"):
        OptimConfig(fused=True).use_fused(cuda=True, loss_scaling=True, clipping=True)
    with pytest.raises(UserError, match="must be true, false or auto"):
        OptimConfig(fused="yes")


def test_no_weight_decay_on_norms():
    model = MTPModel(ModelConfig(vocab_size=50, d_model=16, n_layers=3, n_heads=2, n_kv_heads=1, n_future=2))
    decay, no_decay = parameter_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 1 for p in no_decay["params"]) and all(p.dim() == 2 for p in decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    assert any(p is model.norm.weight for p in no_decay["params"])


def test_a_reduced_draft_vocabulary_is_the_training_datas_most_frequent_and_travels_in_the_checkpoint(make_cfg):
    cfg = make_cfg("mtp4", ["model.draft_vocab=64"])
    metrics = train(cfg)
    assert {"val/loss_head2", "val/acc_head4", "val/decoded_tokens_per_forward"} <= metrics.keys()
    loaded = load_checkpoint(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt")
    datamodule = instantiate(cfg.data, _convert_="all")
    datamodule.prepare_data()
    datamodule.setup("fit")
    counts = datamodule.token_counts("train")
    chosen = loaded.model.draft_tokens.tolist()
    assert chosen == sorted(chosen) and len(set(chosen)) == 64 == loaded.config.draft_vocab
    assert min(counts[chosen]) >= max(counts[[t for t in range(len(counts)) if t not in set(chosen)]])
    with torch.no_grad():
        logits = loaded.model(torch.tensor([[1, 2, 3, 4]]))
    assert torch.isfinite(logits[0]).all() and torch.isfinite(logits[1:]).sum() == 3 * 4 * 64


def test_training_follows_the_head_weight_schedule_and_distils(make_cfg):
    """A run of 4 steps with the linear schedule from 1 to 0: the last step (step 3 of 4) trains heads 2..n with
    weight 1/4, logged beside the losses; the distilled heads' loss (a KL) is logged too."""
    extra = [
        "loss.loss_weights_schedule=linear",
        "loss.loss_weights_final=[1.0,0.0,0.0,0.0]",
        "loss.head_loss=ce+distill",
        "loss.distill_top_k=4",
    ]
    metrics = train(make_cfg("mtp4", extra))
    assert metrics["train/weight_head1"] == 1.0
    assert metrics["train/weight_head2"] == metrics["train/weight_head4"] == pytest.approx(0.25)
    assert metrics["train/loss"] == pytest.approx(
        metrics["train/loss_head1"] + 0.25 * sum(metrics[f"train/loss_head{k}"] for k in (2, 3, 4)), rel=1e-5
    )


def test_distilling_while_the_trunk_trains_is_warned_about(make_cfg, caplog):
    from mtp.training.train import build

    with caplog.at_level(logging.WARNING, logger="mtp"):
        build(make_cfg("mtp2", ["loss.head_loss=distill"]))
    assert any("collapsed head 1" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mtp"):
        build(make_cfg("mtp2"))
    assert not caplog.records


def test_final_validation_line_leads_with_head1_and_orders_heads_by_number():
    names = ["val/acc_head2", "val/loss_head10", "val/loss_head2", "val/ppl", "val/acceptance_pos1", "val/loss_head1"]
    ordered = sorted(names, key=metric_order)
    assert ordered[:2] == ["val/loss_head1", "val/ppl"]
    assert ordered.index("val/loss_head2") < ordered.index("val/loss_head10")
