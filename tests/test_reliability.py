"""Training under kills, signals, non-finite losses and full disks: what is saved, what resumes, what is said."""

import errno
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from omegaconf import open_dict

from mtp.checkpoint.format import read_checkpoint
from mtp.errors import UserError
from mtp.training.callbacks import NonFiniteGuard, ResumableCheckpoint
from mtp.training.train import Interrupted, train
from tests.test_scripts import tiny_data

ROOT = Path(__file__).resolve().parents[1]
RECORD = "tests.batch_recorder.RecordBatches"
NO_VALIDATION = ["trainer.limit_val_batches=0"]


# -- helpers
def run_dir_cfg(make_cfg, tmp_path, name, extra):
    cfg = make_cfg("mtp2", extra)
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path / name)
    return cfg


def last_ckpt(cfg) -> Path:
    return Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"


class Record(L.Callback):
    def __init__(self) -> None:
        self.batches: list[torch.Tensor] = []
        self.saved_at: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batches.append(batch.clone())

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self.saved_at.append(trainer.global_step)


class SendSignal(L.Callback):
    """Sends ``signum`` to this process at the end of training step ``step`` (or in the validation after it)."""

    def __init__(self, signum: int, step: int, in_validation: bool = False) -> None:
        self.signum, self.step, self.in_validation, self.sent = signum, step, in_validation, False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.in_validation and trainer.global_step == self.step and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if self.in_validation and trainer.global_step == self.step and not self.sent and not trainer.sanity_checking:
            self.sent = True
            os.kill(os.getpid(), self.signum)


def interrupted_then_resumed(make_cfg, tmp_path, extra, sender, total_steps):
    """(batches of an uninterrupted run, of the interrupted run + its resumption, the Interrupted raised)."""
    straight, first, resumed = Record(), Record(), Record()
    train(run_dir_cfg(make_cfg, tmp_path, "straight", [f"trainer.max_steps={total_steps}", *extra]), [straight])
    cfg = run_dir_cfg(make_cfg, tmp_path, "first", [f"trainer.max_steps={total_steps}", *extra])
    with pytest.raises(Interrupted) as stopped:
        train(cfg, [first, sender])
    resume = [f"trainer.max_steps={total_steps}", *extra, f"ckpt_path={last_ckpt(cfg)}"]
    train(run_dir_cfg(make_cfg, tmp_path, "resumed", resume), [resumed])
    return straight.batches, first.batches + resumed.batches, stopped.value, cfg


def assert_same_batches(straight, stitched):
    assert len(straight) == len(stitched)
    for i, (a, b) in enumerate(zip(straight, stitched, strict=True)):
        assert torch.equal(a, b), f"batch {i} differs"


def assert_same_weights(a: Path, b: Path):
    first, second = read_checkpoint(a), read_checkpoint(b)
    assert first["global_step"] == second["global_step"]
    for name, tensor in first["state_dict"].items():
        torch.testing.assert_close(second["state_dict"][name], tensor, rtol=0, atol=1e-6, msg=name)
    assert first["lr_schedulers"] == second["lr_schedulers"]


# -- SIGTERM and Ctrl-C
@pytest.mark.slow
def test_sigterm_in_a_real_process_at_a_random_moment_resumes_on_the_same_batches(corpus_dir, shared_cache, tmp_path):
    """A pretrain.py process is sent SIGTERM at a random moment of its training; it writes last.ckpt and exits
    143; resumed from it, it trains on exactly the batches an uninterrupted run trains on and ends with its weights."""
    steps = 60
    common = [
        *tiny_data(corpus_dir, shared_cache),
        "model=mtp2",
        "model.vocab_size=512",
        f"trainer.max_steps={steps}",
        "trainer.val_check_interval=8",
        "trainer.limit_val_batches=2",
        "trainer.accelerator=cpu",
        "trainer.enable_progress_bar=false",
        f"+callbacks.record._target_={RECORD}",
    ]

    def start(name: str, *extra: str) -> subprocess.Popen:
        command = [sys.executable, str(ROOT / "scripts" / "pretrain.py"), *common, *extra]
        command += [f"paths.log_dir={tmp_path / 'logs'}", f"hydra.run.dir={tmp_path / name}"]
        command.append(f"+callbacks.record.path={tmp_path / name / 'batches'}")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    straight = start("straight")
    assert straight.wait(timeout=600) == 0, straight.stderr.read()
    interrupted = start("first")
    deadline = time.monotonic() + 300
    while not (tmp_path / "first" / "batches" / "started").exists():
        assert interrupted.poll() is None and time.monotonic() < deadline, interrupted.stderr.read()
        time.sleep(0.05)
    time.sleep(random.uniform(0.0, 2.0))
    signalled = time.monotonic()
    interrupted.send_signal(signal.SIGTERM)
    status = interrupted.wait(timeout=120)
    stop_seconds = time.monotonic() - signalled
    stderr = interrupted.stderr.read()
    stdout = interrupted.stdout.read()  # the run's messages go through logging: Hydra's console handler is stdout
    assert status == 143, stderr
    last = tmp_path / "first" / "checkpoints" / "last.ckpt"
    stopped_at = read_checkpoint(last)["global_step"]
    assert 0 < stopped_at < steps
    assert f"SIGTERM stopped the run after step {stopped_at}: wrote {last}; continue with ckpt_path={last}" in stdout
    assert "Traceback" not in stderr
    first_batches = torch.load(tmp_path / "first" / "batches" / "rank0.pt")
    assert len(first_batches) == stopped_at  # the batch in flight was finished and saved, none trained twice
    resumed = start("resumed", f"ckpt_path={last}")
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read()
    straight_batches = torch.load(tmp_path / "straight" / "batches" / "rank0.pt")
    resumed_batches = torch.load(tmp_path / "resumed" / "batches" / "rank0.pt")
    assert_same_batches(straight_batches, first_batches + resumed_batches)
    assert_same_weights(
        tmp_path / "straight" / "checkpoints" / "last.ckpt", tmp_path / "resumed" / "checkpoints" / "last.ckpt"
    )
    print(f"SIGTERM after step {stopped_at}: exited {stop_seconds:.2f} s after the signal")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "in_validation", "status"),
    [(signal.SIGTERM, True, 143), (signal.SIGINT, False, 130)],
    ids=["sigterm-in-validation", "ctrl-c"],
)
def test_a_signal_saves_last_ckpt_and_the_resumed_run_is_the_uninterrupted_one(
    make_cfg, tmp_path, signum, in_validation, status
):
    user_handler = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN under a background shell
    extra = ["trainer.val_check_interval=2", "callbacks.model_checkpoint.every_n_train_steps=0"]
    sender = SendSignal(signum, step=4 if in_validation else 3, in_validation=in_validation)
    straight, stitched, stopped, cfg = interrupted_then_resumed(make_cfg, tmp_path, extra, sender, total_steps=7)
    assert stopped.code == status
    assert stopped.step == (4 if in_validation else 3) == read_checkpoint(last_ckpt(cfg))["global_step"]
    assert_same_batches(straight, stitched)
    straight_last = tmp_path / "straight" / "checkpoints" / "last.ckpt"
    assert_same_weights(straight_last, tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    assert signal.getsignal(signal.SIGINT) is user_handler  # Ctrl-C is the user's again


# -- periodic checkpoints and kills during a write
def test_last_ckpt_is_written_every_n_steps_and_at_the_final_step(make_cfg, tmp_path):
    record = Record()
    cfg = make_cfg(
        "mtp2",
        ["trainer.max_steps=7", "trainer.limit_val_batches=0", "callbacks.model_checkpoint.every_n_train_steps=3"],
    )
    train(cfg, [record])
    assert record.saved_at == [3, 6, 7]
    assert read_checkpoint(last_ckpt(cfg))["global_step"] == 7


@pytest.mark.slow
def test_a_sigkill_during_a_checkpoint_write_leaves_the_previous_one_loadable(corpus_dir, shared_cache, tmp_path):
    """The second save of last.ckpt hangs half-written; SIGKILL then. last.ckpt is still the first save, whole; the
    torn temporary file is never read and goes with the next save."""
    marker = tmp_path / "stalled"
    command = [
        sys.executable,
        str(ROOT / "scripts" / "pretrain.py"),
        *tiny_data(corpus_dir, shared_cache),
        "model=mtp2",
        "trainer.max_steps=20",
        "trainer.limit_val_batches=0",
        "trainer.accelerator=cpu",
        "trainer.enable_progress_bar=false",
        "callbacks.model_checkpoint.every_n_train_steps=2",
        "+callbacks.stall._target_=tests.batch_recorder.StallSave",
        f"+callbacks.stall.marker={marker}",
        f"paths.log_dir={tmp_path / 'logs'}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
        time.sleep(0.05)
    process.kill()
    process.wait(timeout=60)
    folder = tmp_path / "run" / "checkpoints"
    torn = list(folder.glob(".last.ckpt.*.tmp"))
    assert len(torn) == 1 and torn[0].stat().st_size > 0
    assert read_checkpoint(folder / "last.ckpt")["global_step"] == 2
    from mtp.checkpoint.load import load_checkpoint

    assert load_checkpoint(folder / "last.ckpt").global_step == 2
    # resuming from it works, and the next save clears the torn file
    from mtp.checkpoint.save import AtomicCheckpointIO

    AtomicCheckpointIO().save_checkpoint(read_checkpoint(folder / "last.ckpt"), folder / "last.ckpt")
    assert not list(folder.glob(".last.ckpt.*.tmp"))


def test_a_full_disk_during_a_checkpoint_write_is_one_sentence_and_keeps_the_previous_one(make_cfg, monkeypatch):
    import mtp.checkpoint.save

    real_save, calls = torch.save, []

    def fills_the_disk(obj, f, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            return real_save(obj, f, *args, **kwargs)
        f.write(b"x" * 1000)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(mtp.checkpoint.save.torch, "save", fills_the_disk)
    cfg = make_cfg(
        "mtp2",
        ["trainer.max_steps=6", "trainer.limit_val_batches=0", "callbacks.model_checkpoint.every_n_train_steps=2"],
    )
    last = last_ckpt(cfg)
    with pytest.raises(UserError) as error:
        train(cfg)
    assert str(error.value) == (
        f"could not write checkpoint {last} (No space left on device); free space there or point paths.output_dir "
        "(hydra.run.dir) at a writable disk, then resume from the last checkpoint."
    )
    monkeypatch.undo()
    assert read_checkpoint(last)["global_step"] == 2
    assert sorted(p.name for p in last.parent.iterdir()) == ["last.ckpt"]


# -- non-finite losses and gradients
class PoisonStep(L.Callback):
    """Makes the loss (or one gradient) of the given training steps non-finite."""

    def __init__(self, steps: set[int], where: str = "loss") -> None:
        self.steps, self.where = steps, where
        self.before: dict[str, torch.Tensor] | None = None
        self.after: dict[str, torch.Tensor] | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        step = trainer.global_step + 1
        if step in self.steps:
            self.before = snapshot(trainer, pl_module)
            if self.where == "loss":
                real = pl_module.training_step

                def poisoned(*args, **kwargs):
                    pl_module.training_step = real
                    return real(*args, **kwargs) * float("nan")

                pl_module.training_step = poisoned

    def on_after_backward(self, trainer, pl_module) -> None:
        if self.where == "gradient" and trainer.global_step + 1 in self.steps:
            next(pl_module.parameters()).grad[0, 0] = float("inf")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step in self.steps:
            self.after = snapshot(trainer, pl_module)


def snapshot(trainer, pl_module) -> dict[str, torch.Tensor]:
    """The weights and AdamW's moments and step counts."""
    state = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
    for i, moments in trainer.optimizers[0].state_dict()["state"].items():
        state.update({f"optimizer.{i}.{k}": v.clone() for k, v in moments.items()})
    return state


@pytest.mark.parametrize(
    ("where", "what"),
    [("loss", "the loss was nan and the gradient norm nan"), ("gradient", "the gradient norm inf")],
    ids=["loss", "gradient"],
)
def test_a_non_finite_step_stops_the_run_naming_it_and_the_last_good_checkpoint(make_cfg, where, what):
    cfg = make_cfg(
        "mtp2",
        ["trainer.max_steps=8", "trainer.limit_val_batches=0", "callbacks.model_checkpoint.every_n_train_steps=2"],
    )
    poison = PoisonStep({5}, where)
    with pytest.raises(UserError) as error:
        train(cfg, [poison])
    last = last_ckpt(cfg)
    message = str(error.value)
    assert message.startswith("training stopped at step 5: ")
    assert what in message
    assert message.endswith(
        f"the last good checkpoint is {last}; resume from it with ckpt_path={last} and lower optim.lr, raise "
        "optim.warmup_steps or set skip_nonfinite=N to skip up to N such batches."
    )
    saved = read_checkpoint(last)
    assert saved["global_step"] == 4
    assert all(torch.isfinite(t).all() for t in saved["state_dict"].values())


def test_skip_nonfinite_drops_the_bad_update_and_says_so_then_stops_at_the_next(make_cfg, caplog):
    cfg = make_cfg("mtp2", ["trainer.max_steps=8", "trainer.limit_val_batches=0", "skip_nonfinite=1"])
    poison = PoisonStep({3})
    with caplog.at_level(logging.WARNING, logger="mtp.training.callbacks"):
        train(cfg, [poison])
    assert (
        "step 3: the loss was nan and the gradient norm nan; skipped this batch (1 of skip_nonfinite=1)." in caplog.text
    )
    for name, tensor in poison.before.items():  # the poisoned step changed nothing: weights, nor AdamW's moments
        assert torch.equal(poison.after[name], tensor), name
    final = read_checkpoint(last_ckpt(cfg))
    assert final["global_step"] == 8 and all(torch.isfinite(t).all() for t in final["state_dict"].values())

    cfg = make_cfg("mtp2", ["trainer.max_steps=8", "trainer.limit_val_batches=0", "skip_nonfinite=1"])
    with open_dict(cfg):
        cfg.paths.output_dir += "-twice"
    with pytest.raises(UserError, match=r"^training stopped at step 6: .*\(skip_nonfinite=1 were all used\)\.$"):
        train(cfg, [PoisonStep({3, 6})])


def test_bad_settings_are_one_sentence(make_cfg):
    with pytest.raises(UserError, match=r"^skip_nonfinite=-1 must be 0 \(stop at the first non-finite loss\)"):
        train(make_cfg("mtp2", ["skip_nonfinite=-1"]))
    with pytest.raises(UserError, match=r"^callbacks.model_checkpoint.every_n_train_steps=-2 must be 0 \(off\)"):
        train(make_cfg("mtp2", ["callbacks.model_checkpoint.every_n_train_steps=-2"]))
    assert NonFiniteGuard().skip == 0 and ResumableCheckpoint().last_every_n_steps == 0


def test_a_failed_write_of_the_start_tokenizer_is_one_sentence_and_leaves_nothing(tmp_path, monkeypatch):
    from mtp.training.train import save_tokenizer

    def full(self, *args, **kwargs):
        Path.write_bytes(self, b"{")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(UserError, match=r"^could not write the data cache at .*tokenizer-[0-9a-f]{16}\.json \(No"):
        save_tokenizer('{"model": {}}', str(tmp_path / "cache"))
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_resumed_run_names_the_checkpoint_it_resumed_from_until_it_writes_one(make_cfg, tmp_path):
    first = run_dir_cfg(make_cfg, tmp_path, "first", ["trainer.max_steps=2", *NO_VALIDATION])
    train(first)
    resumed = [
        "trainer.max_steps=6",
        *NO_VALIDATION,
        "callbacks.model_checkpoint.every_n_train_steps=0",
        f"ckpt_path={last_ckpt(first)}",
    ]
    with pytest.raises(UserError, match=f"the last good checkpoint is {last_ckpt(first)}; resume from it"):
        train(run_dir_cfg(make_cfg, tmp_path, "resumed", resumed), [PoisonStep({4})])
