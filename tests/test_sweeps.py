"""Sweeps of the paper's experiments: each run scores itself, a rerun of a sweep continues it (skips the finished jobs,
resumes the others), and a sweep folder becomes a page with the seeds' spread."""

import logging
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from mtp.commands import eval_task
from mtp.commands.pretrain import SWEEP_JOB, continue_sweep_job, flags, job_folder
from mtp.errors import UserError
from tests.conftest import compose_train


def test_a_job_folder_is_named_by_its_settings_model_size_and_seed_first():
    assert job_folder("data.seq_len=64,model=mtp2,seed=1") == "model=mtp2,seed=1,data.seq_len=64"
    assert job_folder("eval_task.ops=[1,6],seed=0,size=paper_3m") == "size=paper_3m,seed=0,eval_task.ops=[1,6]"
    assert job_folder("data.source.paths=[/a/b/*.txt],model=mtp1") == "model=mtp1,data.source.paths=[_a_b_*.txt]"
    assert job_folder("") == "defaults"
    long, other = job_folder("model=mtp1,data.cache_dir=" + "x" * 300), job_folder("model=mtp1,data.cache_dir=" + "y")
    assert len(long) == 120 and long.startswith("model=mtp1,data.cache_dir=xxx") and long != other
    assert job_folder("model=mtp1,data.cache_dir=" + "x" * 300) == long  # the same settings, the same folder


@pytest.mark.parametrize(("experiment", "expected"), [("paper_polynomial", ["--ops", "1-10", "--problems", "2000"]),
                                                      ("paper_induction", ["--batch-size", "32"])])  # fmt: skip
def test_task_experiments_score_their_final_checkpoint_and_sweep_into_a_stable_folder(experiment, expected):
    cfg = compose_train([f"experiment={experiment}"])
    assert flags(cfg.eval_task, eval_task.build_parser()) == expected
    sweep = OmegaConf.to_container(cfg.hydra.sweep)  # unresolved: the folder names resolve in a running sweep
    assert sweep == {
        "dir": "${paths.log_dir}/${task_name}/sweeps/${hydra.runtime.choices.experiment}",
        "subdir": "${job_folder:${hydra.job.override_dirname}}",
    }
    assert cfg.hydra.runtime.choices.experiment == experiment
    assert "experiment" in cfg.hydra.job.config.override_dirname.exclude_keys
    assert compose_train(["experiment=paper_polynomial", "data.source.eval_problems=300"]).eval_task.problems == 300
    assert compose_train([]).eval_task is None  # other runs score nothing after training


def test_a_bad_evaluation_setting_is_caught_before_training():
    with pytest.raises(UserError, match="--ops 11 is outside the operation counts the generator supports"):
        eval_task.checked_args(["last.ckpt", "--ops", "11"])


def fake_checkpoint(path: Path, step: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"mtp": {"format": 1}, "state_dict": {}, "global_step": step}, path)


def test_a_rerun_sweep_job_skips_resumes_or_starts_as_its_folder_says(tmp_path, caplog):
    cfg = OmegaConf.create({"ckpt_path": None, "trainer": {"max_steps": 6}})
    job = tmp_path / "model=mtp1,seed=0"
    caplog.set_level(logging.INFO, "mtp.commands.pretrain")
    # a fresh folder: trains, after recording its settings
    assert continue_sweep_job(cfg, job, "model=mtp1,seed=0", True) == (cfg, True)
    assert OmegaConf.load(job / SWEEP_JOB).settings == "model=mtp1,seed=0"
    # stopped at step 2 of 6: resumes from its last.ckpt
    fake_checkpoint(job / "checkpoints" / "last.ckpt", 2)
    resumed, trains = continue_sweep_job(cfg, job, "model=mtp1,seed=0", True)
    assert trains and resumed.ckpt_path == str(job / "checkpoints" / "last.ckpt") and cfg.ckpt_path is None
    assert "sweep job model=mtp1,seed=0: resuming from its checkpoints/last.ckpt (step 2)" in caplog.text
    # trained to the end, stopped while scoring: scores, without training again
    fake_checkpoint(job / "checkpoints" / "last.ckpt", 6)
    assert continue_sweep_job(cfg, job, "model=mtp1,seed=0", True) == (cfg, False)
    assert "trained to step 6 earlier (checkpoints/last.ckpt); going on from there" in caplog.text
    # scored: skipped
    (job / "eval_task").mkdir()
    (job / "eval_task" / "results.json").write_text("{}")
    assert continue_sweep_job(cfg, job, "model=mtp1,seed=0", True) == (None, False)
    assert "finished earlier (its eval_task/results.json is there); skipping it" in caplog.text
    # a folder of other settings, or of a run no sweep recorded: refused
    with pytest.raises(UserError, match=r"holds a sweep job of other settings \(model=mtp1,seed=0, not model=mtp2\)"):
        continue_sweep_job(cfg, job, "model=mtp2", True)
    (job / SWEEP_JOB).unlink()
    with pytest.raises(UserError, match="holds checkpoints that no sweep job recorded; give this sweep a folder"):
        continue_sweep_job(cfg, job, "model=mtp1,seed=0", True)
