"""The induction task: its stories (exact: every name two tokens, every name repeated, positions as generated,
evaluation apart from training), its metric on hand-made models, its bad inputs, and a tiny run scored end to end."""

import json
from pathlib import Path

import pytest
import torch
from conftest import compose_in
from torch import nn

from mtp.checkpoint.load import load_checkpoint
from mtp.data.induction import (
    FIRST_PIECES,
    SECOND_PIECES,
    evaluation_stories,
    induction_tokenizer,
    name_split,
    story_ids,
    training_stories,
    vocabulary,
)
from mtp.data.packing import TokenizerConfig, fingerprint
from mtp.data.sources import SourceConfig, load_documents
from mtp.data.tokenizer import byte_tokenizer, eot_id
from mtp.errors import UserError
from mtp.training.task_scores import name_repeat_accuracy, wilson_interval
from mtp.training.train import train

TOKENIZER = induction_tokenizer()


def names_in(pieces: tuple[str, ...]) -> list[tuple[int, str]]:
    """(index of the second piece, name) of every name in a story's pieces, found by the pieces' shapes alone."""
    return [
        (i, pieces[i - 1] + pieces[i][2:])
        for i in range(1, len(pieces))
        if pieces[i].startswith("##") and pieces[i - 1] in FIRST_PIECES
    ]


def test_every_name_is_two_tokens_and_every_word_one():
    words, suffixes = vocabulary()
    assert [TOKENIZER.encode(word).tokens for word in words] == [[word] for word in words]
    names = [first + second for first, second in name_split()[0] + name_split()[1]]
    assert len(names) == len(FIRST_PIECES) * len(SECOND_PIECES)
    encoded = TOKENIZER.encode_batch(names)
    assert all(e.tokens == [name[:2], "##" + name[2:]] for e, name in zip(encoded, names, strict=True))
    assert TOKENIZER.token_to_id("[UNK]") == 0 and "[UNK]" not in TOKENIZER.encode(" ".join(names[:50])).tokens


def test_stories_are_reproducible_and_tokenized_as_generated():
    stories = training_stories(300, seed=0)
    assert stories == training_stories(300, seed=0)
    assert [s.text for s in stories] != [s.text for s in training_stories(300, seed=1)]
    for item in stories + evaluation_stories(100):
        assert TOKENIZER.encode(item.text).tokens == list(item.pieces)
        assert story_ids(TOKENIZER, item)[0] == eot_id(TOKENIZER)


def test_every_name_repeats_and_the_repeats_are_the_second_pieces_of_later_mentions():
    for item in evaluation_stories(300) + training_stories(100, seed=3):
        found = names_in(item.pieces)
        counts = {name: sum(n == name for _, n in found) for _, name in found}
        assert 2 <= len(counts) <= 3 and min(counts.values()) >= 2
        assert len({name[:2] for name in counts}) == len(counts)  # first pieces differ within a story
        first_mentions = {name: i for i, name in reversed(found)}
        assert list(item.repeats) == [i for i, name in found if first_mentions[name] != i]


def test_evaluation_names_and_stories_never_occur_in_training():
    train_names, eval_names = name_split()
    assert not set(train_names) & set(eval_names) and len(eval_names) == len(train_names + eval_names) // 10
    training = training_stories(2000, seed=0)
    evaluation = evaluation_stories()
    used_in_training = {name for item in training for _, name in names_in(item.pieces)}
    used_in_evaluation = {name for item in evaluation for _, name in names_in(item.pieces)}
    assert used_in_training <= {a + b for a, b in train_names}
    assert used_in_evaluation <= {a + b for a, b in eval_names}
    assert not {s.text for s in training} & {s.text for s in evaluation}


def test_the_source_generates_the_stories_and_its_settings_change_the_cache_fingerprint():
    source = SourceConfig(kind="induction", documents=20, seed=4)
    texts = load_documents(source)["text"]
    assert texts == [item.text for item in training_stories(20, seed=4)]
    tokenizer = TokenizerConfig(kind="induction")
    prints = {
        fingerprint(SourceConfig(kind="induction", documents=n, seed=s), tokenizer, 0.05)
        for n, s in [(20, 4), (21, 4), (20, 5)]
    }
    assert len(prints) == 3


class FakeModel(nn.Module):
    """Head 1's logits from a rule over the ids read: ``guess(row, t)`` is the token predicted after position t."""

    def __init__(self, guess) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.config = type("Config", (), {"max_seq_len": 512})()
        self.guess = guess

    def next_token_logits(self, idx: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*idx.shape, TOKENIZER.get_vocab_size())
        for b, row in enumerate(idx.tolist()):
            for t in range(len(row)):
                logits[b, t, self.guess(row, t)] = 1.0
        return logits


def copy_after_same_token(row: list[int], t: int) -> int:
    """Induction by hand: the token that followed the latest earlier occurrence of token t; end-of-text if none."""
    earlier = [s for s in range(t) if row[s] == row[t]]
    return row[earlier[-1] + 1] if earlier else row[0]


def test_a_model_that_copies_after_the_same_token_scores_every_repeat():
    stories = evaluation_stories(40)
    result = name_repeat_accuracy(FakeModel(copy_after_same_token), TOKENIZER, stories, batch_size=7)
    total = sum(len(item.repeats) for item in stories)
    assert result["correct"] == result["total"] == total and result["accuracy"] == 1.0
    assert result["ci95"] == list(wilson_interval(total, total)) and result["ci95"][1] == 1.0
    assert result["first_piece_accuracy"] < 1.0 and result["stories"] == 40


def test_a_model_that_never_copies_scores_zero_and_one_right_answer_scores_one():
    stories = evaluation_stories(10)
    eot = eot_id(TOKENIZER)
    wrong = name_repeat_accuracy(FakeModel(lambda row, t: eot), TOKENIZER, stories)
    assert wrong["correct"] == 0 and wrong["accuracy"] == 0.0 and wrong["ci95"][0] == 0.0
    target = story_ids(TOKENIZER, stories[3])
    first_repeat = stories[3].repeats[0]

    def right_once(row: list[int], t: int) -> int:
        return row[t + 1] if row[: len(target)] == target and t == first_repeat else eot

    one = name_repeat_accuracy(FakeModel(right_once), TOKENIZER, stories, batch_size=4)
    assert one["correct"] == 1 and one["total"] == wrong["total"]
    low, high = one["ci95"]
    assert 0 < low < one["accuracy"] < high < 1


def test_wilson_interval_matches_the_formula_at_known_points():
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: evaluation_stories(0), "needs at least 1 story, not 0"),
        (lambda: training_stories(-3, seed=0), "data.source.documents=-3 must be at least 1"),
        (lambda: SourceConfig(kind="induction", documents=0), "data.source.documents=0 must be at least 1"),
        (lambda: name_repeat_accuracy(FakeModel(lambda row, t: 0), TOKENIZER, []), "needs at least 1 story, not 0"),
        (
            lambda: name_repeat_accuracy(FakeModel(lambda row, t: 0), byte_tokenizer(), evaluation_stories(2)),
            "evaluate a model trained with data=induction",
        ),
    ],
)
def test_bad_inputs_are_one_sentence(make, message):
    with pytest.raises(UserError, match=message) as caught:
        make()
    assert str(caught.value).count(". ") == 0 and str(caught.value).endswith(".")


@pytest.mark.slow  # ~5 s: a whole run, trained and scored
def test_a_tiny_paper_induction_run_trains_and_is_scored(tmp_path: Path):
    overrides = [
        "experiment=paper_induction",
        "model=mtp2",
        "size=tiny",
        "data.source.documents=400",
        "data.seq_len=64",
        "data.batch_size=4",
        f"data.cache_dir={tmp_path / 'cache'}",
        "trainer.accelerator=cpu",
        "trainer.max_steps=3",
        "trainer.val_check_interval=3",
        "trainer.limit_val_batches=1",
        "trainer.enable_progress_bar=false",
        "optim.warmup_steps=1",
        "callbacks.decode_probe.prompts=0",
    ]
    cfg = compose_in(overrides, tmp_path)
    train(cfg)
    loaded = load_checkpoint(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt")
    assert loaded.tokenizer.get_vocab_size() == TOKENIZER.get_vocab_size() <= loaded.config.vocab_size == 512
    result = name_repeat_accuracy(loaded.model, loaded.tokenizer, evaluation_stories(8))
    assert result["total"] == sum(len(item.repeats) for item in evaluation_stories(8))
    assert 0.0 <= result["accuracy"] <= 1.0 and result["ci95"][0] <= result["accuracy"] <= result["ci95"][1]
    # mtp eval-task finds the task in the checkpoint and scores the same stories
    from mtp.commands import eval_task

    checkpoint = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
    eval_task.main([str(checkpoint), "--problems", "8", "--out", str(tmp_path / "eval"), "--device", "cpu"])
    scored = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert scored["task"] == "induction" and scored["rows"][0]["token"] == "second"
    assert (scored["rows"][0]["correct"], scored["rows"][0]["problems"]) == (result["correct"], result["total"])
