"""Decoding statistics add up over runs (batches), so that a benchmark's totals are its runs' sums."""

import pytest

from mtp.decode import DecodeStats, GenerationConfig, generate
from mtp.decode.plan import Plan
from mtp.decode.settings import HeadsSettings
from mtp.decode.tree import DraftTree
from tests.decode.helpers import tiny_model


def test_statistics_of_two_runs_add_up():
    model = tiny_model(4)
    config = Plan(
        GenerationConfig(max_new_tokens=12), heads=HeadsSettings(heads=4, tree=DraftTree([(0,), (1,), (0, 0)]))
    )
    _, a = generate(model, [[1, 2, 3]], config)
    _, b = generate(model, [[4, 5], [6]], config)
    total = sum([a, b], DecodeStats.empty(a))
    assert (total.rows, total.tokens, total.forwards, total.prefills) == (
        3,
        a.tokens + b.tokens,
        a.forwards + b.forwards,
        2,
    )
    assert total.drafted == [x + y for x, y in zip(a.drafted, b.drafted, strict=True)]
    assert total.accepted == [x + y for x, y in zip(a.accepted, b.accepted, strict=True)]
    assert total.accepted_nodes == a.accepted_nodes + b.accepted_nodes and total.tree_nodes == 3
    assert total.wall_time_s == pytest.approx(a.wall_time_s + b.wall_time_s)
    assert total.tokens_per_forward == pytest.approx((a.tokens + b.tokens) / (a.row_forwards + b.row_forwards))


def test_statistics_of_different_settings_do_not_add():
    model = tiny_model(4)
    _, chain = generate(model, [[1, 2]], Plan(GenerationConfig(max_new_tokens=4), heads=HeadsSettings(heads=4)))
    _, autoregressive = generate(model, [[1, 2]], Plan(GenerationConfig(max_new_tokens=4)))
    with pytest.raises(ValueError, match="same settings"):
        chain + autoregressive


@pytest.mark.parametrize(
    ("settings", "shown"),
    [
        ({"acceptance": "typical"}, "acceptance=greedy"),  # temperature 0 ignores the rule asked for
        ({}, "acceptance=greedy"),
        ({"acceptance": "typical", "temperature": 0.8}, "acceptance=typical(lossy)"),
        ({"temperature": 0.8}, "acceptance=exact"),
    ],
)
def test_the_stats_line_names_the_acceptance_rule_that_ran(settings, shown):
    _, stats = generate(tiny_model(4), [[1, 2, 3]], Plan().changed(max_new_tokens=4, heads=4, **settings))
    assert f" {shown} " in stats.line()


def test_the_decoding_rate_leaves_the_time_spent_capturing_steps_out():
    """A step shape captured as a CUDA graph costs once (capture_s): shown apart, not in tokens/s or ms/forward."""
    stats = DecodeStats(rows=1, forwards=11, tokens=20, wall_time_s=3.0, prefill_s=0.5, captures=2, capture_s=2.0)
    assert stats.tokens_per_s == pytest.approx(20 / 1.0) and stats.ms_per_forward == pytest.approx(1000 * 0.5 / 10)
    assert "captures=2 capture_ms=2000.0" in stats.line()
    total = stats + stats
    assert (total.captures, total.capture_s, total.tokens_per_s) == (4, 4.0, pytest.approx(40 / 2.0))
