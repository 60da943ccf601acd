"""scripts/pretrain.py as a user runs it: bad input gets one clear sentence, no traceback, no leftovers."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pretrain(*overrides: str, tmp_path: Path, multirun: bool = False) -> subprocess.CompletedProcess:
    command = [sys.executable, str(ROOT / "scripts" / "pretrain.py"), *(["-m"] if multirun else [])]
    command += [f"paths.log_dir={tmp_path / 'logs'}", *overrides]
    # this tree's mtp and tests (a run may name tests.batch_recorder as a callback), whatever else is installed
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)


def tiny_data(corpus_dir: Path, cache: Path) -> list[str]:
    return [
        "size=tiny",
        "model.vocab_size=512",
        "data=files",
        f"data.source.paths=[{corpus_dir}/*.txt]",
        f"data.cache_dir={cache}",
        "data.seq_len=32",
        "data.batch_size=4",
        "data.val_fraction=0.1",
    ]


def assert_one_clear_error(result: subprocess.CompletedProcess, message: str) -> None:
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model=mtp5"], "error: model=mtp5 names no config in conf/model/; choose one of byte1, byte8, "),
        pytest.param(  # each of these starts a process (~8 s): the everyday suite keeps the first
            ["model.dmodel=3"],
            "error: model.dmodel is not a setting of the config (did you mean model.d_model?); ",
            marks=pytest.mark.slow,
        ),
        pytest.param(  # a third process start for the same check: with the slow tests
            ["-m", "model=mtp1,mtp5"], "error: model=mtp5 names no config in conf/model/;", marks=pytest.mark.slow
        ),
        pytest.param(
            ["logger=null"],
            "error: logger=null cannot turn a config group off; write '~logger' instead",
            marks=pytest.mark.slow,
        ),
        pytest.param(["model.n_future=12"], "error: model.n_future=12 leaves no trunk layer", marks=pytest.mark.slow),
        pytest.param(
            ["loss.loss_weights=[1.0,0.5]"],
            "error: loss.loss_weights has 2 entries but model.n_future=4; give one weight per head.",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_bad_config_is_one_sentence(overrides, message, tmp_path):
    """Hydra's config errors too: exit status 2 and one line, as every other bad input, and no folder left."""
    multirun = overrides[0] == "-m"  # a sweep writes its folder before composing its jobs
    result = pretrain(*overrides[multirun:], tmp_path=tmp_path, multirun=multirun)
    assert_one_clear_error(result, message)
    assert result.returncode == 2 and "HYDRA_FULL_ERROR" not in result.stderr, result.stderr
    assert len([line for line in result.stderr.splitlines() if line.startswith("error: ")]) == 1
    assert not [p for p in (tmp_path / "logs").rglob("*") if p.is_file()]


@pytest.mark.slow
def test_a_run_files_its_messages_in_its_log_and_prints_no_library_notices(corpus_dir, tmp_path):
    """The run's messages (preparing the data, the final report) show on the console, once, and go to the run
    folder's pretrain.log; Lightning's litlogger tip and torch's LeafSpec deprecation are not shown."""
    overrides = [*tiny_data(corpus_dir, tmp_path / "cache"), "debug=fdr", "trainer.detect_anomaly=false"]
    result = pretrain(*overrides, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    (log_file,) = (tmp_path / "logs" / "debug" / "runs").glob("*/pretrain.log")
    logged = log_file.read_text()
    said_all = ("training a BPE tokenizer of", "packed train: ", "data cached at ", "final validation: val/",
                "memory: training (data, model, trunk cache, steps): ")  # fmt: skip
    for said in said_all:
        assert said in logged and said in result.stdout, said
    assert "[mtp.data.packing][INFO] - packed train: " in logged  # the file keeps time, logger and level
    assert "litlogger" not in result.stdout + result.stderr and "LeafSpec" not in result.stdout + result.stderr
    # each of Lightning's lines once (not also through its own handler), no download bar over local files
    printed = result.stdout + result.stderr
    assert printed.count("Seed set to") == 1 and printed.count("Trainable params") == 1, printed[-3000:]
    assert "Downloading data" not in printed


@pytest.mark.slow
def test_bad_data_path_and_checkpoint(corpus_dir, shared_cache, tmp_path):
    overrides = tiny_data(corpus_dir, shared_cache)
    result = pretrain(*overrides, f"data.source.paths=[{tmp_path}/missing/*.txt]", tmp_path=tmp_path)
    assert_one_clear_error(result, "matches no file")
    assert result.returncode == 2
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").rglob("runs/*"))
    result = pretrain(*overrides, f"ckpt_path={tmp_path}/none.ckpt", tmp_path=tmp_path)
    assert_one_clear_error(result, "does not exist")


@pytest.mark.slow
def test_run_then_resume_from_the_command_line(corpus_dir, shared_cache, tmp_path):
    overrides = [*tiny_data(corpus_dir, shared_cache), "trainer.max_steps=6", "trainer.val_check_interval=3"]
    first = pretrain(*overrides, tmp_path=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    checkpoint = next(line.split(": ", 1)[1] for line in first.stdout.splitlines() if line.startswith("checkpoint: "))
    assert Path(checkpoint).is_file()
    assert "tensorboard --logdir" in first.stdout and "val/expected_tokens_per_forward=" in first.stdout
    resumed = pretrain(*overrides, "trainer.max_steps=9", f"ckpt_path={checkpoint}", tmp_path=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "Restoring states from the checkpoint" in resumed.stderr + resumed.stdout


@pytest.mark.slow
def test_sweep_runs_side_by_side(corpus_dir, shared_cache, tmp_path):
    overrides = [*tiny_data(corpus_dir, shared_cache), "trainer.max_steps=2", "trainer.val_check_interval=2"]
    result = pretrain(*overrides, "model=mtp1,mtp2", tmp_path=tmp_path, multirun=True)
    assert result.returncode == 0, result.stderr[-2000:]
    sweeps = list((tmp_path / "logs" / "pretrain" / "multiruns").iterdir())
    assert len(sweeps) == 1
    runs = sorted(p.name for p in sweeps[0].iterdir() if p.is_dir())
    assert runs == ["0_mtp1", "1_mtp2"]
    for run in runs:
        assert list((sweeps[0] / run / "tensorboard").glob("events.out.tfevents.*"))
