"""mtp eval-task: the exact-match metric on hand-made replies, the Wilson interval, the evaluation lookup and its
refusals, a tiny model trained with experiment=paper_polynomial scored end to end, and a model of the default corpus
scored by its held-out loss (against a loss computed by hand) and its drafts."""

import json
import math
from types import SimpleNamespace

import pytest
import torch

from mtp.benchmarks import task_eval
from mtp.benchmarks.task_eval import evaluation_of
from mtp.checkpoint.load import LoadedCheckpoint
from mtp.commands import eval_task
from mtp.commands.cli import settings_named_by_config, settings_named_by_flags
from mtp.data import polynomial
from mtp.data.sources import SourceConfig
from mtp.data.tokenizer import byte_tokenizer
from mtp.errors import SettingError, UserError
from mtp.training import task_scores
from mtp.training.task_scores import TaskSettings, is_right, parse_ops, wilson_interval
from tests.conftest import compose_in


def test_wilson_interval_by_hand():
    low, high = wilson_interval(5, 10)  # p = 0.5: centre 0.5, half-width 1.96 * sqrt(0.025 + 0.0096) / 1.3842
    assert low == pytest.approx(0.2366, abs=1e-4) and high == pytest.approx(0.7634, abs=1e-4)
    low, high = wilson_interval(0, 10)
    assert low == 0 and high == pytest.approx(0.2775, abs=1e-4)
    low, high = wilson_interval(10, 10)
    assert low == pytest.approx(0.7225, abs=1e-4) and high == pytest.approx(1)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(1900, 2000)[1] - wilson_interval(1900, 2000)[0] < 0.02


@pytest.mark.parametrize(
    "reply, right",
    [
        ("02000\n", True),
        ("02000\n(1", True),  # what follows the newline is not the answer's
        ("02000", False),  # no newline: the answer did not end
        ("02001\n", False),
        ("2000\n", False),
        ("020000\n", False),
        ("\n", False),
        ("", False),
    ],
)
def test_exact_match_on_hand_made_replies(reply, right):
    assert is_right(reply, "02000") is right


def test_operation_counts():
    assert parse_ops("1-10") == list(range(1, 11))
    assert parse_ops("1-3,8, 2") == [1, 2, 3, 8]
    for text, message in [  # the library names the field; the command spells it as its flag, a config as its key
        ("0-3", "^ops=0 is outside the operation counts the generator supports; use 1 to 10.$"),
        ("11", "^ops=11 is outside"),
        ("a", "^ops=a is not a count, a range"),
        ("3-1", "^ops=3-1 names no operation count"),
    ]:
        with pytest.raises(SettingError, match=message) as raised:
            parse_ops(text)
        assert raised.value.fields == ("ops",)
    with pytest.raises(
        UserError, match=r"^--ops 0 is outside the operation counts the generator supports; use 1 to 10\.$"
    ):
        eval_task.checked_args(["last.ckpt", "--ops", "0-3"])
    with pytest.raises(UserError, match=r"^--ops a is not a count, a range such as 1-10 or a list such as 1-5,8\.$"):
        eval_task.checked_args(["last.ckpt", "--ops", "a"])
    with pytest.raises(UserError, match=r"^eval_task\.ops=11 is outside the operation counts"):
        eval_task.settings_of_config("last.ckpt", {"ops": "1-11"})


def checkpoint_on(source: dict) -> LoadedCheckpoint:
    return LoadedCheckpoint(None, byte_tokenizer(), SimpleNamespace(n_future=1), 0, {"source": source})


@pytest.mark.parametrize(
    "expression, operator",
    [("-12000", "neg"), ("(12000+60000)", "+"), ("-(12000o60000)", "neg"), ("((12000*10000)o-(33333))", "o"),
     ("(-(12000+1)*(20000o30000))", "*"), ("12000", "")],
)  # fmt: skip
def test_outermost_operation(expression, operator):
    assert polynomial.Problem(expression, "00000", 1).operator == operator


def test_a_checkpoint_is_scored_on_its_task_or_its_corpus_and_one_without_a_record_is_refused():
    assert evaluation_of(checkpoint_on({"kind": "polynomial"})) == "polynomial"
    assert evaluation_of(checkpoint_on({"kind": "induction"})) == "induction"
    for corpus in ("stdlib", "files", "hub"):
        assert evaluation_of(checkpoint_on({"kind": corpus})) == "corpus"
    with pytest.raises(UserError, match="^this checkpoint does not record the data it was trained on"):
        evaluation_of(LoadedCheckpoint(None, byte_tokenizer(), None, 0, {}))


def test_scores_count_right_wrong_and_malformed_replies(monkeypatch):
    """A stand-in decoder answers the k-th problem of each batch right (k % 3 == 0), wrong (1) or without a newline
    (2): the scores are the counts of the first kind, per operation count."""
    tokenizer = byte_tokenizer()
    source = {"kind": "polynomial", "eval_seed": 3, "eval_problems": 30, "min_ops": 1, "max_ops": 5}
    answers = {p.prompt: p.answer for ops in (2, 7) for p in polynomial.evaluation_problems(ops, 30, 3)}

    def fake_generate(model, prompts, config, heads=None):
        outputs = []
        for k, ids in enumerate(prompts):
            answer = answers[tokenizer.decode(ids[1:])]  # after the end-of-text that starts a prompt
            reply = [f"{answer}\n", f"{answer[::-1]}x\n", answer][k % 3]
            outputs.append(tokenizer.encode(reply).ids)
        return outputs, SimpleNamespace(row_forwards=len(prompts), tokens=6 * len(prompts))

    monkeypatch.setattr(task_scores, "generate", fake_generate)
    data = {"source": source}
    results = task_scores.score_polynomial(None, tokenizer, data, TaskSettings(ops=[2, 7], problems=12, batch_size=5))
    rows = {row["ops"]: row for row in results["rows"]}
    # batches of 5, 5 and 2: right at k = 0, 3 of each, so 2 + 2 + 1
    assert rows[2]["correct"] == rows[7]["correct"] == 5 and rows[2]["problems"] == 12
    assert rows[2]["in_domain"] and not rows[7]["in_domain"]
    assert rows[2]["ci95"] == pytest.approx(list(wilson_interval(5, 12)))
    for ops in (2, 7):  # the same counts split by each problem's outermost operation
        expected = {op: {"correct": 0, "problems": 0} for op in polynomial.OPERATORS}
        for i, problem in enumerate(polynomial.evaluation_problems(ops, 30, 3)[:12]):
            expected[problem.operator]["problems"] += 1
            expected[problem.operator]["correct"] += (i % 5) % 3 == 0
        assert rows[ops]["operators"] == expected
    assert "By outermost operation:" in task_eval.results_table(results | {"decoding": None})
    with pytest.raises(SettingError, match="^problems=31 is more than the 30 problems per count"):
        task_scores.score_polynomial(None, tokenizer, data, TaskSettings(problems=31))
    for named, spelled in [(settings_named_by_flags(), "--problems 31"), (settings_named_by_config("eval_task"),
                           "eval_task.problems=31")]:  # fmt: skip
        with pytest.raises(UserError, match=f"^{spelled} is more than the 30 problems per count that training kept"):
            with named:
                task_scores.score_polynomial(None, tokenizer, data, TaskSettings(problems=31))


@pytest.mark.slow  # ~3 s: trained and scored
def test_a_tiny_model_trained_on_polynomials_is_scored_end_to_end(tmp_path, shared_cache):
    """experiment=paper_polynomial at size=tiny for a few steps, then the command on a handful of problems with the
    heads drafting: a results.json with a row per asked count (what a few steps learn is not asserted)."""
    from mtp.commands import eval_task
    from mtp.training.train import train

    overrides = [
        "experiment=paper_polynomial", "model=mtp2", "size=tiny", "data.source.problems=600",
        f"data.cache_dir={shared_cache}", "data.seq_len=64", "data.batch_size=4", "data.val_fraction=0.1",
        "trainer.accelerator=cpu", "trainer.max_steps=3", "trainer.val_check_interval=3",
        "trainer.limit_val_batches=1", "trainer.enable_progress_bar=false", "optim.warmup_steps=1",
    ]  # fmt: skip
    cfg = compose_in(overrides, tmp_path)
    assert cfg.data.tokenizer.kind == "byte" and cfg.model.vocab_size == 320 and cfg.loss.answers_after == "="
    train(cfg)
    checkpoint = tmp_path / "run" / "checkpoints" / "last.ckpt"
    out = tmp_path / "eval"
    eval_task.main([str(checkpoint), "--ops", "1,6", "--problems", "3", "--heads", "2", "--out", str(out)])
    results = json.loads((out / "results.json").read_text())
    assert results["task"] == "polynomial" and results["n_future"] == 2 and results["step"] == 3
    assert [(r["ops"], r["problems"], r["in_domain"]) for r in results["rows"]] == [(1, 3, True), (6, 3, False)]
    assert results["decoding"]["heads"] == 2 and "| 6 | out | 3 |" in (out / "results.md").read_text()
    assert SourceConfig(**torch.load(checkpoint, weights_only=True)["mtp"]["data"]["source"]).kind == "polynomial"
    with pytest.raises(UserError, match=r"^--heads 3 exceeds this checkpoint's 2 head\(s\)"):
        eval_task.main([str(checkpoint), "--ops", "1", "--problems", "1", "--heads", "3", "--out", str(out)])


def test_answers_after_must_be_one_token(tmp_path, shared_cache):
    from mtp.training.train import train

    overrides = [
        "experiment=paper_polynomial", "size=tiny", "data.source.problems=100", f"data.cache_dir={shared_cache}",
        "data.seq_len=32", "data.batch_size=2", "trainer.accelerator=cpu", "trainer.max_steps=1",
        "trainer.enable_progress_bar=false", "loss.answers_after=is",
    ]  # fmt: skip
    with pytest.raises(
        UserError, match=r"^loss.answers_after='is' is 2 tokens of the data's tokenizer, and it must be one"
    ):
        train(compose_in(overrides, tmp_path))
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow  # ~17 s a model: each trained, validated and scored
@pytest.mark.parametrize("preset", ["mtp1", "mtp2"])
def test_a_corpus_model_is_scored_by_its_held_out_loss_as_training_validates_and_by_its_drafts(
    preset, make_cfg, tmp_path
):
    """A model of the test corpus: the split the evaluation reads is the packed validation split, token for token;
    over the same windows its loss is the training's own validation loss of head 1 (every window, Lightning's
    validation, which reads head 1 through the forward of every head: with two heads, a head 1 that the evaluation's
    path scored differently would show here); the command scores every window, decodes held-out prompts and says the
    tokens equal autoregressive decoding's."""
    import numpy as np

    from mtp.checkpoint.load import load_checkpoint
    from mtp.data.packing import TokenizerConfig, fingerprint
    from mtp.training.train import train

    cfg = make_cfg(preset, ["trainer.limit_val_batches=1.0"])
    n = cfg.model.n_future
    metrics = train(cfg)
    checkpoint = tmp_path / "run" / "checkpoints" / "last.ckpt"
    loaded = load_checkpoint(checkpoint, "cpu", "float32")
    ids, n_bytes = task_eval.validation_tokens(loaded.data, loaded.tokenizer)
    source = SourceConfig(**loaded.data["source"])
    packed = fingerprint(source, TokenizerConfig(**cfg.data.tokenizer), loaded.data["val_fraction"])
    stored = np.fromfile(f"{cfg.data.cache_dir}/{packed}/validation.bin", dtype=np.uint16)
    assert ids == stored.tolist()
    seq_len = loaded.data["seq_len"]
    windows = (len(ids) - (seq_len + n)) // seq_len + 1  # the training's validation windows (whole ones only)
    nats, scored = task_eval.held_out_loss(loaded.model, ids, seq_len, windows, batch_size=5)
    assert scored == windows * seq_len
    assert nats / scored == pytest.approx(metrics["val/loss_head1"], rel=1e-5)
    out = tmp_path / "eval"
    eval_task.main([str(checkpoint), "--prompts", "3", "--prompt-tokens", "8", "--new-tokens", "6", "--out", str(out)])
    results = json.loads((out / "results.json").read_text())
    row, decoding = results["rows"][0], results["decoding"]
    assert results["task"] == "corpus" and row["tokens"] == len(ids) - 1  # every token but the first
    bytes_scored = n_bytes * row["tokens"] / len(ids)
    assert row["bits_per_byte"] == pytest.approx(row["loss"] * row["tokens"] / math.log(2) / bytes_scored, rel=1e-9)
    assert decoding["heads"] == n and decoding["outputs_match"] and decoding["tokens_per_forward"] >= 1.0
    assert results["non_embedding_parameters"] == results["parameters"] - 2 * 512 * cfg.model.d_model
    assert "| 1 |" in (out / "results.md").read_text()


def test_a_corpus_model_drafts_with_every_head_and_bytes_are_bits_per_byte(tiny_checkpoints, tmp_path):
    for preset, heads in (("mtp4", 4), ("byte8", 8)):
        out = tmp_path / preset
        eval_task.main([str(tiny_checkpoints[preset]), "--prompts", "2", "--prompt-tokens", "8", "--new-tokens", "8",
                        "--windows", "6", "--out", str(out)])  # fmt: skip
        results = json.loads((out / "results.json").read_text())
        decoding = results["decoding"]
        assert decoding["heads"] == heads and len(decoding["acceptance"]) == heads - 1 and decoding["outputs_match"]
        assert decoding["tokens_per_forward"] >= 1.0 and results["rows"][0]["tokens"] == 6 * 32
        if preset == "byte8":  # one token a byte (and one per end-of-text): bits per byte are bits per token
            row = results["rows"][0]
            assert row["bits_per_byte"] == pytest.approx(row["loss"] / math.log(2), rel=1e-9)
    with pytest.raises(UserError, match=r"^--heads 5 is more than the 4 heads the model has; use at most 4.$"):
        eval_task.main([str(tiny_checkpoints["mtp4"]), "--heads", "5", "--out", str(tmp_path / "x")])
    # the data's prompts name the field; the command spells it as its flag, a training run's eval_task node as its key
    long = ["--prompts", "1", "--prompt-tokens", "100000", "--windows", "1", "--out", str(tmp_path / "x")]
    with pytest.raises(UserError, match=r"^no validation document has 100000 tokens; lower --prompt-tokens\.$"):
        eval_task.main([str(tiny_checkpoints["mtp4"]), *long])
    node = {"prompts": 1, "prompt_tokens": 100000, "windows": 1, "out": str(tmp_path / "x")}
    with pytest.raises(
        UserError, match=r"^no validation document has 100000 tokens; lower eval_task\.prompt_tokens\.$"
    ):
        eval_task.run(eval_task.settings_of_config(str(tiny_checkpoints["mtp4"]), node))
