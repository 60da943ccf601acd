"""Sweeps of the paper's experiments: each run scores itself, a rerun of a sweep continues it (skips the finished jobs,
resumes the others), and a sweep folder becomes a page with the seeds' spread."""

import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf, open_dict

from mtp.benchmarks.sweep_runs import aggregate, read_summary, read_sweep, size_order, summary_job, write_summary
from mtp.benchmarks.task_sweep import sweep_provenance, sweep_tables, sweep_title
from mtp.commands import eval_task
from mtp.commands.pretrain import SWEEP_JOB, continue_sweep_job, job_folder, node_values
from mtp.errors import UserError
from tests.conftest import ROOT, compose_train


def test_a_job_folder_is_named_by_its_settings_model_size_and_seed_first():
    assert job_folder("data.seq_len=64,model=mtp2,seed=1") == "model=mtp2,seed=1,data.seq_len=64"
    assert job_folder("eval_task.ops=[1,6],seed=0,size=paper_3m") == "size=paper_3m,seed=0,eval_task.ops=[1,6]"
    assert job_folder("data.source.paths=[/a/b/*.txt],model=mtp1") == "model=mtp1,data.source.paths=[_a_b_*.txt]"
    assert job_folder("") == "defaults"
    long, other = job_folder("model=mtp1,data.cache_dir=" + "x" * 300), job_folder("model=mtp1,data.cache_dir=" + "y")
    assert len(long) == 120 and long.startswith("model=mtp1,data.cache_dir=xxx") and long != other
    assert job_folder("model=mtp1,data.cache_dir=" + "x" * 300) == long  # the same settings, the same folder


@pytest.mark.parametrize(
    ("experiment", "expected"),
    [("paper_polynomial", {"ops": list(range(1, 11)), "problems": 2000}), ("paper_induction", {"batch_size": 32})],
)
def test_task_experiments_score_their_final_checkpoint_and_sweep_into_a_stable_folder(experiment, expected):
    cfg = compose_train([f"experiment={experiment}"])
    evaluation = eval_task.settings_of_config("last.ckpt", node_values(cfg.eval_task))
    assert {name: getattr(evaluation.task, name) for name in expected} == expected
    sweep = OmegaConf.to_container(cfg.hydra.sweep)  # unresolved: the folder names resolve in a running sweep
    assert sweep == {
        "dir": "${paths.log_dir}/${task_name}/sweeps/${hydra.runtime.choices.experiment}",
        "subdir": "${job_folder:${hydra.job.override_dirname}}",
    }
    assert cfg.hydra.runtime.choices.experiment == experiment
    assert "experiment" in cfg.hydra.job.config.override_dirname.exclude_keys
    assert compose_train(["experiment=paper_polynomial", "data.source.eval_problems=300"]).eval_task.problems == 300
    assert compose_train([]).eval_task is None  # other runs score nothing after training


def test_a_list_of_operation_counts_in_the_config_reads_as_the_flag_reads_its_text():
    """``eval_task.ops=[1,6]`` (a list, as Hydra reads the override) is ``--ops 1,6``."""
    cfg = compose_train(["experiment=paper_polynomial", "eval_task.ops=[1,6]"])
    assert eval_task.settings_of_config("last.ckpt", node_values(cfg.eval_task)).task.ops == [1, 6]


def test_a_bad_evaluation_setting_is_caught_before_training():
    with pytest.raises(UserError, match="^--ops 11 is outside the operation counts the generator supports"):
        eval_task.checked_args(["last.ckpt", "--ops", "11"])
    cfg = compose_train(["experiment=paper_polynomial", "eval_task.ops=[1,11]"])  # the override names it as a key
    with pytest.raises(UserError, match="^eval_task.ops=11 is outside the operation counts the generator supports"):
        eval_task.settings_of_config("last.ckpt", node_values(cfg.eval_task))
    with pytest.raises(UserError, match="^--problems 0 must be at least 1.$"):
        eval_task.checked_args(["last.ckpt", "--problems", "0"])
    cfg = compose_train(["experiment=paper_polynomial", "eval_task.problems=0"])
    with pytest.raises(UserError, match="^eval_task.problems=0 must be at least 1.$"):
        eval_task.settings_of_config("last.ckpt", node_values(cfg.eval_task))


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


def fake_job(sweep: Path, name: str, n: int, seed: int, accuracies: dict, size: str = "paper_1m", extra=(), **more):
    """A job folder as a sweep leaves it: Hydra's record (.hydra) and, when ``accuracies`` is given, its score."""
    job = sweep / name
    (job / ".hydra").mkdir(parents=True)
    OmegaConf.save({"seed": seed, "model": {"n_future": n}}, job / ".hydra" / "config.yaml")
    exclude = ["experiment", "paths.log_dir"]
    hydra = {"runtime": {"choices": {"size": size}}, "job": {"config": {"override_dirname": {"exclude_keys": exclude}}}}
    OmegaConf.save({"hydra": hydra}, job / ".hydra" / "hydra.yaml")
    overrides = ["experiment=paper_polynomial", f"model=mtp{n}", f"seed={seed}", "paths.log_dir=/x", *extra]
    OmegaConf.save(overrides, job / ".hydra" / "overrides.yaml")
    if accuracies is None:
        return job
    task, group = ("polynomial", "ops") if "second" not in accuracies else ("induction", "token")
    rows = [{group: key, "in_domain": key in (1, 2, "second", "first"), "problems": 10, "correct": round(a * 10),
             "accuracy": a} for key, a in accuracies.items()]  # fmt: skip
    provenance = {"date": f"2026-01-0{seed + 1} 10:00 UTC", "commit": "abc", "machine": "m", "torch": "t",
                  "command": "python scripts/pretrain.py -m experiment=paper_polynomial"}  # fmt: skip
    results = {"provenance": provenance, "task": task, "step": 100, "n_future": n, "metric": "exact match",
               "group": group, "rows": rows, **more}  # fmt: skip
    (job / "eval_task").mkdir()
    (job / "eval_task" / "results.json").write_text(json.dumps(results))
    return job


def test_a_sweep_folder_is_aggregated_over_seeds_and_unfinished_runs_are_left_out(tmp_path):
    sweep = tmp_path / "paper_polynomial"
    fake_job(sweep, "model=mtp1,seed=0", 1, 0, {1: 0.5, 3: 0.1})
    fake_job(sweep, "model=mtp1,seed=1", 1, 1, {1: 0.7, 3: 0.3})
    fake_job(sweep, "model=mtp1,seed=2", 1, 2, {1: 0.9, 3: 0.2})
    fake_job(sweep, "model=mtp2,seed=0", 2, 0, {1: 1.0, 3: 0.4})
    unfinished = fake_job(sweep, "model=mtp2,seed=1", 2, 1, None)
    fake_checkpoint(unfinished / "checkpoints" / "last.ckpt", 3)
    finished, left = read_sweep([sweep])
    assert [run.folder.name for run in left] == ["model=mtp2,seed=1"] and left[0].checkpoint
    groups = aggregate(finished)
    assert [(g.size, g.group, g.n, g.in_domain, sorted(g.seeds)) for g in groups] == [
        ("paper_1m", 1, 1, True, [0, 1, 2]), ("paper_1m", 1, 2, True, [0]),
        ("paper_1m", 3, 1, False, [0, 1, 2]), ("paper_1m", 3, 2, False, [0]),
    ]  # fmt: skip
    assert (groups[0].mean, groups[0].low, groups[0].high) == (pytest.approx(0.7), 0.5, 0.9)
    assert (groups[2].mean, groups[2].low, groups[2].high) == (pytest.approx(0.2), 0.1, 0.3)
    assert groups[1].accuracies == [1.0]  # the unfinished seed 1 of n=2 is in no average
    tables = sweep_tables(finished, left)
    assert "| size | ops | domain | n=1 | n=2 |" in tables
    assert "| paper_1m | 1 | in | 70.0% (50.0%-90.0%, 3 seeds) | 100.0% (1 seed) |" in tables
    assert "| paper_1m | 3 | out | 20.0% (10.0%-30.0%, 3 seeds) | 40.0% (1 seed) |" in tables
    assert "| model=mtp2,seed=1 | paper_1m | 2 | 1 |  |  |  |  |  | unfinished, has a last.ckpt |" in tables
    assert "1 run(s) unfinished, in no average above: run the sweep's command again to resume them." in tables
    assert "Every run's other settings" not in tables  # paths.log_dir says where, not what: not a setting
    header = sweep_provenance(finished, "python scripts/results_page.py SWEEP")
    assert header["date"] == "2026-01-01 10:00 UTC to 2026-01-03 10:00 UTC" and header["commit"] == "abc"
    assert header["command"] == "python scripts/pretrain.py -m experiment=paper_polynomial\n" + (
        "python scripts/results_page.py SWEEP"
    )


def test_runs_of_other_settings_are_not_averaged_together(tmp_path):
    sweep = tmp_path / "paper_polynomial"
    fake_job(sweep, "a", 1, 0, {1: 0.2}, extra=["trainer.max_steps=10", "data.seq_len=64"])
    fake_job(sweep, "b", 1, 1, {1: 0.4}, extra=["trainer.max_steps=10", "data.seq_len=64"])
    fake_job(sweep, "c", 1, 0, {1: 0.9}, extra=["trainer.max_steps=20", "data.seq_len=64"])
    finished, _ = read_sweep([sweep])
    assert [(g.setting, g.accuracies) for g in aggregate(finished)] == [
        (("data.seq_len=64", "trainer.max_steps=10"), [0.2, 0.4]), (("data.seq_len=64", "trainer.max_steps=20"), [0.9]),
    ]  # fmt: skip
    tables = sweep_tables(finished, [])
    assert "Every run's other settings: `data.seq_len=64`." in tables
    assert "### trainer.max_steps=10\n" in tables and "### trainer.max_steps=20\n" in tables
    assert "| paper_1m | 1 | in | 30.0% (20.0%-40.0%, 2 seeds) |" in tables


def test_induction_sweeps_of_several_sizes_make_one_page_by_size(tmp_path):
    """One folder per size (or one for all): accuracy against size, sizes ordered by parameters, not by name."""
    small, large = tmp_path / "one", tmp_path / "other"
    fake_job(small, "model=mtp1,seed=0", 1, 0, {"second": 0.1, "first": 0.0}, size="paper_3m", parameters=3_000_000)
    fake_job(small, "model=mtp2,seed=0", 2, 0, {"second": 0.3, "first": 0.0}, size="paper_3m", parameters=3_000_000)
    fake_job(large, "model=mtp1,seed=0", 1, 0, {"second": 0.5, "first": 0.0}, size="paper_10m", parameters=10**7)
    fake_job(large, "model=mtp1,seed=1", 1, 1, {"second": 0.7, "first": 0.1}, size="paper_10m", parameters=10**7)
    finished, _ = read_sweep([large, small])
    assert size_order(finished) == ["paper_3m", "paper_10m"]
    tables = sweep_tables(finished, [])
    assert "| size | token | domain | n=1 | n=2 |" in tables
    second = [line for line in tables.splitlines() if "| second |" in line]
    assert second == [
        "| paper_3m | second | in | 10.0% (1 seed) | 30.0% (1 seed) |",
        "| paper_10m | second | in | 60.0% (50.0%-70.0%, 2 seeds) |  |",
    ]
    assert sweep_title(finished) == "Induction, a sweep: paper_3m, paper_10m; n = 1, 2; seeds 0, 1"


def test_the_page_command_writes_the_page_and_its_plot_or_says_the_folder_has_no_finished_run(tmp_path):
    from mtp.commands import results_page

    sweep = tmp_path / "paper_polynomial"
    fake_job(sweep, "model=mtp1,seed=0", 1, 0, None)
    with pytest.raises(UserError, match=r"paper_polynomial holds no finished run \(no job folder with "):
        results_page.main([str(sweep), "--out", str(tmp_path / "page.md")])
    with pytest.raises(UserError, match="is not a folder; pass a sweep's folder"):
        read_sweep([tmp_path / "absent"])
    pytest.importorskip("matplotlib")
    fake_job(sweep, "model=mtp1,seed=1", 1, 1, {1: 0.5, 6: 0.25})
    out = tmp_path / "docs" / "sweep.md"
    results_page.main([str(sweep), "--out", str(out)])
    text = out.read_text()
    assert text.startswith("# Polynomial arithmetic, a sweep: paper_1m; n = 1; seeds 1\n")
    assert "| commit | abc |" in text and "![Polynomial arithmetic, a sweep" in text and "](sweep.png)" in text
    assert "| paper_1m | 6 | out | 25.0% (1 seed) |" in text and "unfinished, not started" in text
    assert (tmp_path / "docs" / "sweep.png").stat().st_size > 1000


@pytest.mark.slow
def test_a_tiny_sweep_scores_itself_continues_and_makes_its_page(tmp_path, shared_cache):
    """The chain as a user runs it: a sweep of two jobs into a folder of the user's choice, each scoring itself and
    keeping its summary; its rerun skips both; its page averages them, and the page made from the summaries alone is
    the same; a job whose summary is gone is skipped by its folder's score and keeps its summary again."""
    from tests.test_scripts import pretrain

    sweep, kept = tmp_path / "my_sweep", tmp_path / "results"
    overrides = [
        "experiment=paper_polynomial", "model=mtp1,mtp2", "seed=0", "size=tiny", "data.source.problems=600",
        f"data.cache_dir={shared_cache}", "data.seq_len=64", "data.batch_size=4", "data.val_fraction=0.1",
        "trainer.accelerator=cpu", "trainer.max_steps=2", "trainer.val_check_interval=2",
        "trainer.limit_val_batches=1", "trainer.enable_progress_bar=false", "optim.warmup_steps=1",
        "eval_task.problems=2", "eval_task.ops=[1,6]", f"hydra.sweep.dir={sweep}", f"paths.results_dir={kept}",
    ]  # fmt: skip
    first = pretrain(*overrides, tmp_path=tmp_path, multirun=True)
    assert first.returncode == 0, first.stderr[-3000:]
    settings = "size=tiny,seed=0,data.batch_size=4,data.seq_len=64,data.source.problems=600,data.val_fraction=0.1,"
    jobs = sorted(path.name for path in sweep.iterdir() if path.is_dir())
    assert [job[:-9] for job in jobs] == [f"model=mtp{n},{settings}ev" for n in (1, 2)]  # named by settings, cut
    for job in jobs:
        results = json.loads((sweep / job / "eval_task" / "results.json").read_text())
        assert [(r["ops"], r["problems"]) for r in results["rows"]] == [(1, 2), (6, 2)] and results["step"] == 2
        assert results["provenance"]["command"].startswith("python scripts/pretrain.py -m paths.log_dir=")
        summary = json.loads((kept / "paper_polynomial" / job / "results.json").read_text())
        assert [path.name for path in (kept / "paper_polynomial" / job).iterdir()] == ["results.json"]
        assert {k: summary[k] for k in results} == results  # the scores, budget and provenance, as scored
        assert summary["job"]["name"] == job and summary["job"]["choices"] == {"size": "tiny"}
        assert summary["config"]["trainer"]["max_steps"] == 2 and "${" not in json.dumps(summary["config"])
        assert {"train_seconds", "train_threads", "tokens", "step"} <= set(summary)
        assert {"date", "commit", "machine", "torch", "command"} <= set(summary["provenance"])
    again = pretrain(*overrides, tmp_path=tmp_path, multirun=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count(f"its summary is kept in {kept / 'paper_polynomial'}/") == 2
    assert "Trainer.fit" not in again.stdout + again.stderr
    pages = []
    for folder in (sweep, kept / "paper_polynomial"):
        out = tmp_path / "page.md"
        made = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "results_page.py"), str(folder), "--out", str(out)],
            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr[-3000:]
        assert "| tiny | 6 | out |" in out.read_text() and out.with_suffix(".png").is_file()
        pages.append([line for line in out.read_text().splitlines() if "scripts/results_page.py" not in line])
    assert pages[0] == pages[1]  # but for the page's own command, which names the folder it read
    shutil.rmtree(kept / "paper_polynomial" / jobs[0])  # its summary gone: the job folder's score keeps it again
    third = pretrain(*overrides, tmp_path=tmp_path, multirun=True)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "finished earlier (its eval_task/results.json is there); skipping it" in third.stdout
    assert (kept / "paper_polynomial" / jobs[0] / "results.json").is_file()
    assert "Trainer.fit" not in third.stdout + third.stderr


def test_only_the_first_process_of_a_multi_device_run_scores_the_trained_checkpoint_and_benchmarks_it_apart(
    monkeypatch,
):
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    from mtp.commands import bench_decode, pretrain

    ran = []
    apart = lambda function, *args: ran.append(("apart", function, args))  # noqa: E731
    monkeypatch.setattr(pretrain, "in_own_process", apart)
    monkeypatch.setattr(eval_task, "run", lambda args: ran.append("eval"))
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    pretrain.score_trained("bench args", "eval args")
    assert ran == []
    monkeypatch.setattr(rank_zero_only, "rank", 0)
    pretrain.score_trained("bench args", "eval args")
    pretrain.score_trained(None, None)
    assert ran == [("apart", bench_decode.run, ("bench args", "bench_decode")), "eval"]  # in a process of its own


def with_curve(job: Path, points: list[tuple[int, float]], tokens_per_step: int = 100) -> None:
    """Add a task curve (step, accuracy of the first row) and a budget to a fake job's results."""
    path = job / "eval_task" / "results.json"
    results = json.loads(path.read_text())
    row = {"token": "second", "problems": 50}
    results["curve"] = [{"step": s, "tokens": s * tokens_per_step, "rows": [row | {"accuracy": a}]} for s, a in points]
    results |= {"tokens": points[-1][0] * tokens_per_step, "train_seconds": 600.0 + results["n_future"] * 60,
                "train_threads": 1}  # fmt: skip
    path.write_text(json.dumps(results))


def test_learning_curves_give_each_runs_best_point_beside_its_last_and_the_budgets(tmp_path):
    sweep = tmp_path / "paper_induction"
    a = fake_job(sweep, "model=mtp1,seed=0", 1, 0, {"second": 0.2, "first": 0.0})
    b = fake_job(sweep, "model=mtp1,seed=1", 1, 1, {"second": 0.3, "first": 0.0})
    c = fake_job(sweep, "model=mtp2,seed=0", 2, 0, {"second": 0.5, "first": 0.0})
    with_curve(a, [(0, 0.0), (10, 0.4), (20, 0.2)])
    with_curve(b, [(0, 0.0), (10, 0.1), (20, 0.3)])
    with_curve(c, [(0, 0.0), (10, 0.5), (20, 0.5)])  # a tie: the earlier step is the best
    finished, _ = read_sweep([sweep])
    tables = sweep_tables(finished, [])
    assert "| size | n | seeds | best point (token second) | its step | last point | last step |" in tables
    assert "| paper_1m | 1 | 2 | 35.0% (30.0%-40.0%) | 10, 20 | 25.0% (20.0%-30.0%) | 20 |" in tables
    assert "| paper_1m | 2 | 1 | 50.0% | 10 | 50.0% | 20 |" in tables
    assert "| model=mtp2,seed=0 | paper_1m | 2 | 0 |  | 100 | 0.0M | 12 min | 1 | finished |" in tables
    assert "Training time of the finished runs in all: 34 min." in tables
    from mtp.benchmarks.task_sweep import curve_groups

    tokens, means, lows, highs = curve_groups(finished)[0].band()
    assert tokens == [0, 1000, 2000] and means == pytest.approx([0.0, 0.25, 0.25]) and lows == [0.0, 0.1, 0.2]
    assert highs == [0.0, 0.4, 0.3]
    pytest.importorskip("matplotlib")
    from mtp.commands import results_page

    out = tmp_path / "page.md"
    results_page.main([str(sweep), "--out", str(out)])
    assert "![Learning curves](page-curves.png)\n\n### Runs" in out.read_text()
    assert (tmp_path / "page-curves.png").stat().st_size > 1000


def test_an_induction_page_counts_the_seeds_that_formed_induction_at_the_stated_threshold(tmp_path):
    """Formed: a final point of 10% or more on the second token (a curve that passed 10% and fell back does not
    count); beside each seed, the tokens at its curve's first point at 10% or more."""
    sweep = tmp_path / "paper_induction"
    runs = {  # seed: (final second-token score, curve)
        2: (0.10, [(0, 0.0), (10, 0.05), (20, 0.12)]),  # exactly the threshold: formed
        0: (0.55, [(0, 0.0), (10, 0.3), (20, 0.5)]),
        1: (0.099, [(0, 0.0), (10, 0.15), (20, 0.09)]),  # passed it on the curve, ended below: not formed
    }
    for seed, (final, curve) in runs.items():
        with_curve(fake_job(sweep, f"model=mtp1,seed={seed}", 1, seed, {"second": final, "first": 0.0}), curve)
    with_curve(fake_job(sweep, "model=mtp2,seed=0", 2, 0, {"second": 0.002, "first": 0.0}), [(0, 0.0), (20, 0.01)])
    finished, _ = read_sweep([sweep])
    tables = sweep_tables(finished, [])
    header = "| size | n | seeds | formed | final point per seed | first curve point at 10.0% or more per seed |"
    assert header in tables
    assert "| paper_1m | 1 | 0, 1, 2 | 2 of 3 | 55.0%, 9.9%, 10.0% | 1.0K tokens, 1.0K tokens, 2.0K tokens |" in tables
    assert "| paper_1m | 2 | 0 | 0 of 1 | 0.2% | - |" in tables


def fake_corpus_job(
    sweep: Path, size: str, n: int, seed: int, loss: float, tokens_per_forward: float, params: int, *extra: str
):
    name = ",".join([f"model=mtp{n},size={size},seed={seed}", *extra])
    job = fake_job(sweep, name, n, seed, None, size=size, extra=extra)
    results = {"provenance": {"date": "2026-01-01 10:00 UTC", "commit": "abc", "machine": "m", "torch": "t",
                              "command": "python scripts/pretrain.py -m experiment=size_trend"},
               "task": "corpus", "step": 10, "n_future": n, "tokens": 40960, "parameters": params + 1000,
               "non_embedding_parameters": params, "metric": "held-out loss", "group": "head",
               "rows": [{"head": 1, "loss": loss, "tokens": 500, "bits_per_byte": loss / 2}],
               "decoding": {"heads": n, "tokens_per_forward": tokens_per_forward, "acceptance": [0.5] * (n - 1),
                            "outputs_match": True}}  # fmt: skip
    (job / "eval_task").mkdir()
    (job / "eval_task" / "results.json").write_text(json.dumps(results))


def test_one_seed_is_not_called_apart_from_another(tmp_path):
    sweep = tmp_path / "size_trend"
    fake_corpus_job(sweep, "l6_1m", 1, 0, 3.0, 1.0, 1_000_000)
    fake_corpus_job(sweep, "l6_1m", 4, 0, 3.4, 1.8, 1_000_000)
    fake_corpus_job(sweep, "l6_1m", 4, 1, 3.5, 1.8, 1_000_000)
    finished, _ = read_sweep([sweep])
    (line,) = [line for line in sweep_tables(finished, []).splitlines() if line.startswith("| l6_")]
    assert "| +0.450 (one seed) |" in line and "apart" not in line


def test_a_corpus_sweep_gives_loss_by_size_and_n_its_difference_to_one_head_and_the_drafts(tmp_path):
    sweep = tmp_path / "size_trend"
    for seed, (one, four) in enumerate([(3.0, 3.4), (3.2, 3.5)]):  # 1M: n=4 worse beyond the seeds' spread
        fake_corpus_job(sweep, "l6_1m", 1, seed, one, 1.0, 1_000_000)
        fake_corpus_job(sweep, "l6_1m", 4, seed, four, 1.8, 1_000_000)
    for seed, (one, four) in enumerate([(2.5, 2.55), (2.7, 2.6)]):  # 10M: within it
        fake_corpus_job(sweep, "l6_10m", 1, seed, one, 1.0, 10_000_000)
        fake_corpus_job(sweep, "l6_10m", 4, seed, four, 2.2, 10_000_000)
    finished, _ = read_sweep([sweep])
    tables = sweep_tables(finished, [])
    assert "| size | non-embedding parameters | tokens | seeds (n=1/n=4) | loss n=1 | loss n=4 | n=4 - n=1 |" in tables
    lines = [line for line in tables.splitlines() if line.startswith("| l6_")]
    assert lines == [
        "| l6_1m | 1.00M | 0.0M | 2/2 | 3.100 (3.000-3.200) | 3.450 (3.400-3.500) | +0.350 (ranges apart) | "
        "1.550 (1.500-1.600) | 1.725 (1.700-1.750) | 1.80 (1.80-1.80) |",
        "| l6_10m | 10.00M | 0.0M | 2/2 | 2.600 (2.500-2.700) | 2.575 (2.550-2.600) | -0.025 (ranges overlap) | "
        "1.300 (1.250-1.350) | 1.288 (1.275-1.300) | 2.20 (2.20-2.20) |",
    ]
    table = tables[tables.index("| size |") :].split("\n\n")[0].splitlines()
    assert len({line.count("|") for line in table}) == 1  # the alignment row has a cell for every column
    assert sweep_title(finished) == "Next-token loss and drafts, a sweep: l6_1m, l6_10m; n = 1, 4; seeds 0, 1"
    pytest.importorskip("matplotlib")
    from mtp.commands import results_page

    out = tmp_path / "trend.md"
    results_page.main([str(sweep), "--out", str(out)])
    assert (tmp_path / "trend.png").stat().st_size > 1000 and not (tmp_path / "trend-curves.png").exists()


def test_a_lever_is_set_against_plain_training_of_its_size_at_every_n(tmp_path):
    """A setting with no n=1 of its own (a curriculum of n=4), one that is n=1 itself (extra-head-free MTP) and n=1
    trained longer (equal time) each get their difference to the runs as configured at n=1 and n=4 (what a lever costs
    and what it wins back), with every side's seed count."""
    sweep = tmp_path / "size_trend"
    for seed, (one, four) in enumerate([(3.0, 3.4), (3.2, 3.5)]):
        fake_corpus_job(sweep, "l6_1m", 1, seed, one, 1.0, 1_000_000)
        fake_corpus_job(sweep, "l6_1m", 4, seed, four, 1.8, 1_000_000)
    fake_corpus_job(sweep, "l6_1m", 4, 0, 3.15, 1.9, 1_000_000, "loss.loss_weights_schedule=forward")
    fake_corpus_job(sweep, "l6_1m", 4, 1, 3.25, 1.7, 1_000_000, "loss.loss_weights_schedule=forward")
    fake_corpus_job(sweep, "l6_1m", 1, 0, 2.9, 1.0, 1_000_000, "loss.head1_targets=4")
    fake_corpus_job(sweep, "l6_1m", 1, 0, 2.8, 1.0, 1_000_000, "trainer.max_steps=2000")
    fake_corpus_job(sweep, "l6_1m", 1, 1, 2.85, 1.0, 1_000_000, "trainer.max_steps=2000")
    finished, _ = read_sweep([sweep])
    tables = sweep_tables(finished, []).split("### ")
    (forward,) = [table for table in tables if table.startswith("loss.loss_weights_schedule=forward")]
    header = "| seeds (n=4/plain n=1/plain n=4) | loss n=4 | n=4 - plain n=1 | n=4 - plain n=4 | bits/byte n=4 | "
    assert header + "tokens/forward n=4 |" in forward
    assert (
        "| l6_1m | 1.00M | 0.0M | 2/2/2 | 3.200 (3.150-3.250) | +0.100 (ranges overlap) | -0.250 (ranges apart) | "
        "1.600 (1.575-1.625) | 1.80 (1.70-1.90) |" in forward
    )
    (free,) = [table for table in tables if table.startswith("loss.head1_targets=4")]
    assert (
        "| seeds (n=1/plain n=1/plain n=4) | loss n=1 | n=1 - plain n=1 | n=1 - plain n=4 | bits/byte n=1 |\n" in free
    )
    assert "| l6_1m | 1.00M | 0.0M | 1/2/2 | 2.900 | -0.200 (one seed) | -0.550 (one seed) | 1.450 |" in free
    (longer,) = [table for table in tables if table.startswith("trainer.max_steps=2000")]
    assert "| 2/2/2 | 2.825 (2.800-2.850) | -0.275 (ranges apart) | -0.625 (ranges apart) |" in longer
    (plain,) = [table for table in tables if table.startswith("as configured")]
    assert "| seeds (n=1/n=4) | loss n=1 | loss n=4 | n=4 - n=1 | bits/byte n=1 |" in plain
    assert "| 2/2 | 3.100 (3.000-3.200) | 3.450 (3.400-3.500) | +0.350 (ranges apart) |" in plain
    for table in tables[1:]:
        rows = [line for line in table.splitlines() if line.startswith("|")]
        assert len({line.count("|") for line in rows}) == 1  # the alignment row has a cell for every column


def test_the_size_plot_ticks_the_sizes_run_and_tells_every_setting_apart(tmp_path, monkeypatch):
    """Each line of the size trend's figure (n and setting) differs from every other in color, marker or style, so a
    setting with one point is still told apart from another at the same n; the axis is ticked at the sizes run."""
    pytest.importorskip("matplotlib")
    from mtp.benchmarks import sweep_plots

    sweep = tmp_path / "size_trend"
    for n in (1, 4):
        fake_corpus_job(sweep, "l6_1m", n, 0, 3.0 + n / 10, 1.0, 1_280_000)
        fake_corpus_job(sweep, "l6_3m", n, 0, 2.8 + n / 10, 1.0, 3_790_000)
    fake_corpus_job(sweep, "l6_1m", 4, 0, 3.2, 1.9, 1_280_000, "loss.loss_weights_schedule=forward")
    fake_corpus_job(sweep, "l6_1m", 4, 0, 3.1, 1.8, 1_280_000, "loss=deepseek_v3")
    fake_corpus_job(sweep, "l6_1m", 1, 0, 2.9, 1.0, 1_280_000, "loss.head1_targets=4")
    figures = []
    monkeypatch.setattr(sweep_plots, "save_figure", lambda figure, *_: figures.append(figure))
    sweep_plots.plot_sweep(read_sweep([sweep])[0], tmp_path / "trend.png", "trend")
    (figure,) = figures
    for ax in figure.axes:
        assert [label.get_text() for label in ax.get_xticklabels()] == ["1.28", "3.79"]
        lines = {bars.get_label(): bars.lines[0] for bars in ax.containers}  # an error bar's data line and its label
        assert len(lines) == 5
        looks = {(line.get_color(), line.get_marker(), line.get_linestyle()) for line in lines.values()}
        assert len(looks) == len(lines)
        assert len({line.get_marker() for label, line in lines.items() if label.startswith("n=4")}) == 3


# -- results that last: each finished job's summary, kept in the repository's results folder


def keep(job: Path, results_dir: Path, experiment: str = "paper_polynomial") -> Path:
    """A fake job's summary as a finished sweep job keeps it (mtp.commands.pretrain.keep_summary)."""
    hydra = OmegaConf.load(job / ".hydra" / "hydra.yaml").hydra
    overrides = list(OmegaConf.load(job / ".hydra" / "overrides.yaml"))
    excluded = list(hydra.job.config.override_dirname.exclude_keys)
    settings = ",".join(o for o in overrides if o.split("=")[0] not in excluded)
    summary = summary_job(experiment, job.name, settings, overrides, hydra.runtime.choices, excluded)
    config = OmegaConf.to_container(OmegaConf.load(job / ".hydra" / "config.yaml"))
    results = json.loads((job / "eval_task" / "results.json").read_text())
    return write_summary(results_dir / experiment / job.name, results, config, summary)


def test_a_page_made_from_the_kept_summaries_equals_the_page_made_from_the_job_folders(tmp_path):
    from mtp.commands import results_page

    sweep, results_dir = tmp_path / "paper_induction", tmp_path / "results"
    jobs = [
        fake_job(sweep, "model=mtp1,seed=0", 1, 0, {"second": 0.2, "first": 0.5}, parameters=1_200_000),
        fake_job(sweep, "model=mtp1,seed=1", 1, 1, {"second": 0.4, "first": 0.6}, parameters=1_200_000),
        fake_job(sweep, "model=mtp2,seed=0", 2, 0, {"second": 0.1, "first": 0.5}, parameters=1_200_000),
        fake_job(
            sweep,
            "model=mtp2,seed=0,loss.loss_weights=[1.0,0.0]",
            2,
            0,
            {"second": 0.0, "first": 0.5},
            extra=["loss.loss_weights=[1.0,0.0]"],
            parameters=1_200_000,
        ),  # fmt: skip
    ]
    with_curve(jobs[0], [(0, 0.0), (10, 0.3), (20, 0.2)])
    with_curve(jobs[1], [(0, 0.0), (10, 0.1), (20, 0.4)])
    for job in jobs:
        keep(job, results_dir)
    kept = results_dir / "paper_polynomial"
    assert sorted(path.name for path in kept.iterdir()) == sorted(job.name for job in jobs)
    assert all([p.name for p in (kept / job.name).iterdir()] == ["results.json"] for job in jobs)
    from_jobs, from_kept = read_sweep([sweep]), read_sweep([kept])
    assert sweep_tables(*from_kept) == sweep_tables(*from_jobs)
    assert sweep_title(from_kept[0]) == sweep_title(from_jobs[0])
    assert sweep_provenance(from_kept[0], "page") == sweep_provenance(from_jobs[0], "page")
    assert "### loss.loss_weights=[1.0,0.0]\n" in sweep_tables(*from_kept)  # a control stays a setting of its own
    pytest.importorskip("matplotlib")
    pages, out = [], tmp_path / "docs" / "page.md"
    for folder in (sweep, kept):
        results_page.main([str(folder), "--out", str(out)])
        pages.append(out.read_text().replace(str(folder), "FOLDER"))  # the page's own command names its folder
    assert pages[0] == pages[1]
    shutil.rmtree(sweep)  # the job folders may go (another machine): the page is made again from the summaries
    results_page.main([str(kept), "--out", str(out)])
    assert out.read_text().replace(str(kept), "FOLDER") == pages[1]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda path: path.unlink(), r"results.json is missing, so .*model=mtp1,seed=0 is no job's summary; restore"),
        (lambda path: path.write_text('{"task": '), r"results.json is not a readable job summary \(Expecting value"),
        (lambda path: path.write_text('{"task": "x"}'), r"results.json is not a job summary: it lacks job, config, "),
    ],
    ids=["missing", "damaged", "incomplete"],
)
def test_a_bad_summary_is_one_sentence_naming_the_file_and_the_fix(tmp_path, damage, message):
    sweep, results_dir = tmp_path / "sweep", tmp_path / "results"
    path = keep(fake_job(sweep, "model=mtp1,seed=0", 1, 0, {1: 0.5}), results_dir)
    keep(fake_job(sweep, "model=mtp1,seed=1", 1, 1, {1: 0.7}), results_dir)
    damage(path)
    folder = re.escape(shlex.quote(str(path.parent)))
    fix = f"git checkout -- {folder}\\), or delete the folder {folder} and run its sweep again"
    for read in (lambda: read_sweep([results_dir]), lambda: read_summary(path)):
        with pytest.raises(UserError, match=message + ".*" + fix):
            read()
    summary = path.parent
    with pytest.raises(UserError, match=message):  # a rerun neither trains it again nor skips it silently
        continue_sweep_job(OmegaConf.create({}), tmp_path / "job", "model=mtp1,seed=0", True, summary)


def test_a_rerun_skips_a_job_whose_summary_is_kept_and_runs_one_without(tmp_path, caplog):
    caplog.set_level(logging.INFO, "mtp.commands.pretrain")
    cfg = OmegaConf.create({"ckpt_path": None, "trainer": {"max_steps": 6}})
    sweep, results_dir = tmp_path / "sweep", tmp_path / "results"
    keep(fake_job(tmp_path / "elsewhere", "model=mtp1,seed=0", 1, 0, {1: 0.5}), results_dir)  # another machine's
    kept = results_dir / "paper_polynomial"
    settings = "model=mtp1,seed=0"
    assert continue_sweep_job(cfg, sweep / settings, settings, True, kept / settings) == (None, False)
    assert not (sweep / settings).exists()  # nothing recorded, nothing trained
    assert f"sweep job model=mtp1,seed=0: its summary is kept in {kept / settings}; skipping it" in caplog.text
    other = "model=mtp1,seed=1"  # no summary: trains (and its job folder records it)
    assert continue_sweep_job(cfg, sweep / other, other, True, kept / other) == (cfg, True)
    assert (sweep / other / SWEEP_JOB).is_file()
    with pytest.raises(UserError, match=r"is the summary of a job of other settings \(model=mtp1,seed=0, not x=1\)"):
        continue_sweep_job(cfg, sweep / settings, "x=1", True, kept / settings)


def test_a_sweep_job_keeps_its_summary_once_scored_and_a_rerun_elsewhere_does_not_train_it(tmp_path, monkeypatch):
    """The job as Hydra runs it (its training and scoring stood in for): scored, it keeps its summary in the results
    folder; the same job run again on a machine without its job folder is skipped by that summary, untrained."""
    from hydra.core.hydra_config import HydraConfig

    from mtp.commands import pretrain as command

    results_dir = tmp_path / "results"
    overrides = ["experiment=paper_induction", "model=mtp2", "seed=3", f"paths.results_dir={results_dir}",
                 f"paths.log_dir={tmp_path / 'logs'}", "hydra.mode=MULTIRUN"]  # fmt: skip
    cfg = compose_train(overrides)
    name = job_folder(cfg.hydra.job.override_dirname)
    assert name == "model=mtp2,seed=3"  # where files go is no setting
    output_dir = tmp_path / "logs" / "sweep" / name
    cfg.hydra.runtime.output_dir = str(output_dir)
    HydraConfig.instance().set_config(cfg)
    task_cfg = cfg.copy()
    with open_dict(task_cfg):  # what Hydra hands the job: the config without its own node
        del task_cfg["hydra"]
    trained = []

    def score(bench, evaluation) -> bool:
        (output_dir / "eval_task").mkdir(parents=True)
        scored = {"provenance": {"date": "d", "commit": "c", "machine": "m", "torch": "t", "command": "x"},
                  "task": "induction", "group": "token", "metric": "accuracy", "n_future": 2, "step": 3000,
                  "rows": [{"token": "second", "problems": 5, "accuracy": 0.4, "in_domain": True}]}  # fmt: skip
        (output_dir / "eval_task" / "results.json").write_text(json.dumps(scored))
        return True

    monkeypatch.setattr(command, "train", lambda cfg: trained.append(cfg.seed))
    monkeypatch.setattr(command, "score_trained", score)
    try:
        command.train_in_run_dir(task_cfg)
        summary = json.loads((results_dir / "paper_induction" / name / "results.json").read_text())
        assert trained == [3] and summary["rows"][0]["accuracy"] == 0.4
        assert summary["job"] == {"experiment": "paper_induction", "name": name, "settings": name,
                                  "overrides": overrides[:-1], "choices": {"size": "paper_1m"},
                                  "excluded": list(cfg.hydra.job.config.override_dirname.exclude_keys)}  # fmt: skip
        assert summary["config"]["seed"] == 3 and summary["config"]["paths"]["output_dir"] == str(output_dir)
        shutil.rmtree(tmp_path / "logs")  # another machine, or the job folder deleted: the summary is what is left
        command.train_in_run_dir(task_cfg)
        assert trained == [3] and not output_dir.exists()
    finally:
        HydraConfig.instance().cfg = None
