"""Sweeps beyond one process: Hydra's submitit launcher as hydra/launcher=local (each job in a process of its own, at
most max_parallel at once) and hydra/launcher=slurm (its settings), a sweep that finishes and is paged, a job killed
mid-run that a rerun resumes, and the one sentence a missing plugin gets."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mtp.commands import pretrain
from mtp.errors import UserError
from tests.conftest import ROOT, compose_train

TINY_SWEEP = [
    "experiment=paper_polynomial", "model=mtp1,mtp2", "seed=0", "size=tiny", "data.source.problems=600",
    "data.seq_len=64", "data.batch_size=4", "data.val_fraction=0.1", "trainer.accelerator=cpu",
    "trainer.val_check_interval=2", "trainer.limit_val_batches=1", "trainer.enable_progress_bar=false",
    "optim.warmup_steps=1", "eval_task.problems=2", "eval_task.ops=[1,6]", "callbacks.task_curve.problems=2",
    "hydra/launcher=local",
]  # fmt: skip


def test_a_launcher_without_its_plugin_is_one_sentence_naming_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "hydra_plugins.hydra_submitit_launcher", None)  # import fails
    for launcher in ("local", "slurm"):
        with pytest.raises(UserError) as caught:
            pretrain.check_launcher_installed(["-m", f"hydra/launcher={launcher}", "model=mtp1,mtp2"])
        message = str(caught.value)
        assert message.startswith(f"hydra/launcher={launcher} runs the sweep's jobs through Hydra's submitit launcher")
        assert 'pip install -e ".[cluster]"' in message and message.count(". ") == 0
    pretrain.check_launcher_installed(["-m", "model=mtp1,mtp2"])  # Hydra's own launcher needs nothing


def test_the_launchers_compose_with_their_settings():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    local = compose_train(["hydra/launcher=local", "hydra.launcher.max_parallel=2"]).hydra.launcher
    assert local._target_ == "hydra_plugins.mtp_launchers.local.LocalLauncher" and local.max_parallel == 2
    settings = ["hydra/launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.account=lab",
                "hydra.launcher.gpus_per_node=8", "hydra.launcher.nodes=2",
                "hydra.launcher.timeout_min=600"]  # fmt: skip
    slurm = compose_train(settings).hydra.launcher
    assert slurm._target_.endswith("submitit_launcher.SlurmLauncher")
    assert (slurm.partition, slurm.account, slurm.gpus_per_node, slurm.tasks_per_node) == ("gpu", "lab", 8, 8)
    assert (slurm.nodes, slurm.timeout_min) == (2, 600)


def test_a_bad_max_parallel_is_one_sentence():
    local = pytest.importorskip("hydra_plugins.mtp_launchers.local")
    with pytest.raises(UserError, match=r"^hydra.launcher.max_parallel=0 must be a whole number, at least 1.$"):
        local.LocalLauncher(max_parallel=0, submitit_folder="x")


def sweep_command(sweep: Path, cache: Path, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "scripts" / "pretrain.py"), "-m", f"paths.log_dir={sweep.parent / 'logs'}",
            f"hydra.sweep.dir={sweep}", f"paths.results_dir={sweep.parent / 'results'}", f"data.cache_dir={cache}",
            *TINY_SWEEP, *extra]  # fmt: skip


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_a_sweep_through_the_local_launcher_finishes_and_makes_its_page(tmp_path, shared_cache):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    sweep = tmp_path / "sweep"
    command = sweep_command(sweep, shared_cache, "trainer.max_steps=2", "hydra.launcher.max_parallel=2")
    result = subprocess.run(command, capture_output=True, text=True, env=environment(), timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Submitit 'local' sweep output dir" in result.stdout + result.stderr
    jobs = sorted(path for path in sweep.iterdir() if (path / ".hydra").is_dir())
    assert len(jobs) == 2 and all((job / "eval_task" / "results.json").is_file() for job in jobs)
    logs = sorted((sweep / ".submitit").glob("*/*_log.out"))
    assert len(logs) == 2  # each job ran in a process of its own
    page = tmp_path / "page.md"
    made = subprocess.run([sys.executable, str(ROOT / "scripts" / "results_page.py"), str(sweep), "--out", str(page)],
                          capture_output=True, text=True, env=environment(), timeout=300)  # fmt: skip
    assert made.returncode == 0, made.stderr[-3000:]
    assert "| tiny | 6 | out |" in page.read_text()


@pytest.mark.slow
def test_a_job_killed_mid_run_resumes_when_the_sweep_runs_again(tmp_path, shared_cache):
    """The sweep (one job at a time) is killed outright once its first job has saved a checkpoint mid-run; the same
    command then resumes that job from its last.ckpt and runs the other."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    sweep = tmp_path / "sweep"
    extra = [
        "trainer.max_steps=400",
        "callbacks.model_checkpoint.every_n_train_steps=2",
        "trainer.val_check_interval=50",
    ]
    command = sweep_command(sweep, shared_cache, *extra)
    first = subprocess.Popen(command, cwd=tmp_path, env=environment(), start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 300
    while not list(sweep.glob("model=mtp1*/checkpoints/last.ckpt")) and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)  # the sweep and every job process of its session, at once
    first.wait()
    (job,) = sweep.glob("model=mtp1*")
    assert not (job / "eval_task" / "results.json").exists()  # killed before it finished
    again = subprocess.run(command, capture_output=True, text=True, env=environment(), timeout=900, cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    logs = "\n".join(path.read_text() for path in (sweep / ".submitit").glob("*/*_log.*"))
    assert "resuming from its checkpoints/last.ckpt (step " in logs
    assert all((path / "eval_task" / "results.json").is_file() for path in sweep.glob("model=mtp*"))
