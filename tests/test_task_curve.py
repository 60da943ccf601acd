"""callbacks=task_curve: a run's task metric scored while it trains. It logs at the asked steps (the first, every N,
the last), its points equal what mtp eval-task scores on the checkpoint written at the same step, a resumed run
continues its curve, and a run whose data has no task metric (or a bad setting) is refused before any data is
prepared."""

import json
from pathlib import Path

import pytest
import torch
from lightning.pytorch.loggers import Logger
from omegaconf import open_dict

from mtp.checkpoint.format import task_curve
from mtp.commands import eval_task
from mtp.errors import UserError
from mtp.training.callbacks import TaskCurve
from mtp.training.train import build, train
from tests.conftest import compose_in


class Recorder(Logger):
    """A logger that keeps every (step, metrics) it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[int, dict]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.logged.append((step, dict(metrics)))

    def task_steps(self) -> list[int]:
        return [step for step, metrics in self.logged if any(name.startswith("task/") for name in metrics)]


INDUCTION = [
    "experiment=paper_induction", "model=mtp2", "size=tiny", "data.source.documents=300", "data.seq_len=64",
    "data.batch_size=4", "trainer.accelerator=cpu", "trainer.val_check_interval=5", "trainer.limit_val_batches=1",
    "trainer.enable_progress_bar=false", "optim.warmup_steps=1", "callbacks.decode_probe.prompts=0",
    "callbacks.task_curve.every_n_steps=2", "callbacks.task_curve.problems=12",
]  # fmt: skip
POLYNOMIAL = [
    "experiment=paper_polynomial", "size=tiny", "data.source.problems=400", "data.seq_len=64", "data.batch_size=4",
    "trainer.accelerator=cpu", "trainer.val_check_interval=5", "trainer.limit_val_batches=1",
    "trainer.enable_progress_bar=false", "optim.warmup_steps=1", "callbacks.task_curve.every_n_steps=2",
    "callbacks.task_curve.problems=4", "callbacks.task_curve.ops=1-2",
]  # fmt: skip


def run_with_recorder(overrides: list[str], tmp_path: Path, cache: Path) -> tuple[Recorder, Path]:
    """Train as configured with a recording logger beside TensorBoard; the run's last.ckpt."""
    cfg = compose_in([*overrides, f"data.cache_dir={cache}"], tmp_path)
    recorder = Recorder()
    datamodule, module, trainer = build(cfg)
    trainer.loggers = [*trainer.loggers, recorder]
    trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"), weights_only=True)
    return recorder, Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"


@pytest.mark.parametrize("task", ["induction", "polynomial"])
def test_the_curve_logs_at_the_asked_steps_and_equals_the_evaluation_of_the_same_checkpoint(
    task, tmp_path, shared_cache
):
    overrides = (INDUCTION if task == "induction" else POLYNOMIAL) + ["trainer.max_steps=5"]
    recorder, checkpoint = run_with_recorder(overrides, tmp_path, shared_cache)
    assert recorder.task_steps() == [0, 2, 4, 5]  # the first, every 2nd, and the last
    names = {name for _, metrics in recorder.logged for name in metrics if name.startswith("task/")}
    assert names == ({"task/token_second", "task/token_first"} if task == "induction" else {"task/ops_1", "task/ops_2"})
    points = task_curve(torch.load(checkpoint, weights_only=True))
    assert [(p["step"], p["tokens"]) for p in points] == [(s, s * 4 * 64) for s in (0, 2, 4, 5)]
    for step, metrics in recorder.logged:  # what was logged is what was kept
        point = next((p for p in points if p["step"] == step), None)
        if point is not None and any(name.startswith("task/") for name in metrics):
            assert sorted(metrics.values()) == sorted(row["accuracy"] for row in point["rows"])
    out = tmp_path / "eval"
    flags = ["--problems", "12"] if task == "induction" else ["--problems", "4", "--ops", "1-2"]
    eval_task.main([str(checkpoint), *flags, "--out", str(out)])
    results = json.loads((out / "results.json").read_text())
    assert results["rows"] == points[-1]["rows"]  # the evaluation command's score of the step-5 checkpoint
    assert results["curve"] == points and results["tokens"] == 5 * 4 * 64 and results["train_seconds"] > 0


def test_a_resumed_run_continues_its_curve(tmp_path, shared_cache):
    first, checkpoint = run_with_recorder([*INDUCTION, "trainer.max_steps=3"], tmp_path, shared_cache)
    assert first.task_steps() == [0, 2, 3]
    resumed = [*INDUCTION, "trainer.max_steps=6", f"ckpt_path={checkpoint}"]
    second, checkpoint = run_with_recorder(resumed, tmp_path, shared_cache)
    assert second.task_steps() == [4, 6]  # nothing scored again at step 3
    assert [p["step"] for p in task_curve(torch.load(checkpoint, weights_only=True))] == [0, 2, 3, 4, 6]


def test_a_run_whose_data_has_no_task_metric_is_refused_before_any_data_is_prepared(tmp_path):
    cache = tmp_path / "cache"
    cfg = compose_in(["callbacks=task_curve", "size=tiny", f"data.cache_dir={cache}"], tmp_path)
    with pytest.raises(UserError) as caught:
        train(cfg)
    message = str(caught.value)
    assert message.startswith("callbacks=task_curve scores the task of the training data, and data.source.kind=stdlib")
    assert "train on data=polynomial or data=induction" in message and message.count(". ") == 0
    assert not cache.exists() and not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize(
    "setting, message",
    [
        ("callbacks.task_curve.every_n_steps=0", "^callbacks.task_curve.every_n_steps=0 must be at least 1.$"),
        ("callbacks.task_curve.problems=0", "^callbacks.task_curve.problems=0 must be at least 1.$"),
        ("callbacks.task_curve.ops=0-3", "^callbacks.task_curve.ops=0 is outside the operation counts"),
    ],
)
def test_bad_curve_settings_are_one_sentence(setting, message, tmp_path):
    cfg = compose_in(["experiment=paper_polynomial", "size=tiny", setting], tmp_path)
    with pytest.raises(UserError, match=message):
        build(cfg)


def test_more_problems_than_the_evaluation_sets_hold_are_refused_before_training(tmp_path, shared_cache):
    overrides = [*POLYNOMIAL, "trainer.max_steps=2", "callbacks.task_curve.problems=500",
                 "data.source.eval_problems=100", f"data.cache_dir={shared_cache}"]  # fmt: skip
    with pytest.raises(UserError, match=r"^callbacks.task_curve.problems=500 is more than the 100 problems per count"):
        train(compose_in(overrides, tmp_path))
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_sharded_model_is_not_scored(monkeypatch):
    """Under FSDP2 no process holds the whole model: the callback scores nothing rather than fail."""
    from mtp.training import callbacks

    curve = TaskCurve("induction", every_n_steps=1, problems=1)
    monkeypatch.setattr(callbacks, "is_sharded", lambda model: True)

    class Trainer:
        global_step, is_global_zero, loggers = 3, True, []

    class Module:
        model = None

    curve.score(Trainer(), Module())
    assert curve.points == []


def test_the_curve_node_composes_into_both_task_experiments():
    from tests.conftest import compose_train

    for experiment in ("paper_induction", "paper_polynomial"):
        cfg = compose_train([f"experiment={experiment}"])
        with open_dict(cfg):
            node = cfg.callbacks.task_curve
        assert node._target_ == "mtp.training.callbacks.TaskCurve" and node.task == cfg.data.source.kind
    assert "task_curve" not in compose_train([]).callbacks  # opt-in
