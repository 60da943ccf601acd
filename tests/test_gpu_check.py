"""The GPU check kit (scripts/gpu_check.py, a tool of the repository beside the package) on CPU: its steps checked
before anything runs, its limits, its figures and summary lines, and its plumbing in smoke mode."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mtp.errors import UserError
from tests.test_decode_scripts import run_env

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gpu_check)


def test_gpu_check_steps_are_checked_before_anything_runs(tmp_path):
    with pytest.raises(
        UserError, match="--steps p3: name steps among tests,p1,p2,pretrain,decode,compiled,heads,eagle3,paper,tp"
    ):
        gpu_check.parse_args(["--smoke", "--steps", "tests,p3"])
    with pytest.raises(UserError, match="decodes without training a checkpoint; add pretrain to --steps or pass"):
        gpu_check.parse_args(["--smoke", "--steps", "tests,decode"])
    assert gpu_check.parse_args(["--smoke", "--steps", " p2 ,tests"]).steps == ["p2", "tests"]
    every = ["tests", "p1", "p2", "pretrain", "decode", "compiled", "heads", "eagle3", "paper", "tp"]
    assert gpu_check.parse_args(["--smoke"]).steps == every
    with pytest.raises(UserError, match="--smoke --steps heads starts from the kit's trained checkpoint; add pretrain"):
        gpu_check.parse_args(["--smoke", "--steps", "heads"])
    with pytest.raises(UserError, match="--heads-model .*missing.gguf does not exist; pass a GGUF file"):
        gpu_check.parse_args(["--smoke", "--steps", "heads", "--heads-model", str(tmp_path / "missing.gguf")])
    with pytest.raises(UserError, match="--train-minutes 0: give a positive number of minutes, or drop it"):
        gpu_check.parse_args(["--smoke", "--steps", "p1", "--train-minutes", "0"])
    with pytest.raises(UserError, match="--paper-minutes -1: give a positive number of minutes, or drop it"):
        gpu_check.parse_args(["--smoke", "--steps", "paper", "--paper-minutes", "-1"])


def test_gpu_check_fits_the_heads_recipes_to_a_lease():
    assert gpu_check.recipe_limits(gpu_check.parse_args(["--smoke", "--steps", "p1"])) == []
    limits = gpu_check.recipe_limits(
        gpu_check.parse_args(["--smoke", "--steps", "p1", "--train-minutes", "75.5", "--weaker-sandbox"])
    )
    assert limits == ["bench_decode.weaker_sandbox=true", "+trainer.max_time=00:01:15:30"]


def test_gpu_check_runs_the_papers_10m_polynomial_sweep_within_its_minutes(tmp_path, monkeypatch):
    """The paper step: the 10M sweep, n=1,2,4 x seeds 0,1,2 on the GPU, into the kit's folder (a rerun continues it),
    each run's training a ninth of --paper-minutes; smoke: two tiny runs on the CPU."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # what the step asks of a GPU machine
    sweep = gpu_check.paper_sweep(gpu_check.parse_args(["--steps", "paper", "--paper-minutes", "45"]), tmp_path / "p")
    assert sweep == [
        "experiment=paper_polynomial", "trainer=gpu", "trainer.enable_progress_bar=false", "size=paper_10m",
        "model=mtp1,mtp2,mtp4", "seed=0,1,2", f"hydra.sweep.dir={tmp_path / 'p'}", "+trainer.max_time=00:00:05:00",
    ]  # fmt: skip
    unlimited = gpu_check.paper_sweep(gpu_check.parse_args(["--steps", "paper"]), tmp_path)
    assert not [override for override in unlimited if "max_time" in override]
    smoke = gpu_check.paper_sweep(gpu_check.parse_args(["--smoke", "--steps", "paper"]), tmp_path)
    assert {"size=tiny", "model=mtp1,mtp2", "seed=0", "trainer.accelerator=cpu", "paths.results_dir=null"} <= set(smoke)
    assert gpu_check.paper_figures(tmp_path / "absent", tmp_path / "paper.md") == "no run finished (see paper.txt)"


def test_gpu_check_reports_each_drafts_acceptance(tmp_path):
    rows = [
        {
            "mode": "greedy",
            "batch_size": 1,
            "method": "chain",
            "heads": k,
            "tokens_per_forward": t,
            "speedup": s,
            "acceptance": a,
        }
        for k, t, s, a in ((1, 1.0, 1.0, []), (2, 1.5, 1.1, [0.5]), (3, 1.7, 1.2, [0.49, 0.22]))
    ]
    rows.append({**rows[2], "mode": "sampling", "heads": 4, "tokens_per_forward": 9.0})  # not greedy: not read
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"results": rows}))
    assert gpu_check.heads_figures(results, 2.0, "eagle3.txt") == (
        "1.70 tokens per forward at k=3 (missed; target >= 2.0), 1.20x mtp autoregressive (k=2 1.50 tokens/forward, "
        "acceptance 0.50; k=3 1.70 tokens/forward, acceptance 0.49, 0.22)"
    )
    assert (
        gpu_check.heads_figures(tmp_path / "absent.json", 2.0, "eagle3.txt")
        == "not measured (the run failed; see eagle3.txt)"
    )


@pytest.mark.slow
def test_gpu_check_runs_only_the_steps_asked_for(tmp_path):
    """A device lease may not hold every step: --steps p1 runs P1 alone, and the summary says the rest did not run."""
    out = tmp_path / "kit"
    (out / "bench_train_time").mkdir(parents=True)  # an earlier run's P2 is not reported as this run's
    (out / "bench_train_time" / "results.json").write_text("{}")
    command = [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--smoke", "--steps", "p1", "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, env=run_env(), timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = (out / "summary.md").read_text()
    assert "gpu tests: not run (--steps)" in summary and "decoding benchmark: not run (--steps)" in summary
    assert re.search(r"at V=32k, bf16: \d+\.\d{3}x \((met|missed)", summary)  # toy sizes: any ratio
    assert "trunk-dominated size: not run (--steps)" in summary
    assert "Seconds per step: p1 " in summary


def test_gpu_check_summary_quotes_the_default_runs_data_and_validation(tmp_path):
    """Its corpus is the machine's own standard library, of a size that differs between Python installs."""
    log = tmp_path / "pretrain.txt"
    log.write_text(
        "Seed set to 1337\nthis Python's standard library (/usr/lib/python3.12) has no test suite, so ...\n"
        "packed train: 537 documents into 2591848 tokens\n"
        "data: 10124 training and 892 validation windows of 260 tokens\nnoise\n"
        "final validation: val/loss_head1=6.522, val/ppl=679.8\n"
    )
    assert gpu_check.training_lines(log) == [
        "this Python's standard library (/usr/lib/python3.12) has no test suite, so ...",
        "packed train: 537 documents into 2591848 tokens",
        "data: 10124 training and 892 validation windows of 260 tokens",
        "final validation: val/loss_head1=6.522, val/ppl=679.8",
    ]
    assert gpu_check.training_lines(tmp_path / "absent.txt") == []


@pytest.mark.slow
def test_gpu_check_kit_runs_every_step_in_smoke_mode(tiny_checkpoints, tmp_path):
    """scripts/gpu_check.py --smoke: the kit's plumbing on CPU (the gpu tests skip, the benchmarks run at toy sizes)."""
    out = tmp_path / "kit"
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--smoke", "--out", str(out)]
        + ["--checkpoint", str(tiny_checkpoints["mtp4"])],
        capture_output=True,
        text=True,
        env=run_env(),
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = (out / "summary.md").read_text()
    assert "gpu tests: skipped (no CUDA device)" in summary or "gpu tests: passed" in summary
    assert summary.count("x (met") + summary.count("x (missed") == 4  # P1, P2, decoding, TP (compiled: not in smoke)
    assert "Seconds per step: pytest " in summary and " bench_decode " in summary and " heads " in summary
    for table in ("bench_train_memory/results.md", "bench_train_time/results.md", "bench_decode/results.md"):
        assert (out / table).is_file()
    # the heads recipe from the kit's model at toy sizes: distilled, trained, benchmarked on HumanEval
    assert re.search(
        r"heads recipe .*: \d+\.\d\d tokens per forward at k=4 \((met|missed).*x mtp autoregressive", summary
    )
    assert (out / "heads" / "distilled" / "settings.json").is_file()
    assert "EAGLE-3 recipe (experiment=pretrained_heads_eagle3_gpu), HumanEval, greedy, batch 1: not run (a smoke" in (
        summary
    )
    # the paper's sweep at toy size, and its page beside the summary
    assert "scored per operation count: paper.md (2 of 2 runs scored, at step 2)" in summary
    assert (out / "paper.md").is_file() and (out / "paper.png").is_file()
    # tensor parallelism on two CPU processes: the split run and the memory per process against one process's
    assert re.search(r"TP=2 / TP=1 at V=128k: trainer=tp run passed; \d\.\d{3}x \((met|missed)", summary)
    assert (out / "bench_train_tp" / "results.md").is_file()
