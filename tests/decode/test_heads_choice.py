"""The count of drafting heads a run that does not name one decodes with (mtp.decode.methods.heads): the count with
the most expected tokens per millisecond of the acceptances and step times measured, autoregressive decoding where
the drafts do not pay; and the plans it leaves alone. The command's choice on a checkpoint:
tests/test_decode_scripts.py."""

import pytest

from mtp.decode.methods import Target, heads
from mtp.decode.methods.heads import allowed_counts, choose_heads, decided_heads, expected_tokens
from mtp.decode.plan import Plan


def test_the_count_with_the_most_expected_tokens_per_ms_drafts():
    # tokens/ms: k=1 1/3 = 0.333, k=2 1.8/4 = 0.45, k=3 2.4/5 = 0.48, k=4 2.8/7 = 0.4
    choice = choose_heads([0.8, 0.6, 0.4], {1: 3.0, 2: 4.0, 3: 5.0, 4: 7.0})
    assert choice.heads == 3
    assert [t.heads for t in choice.trials] == [1, 2, 3, 4]
    assert [t.expected_tokens for t in choice.trials] == pytest.approx([1.0, 1.8, 2.4, 2.8])
    line = choice.summary()
    assert line.startswith("drafting with 3 heads (k=3)")
    assert "k=1 3.00 ms/step 1.00 tokens/step" in line and "k=4 7.00 ms/step 2.80 tokens/step" in line


def test_autoregressive_decoding_wins_where_the_drafts_do_not_pay_for_their_steps():
    # tokens/ms: k=1 1/3 = 0.333, k=2 1.2/4.5 = 0.267, k=3 1.3/6 = 0.217, k=4 1.35/7.5 = 0.18
    choice = choose_heads([0.2, 0.1, 0.05], {1: 3.0, 2: 4.5, 3: 6.0, 4: 7.5})
    assert choice.heads == 1
    assert choice.summary().startswith("decoding autoregressively (k=1): the heads' drafts do not pay")
    # cheap drafting steps turn it round: k=4 1.35/3.1 = 0.435
    assert choose_heads([0.2, 0.1, 0.05], {1: 3.0, 2: 3.0, 3: 3.05, 4: 3.1}).heads == 4


def test_of_equally_fast_counts_the_fewest_heads_draft():
    assert choose_heads([1.0, 0.0], {1: 1.0, 2: 2.0, 3: 2.0}).heads == 1  # 1/1 = 2/2 = 2/2


def test_expected_tokens_sum_the_acceptance_of_each_position_which_is_already_cumulative():
    """DecodeStats.acceptance[j] counts a draft j + 1 accepted only after every draft before it was: the share of
    steps reaching depth j + 1, summed as it is (not multiplied again)."""
    assert expected_tokens([0.5, 0.25], 1) == 1.0
    assert expected_tokens([0.5, 0.25], 3) == pytest.approx(1.75)


def test_only_the_counts_the_plan_allows_are_weighed():
    assert allowed_counts(Plan().changed(heads=4)) == [1, 2, 3, 4]
    assert allowed_counts(Plan().changed(heads=3, draft_dtype="int8")) == [2, 3]  # int8 drafts need drafts


@pytest.mark.parametrize(
    ("plan", "choose"),
    [
        (Plan().changed(heads=4), False),  # --heads given
        (Plan().changed(heads=1), True),  # nothing to choose
        (Plan().changed(heads=4, adaptive_drafts=True), True),  # chains sized per step
        (Plan().changed(heads=4, draft_p_min=0.3), True),
    ],
)
def test_plans_that_name_or_size_their_drafts_are_left_as_they_are(plan, choose, monkeypatch):
    def refuse(*args):
        raise AssertionError("measured a plan it should leave alone")

    monkeypatch.setattr(heads, "fastest_heads", refuse)
    lines = []
    target = Target.of(None, plan, None, log=lines.append)
    assert decided_heads(target, [[1, 2]], choose=choose) is plan.heads
    assert lines == []


@pytest.mark.parametrize(("budget", "rounds"), [(0.0, 2), (float("inf"), 6)])
def test_each_count_is_timed_interleaved_within_the_budget_and_its_fastest_round_kept(monkeypatch, budget, rounds):
    runs = []

    class Stats:
        def __init__(self, ms):
            self.ms_per_forward = ms

    def timed(model, prompts, plan):
        runs.append(plan.heads.heads)
        assert [len(p) for p in prompts] == [heads.TIMING_CONTEXT]
        assert plan.sampling.max_new_tokens == heads.TIMING_TOKENS
        return None, Stats(10.0 * plan.heads.heads + (5.0 if len(runs) <= 3 else 0.0))  # the first round slower

    monkeypatch.setattr(heads, "generate", timed)
    monkeypatch.setattr(heads, "TIMING_BUDGET_S", budget)
    times = heads.time_heads(None, [list(range(100))], Plan().changed(heads=3), [1, 2, 3])
    assert runs == [1, 2, 3] * rounds and times == {1: 10.0, 2: 20.0, 3: 30.0}
