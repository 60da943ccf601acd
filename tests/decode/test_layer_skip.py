"""Layer-skip drafts over attention and MLP sublayers (Draft & Verify): the draft computes what the model's own modules
compute with those sublayers skipped; greedy output equals autoregressive output and sampling stays lossless; the
flags' sets parse or are refused in one sentence; the searches choose the same set twice and keep to their budgets."""

import pytest
import torch

from mtp.commands.cli import settings_named_by_flags
from mtp.decode import GenerationConfig, generate
from mtp.decode.inference import InferenceModel, skip_label, sublayers_of
from mtp.decode.methods import layer_skip as drafter_setup
from mtp.decode.methods import layer_skip as skip_search_module
from mtp.decode.methods.layer_skip import DraftCosts, Trials, layer_skip_drafter, search_blocks, search_sublayers
from mtp.decode.plan import Plan
from mtp.decode.settings import DraftSettings, HeadsSettings
from mtp.errors import UserError
from tests.decode.helpers import head1_logits, tiny_model
from tests.decode.test_lossless import check_real_model
from tests.decode.test_tree import partly_trained

SKIP_SETS = {
    "attention": {(0, "a"), (2, "a")},
    "mlp": {(0, "m"), (2, "m")},
    "mixed": {(0, "a"), (1, "m"), 2},  # block 0's MLP and block 1's attention left
    "blocks": {1},
}
"""Sets over the 3 blocks of head 1's path of the tiny 4-head models."""


def skipped_head1_logits(model, tokens: torch.Tensor, skip) -> torch.Tensor:
    """Head 1's logits (B, T, V) from a full forward of the model's own modules, no cache, without the sublayers
    ``skip`` ((block, 'a' or 'm'); a block index for both)."""
    skip = sublayers_of(skip)
    cos, sin = model.rotary(tokens.size(1))
    with torch.no_grad():
        x = model.tok_embeddings(tokens)
        for i, block in enumerate(model.layers):
            if (i, "a") not in skip:
                x = x + block.attention(block.attention_norm(x), cos, sin)
            if (i, "m") not in skip:
                x = x + block.feed_forward(block.ffn_norm(x))
        return model.unembedding(1)(model.norm(x))


@pytest.fixture(scope="module")
def counting_target():
    return partly_trained("transformer")


@pytest.mark.parametrize("case", SKIP_SETS)
def test_sublayer_draft_logits_equal_the_modules_with_those_sublayers_skipped(case):
    """The draft form, fed a ragged batch in steps through its own cache, gives at every position the logits of the
    model's own modules with the same sublayers skipped: a sublayer skipped in place of another, or a cache slot read
    by the wrong block, fails it."""
    model, skip = tiny_model(seed=2), SKIP_SETS[case]
    tokens = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(skipped_head1_logits(model, tokens, set()), head1_logits(model, tokens))  # the reference
    expected = skipped_head1_logits(model, tokens, skip)
    form = InferenceModel.of(model, 1).skipping(skip)
    attending = 3 - sum(half == "a" for _, half in sublayers_of(skip))
    cache = form.new_cache(2, 16)
    assert cache.keys.size(0) == attending  # a cache slot for each block whose attention runs, none for the others
    held = 0
    for width in (4, 1, 3, 1):
        cache.begin(width)
        logits, _ = form.verify(tokens[:, held : held + width], cache)
        cache.commit(width)
        torch.testing.assert_close(logits, expected[:, held : held + width], atol=1e-5, rtol=1e-5, msg=case)
        held += width
    cache.rollback([5, 7])  # rows rolled back to different lengths read on from there
    cache.begin(1)
    logits, _ = form.verify(torch.stack([tokens[0, 5:6], tokens[1, 7:8]]), cache)
    torch.testing.assert_close(logits[:, 0], torch.stack([expected[0, 5], expected[1, 7]]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", SKIP_SETS)
def test_greedy_sublayer_skip_equals_autoregressive(case, counting_target):
    model = counting_target
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 40, (n,), generator=generator).tolist() for n in (5, 2, 9, 3)]
    reference, _ = generate(model, prompts, Plan(GenerationConfig(40), HeadsSettings(heads=1)))
    drafter = layer_skip_drafter(model, SKIP_SETS[case], gamma=4)
    out, stats = generate(model, prompts, Plan(GenerationConfig(40), drafter=drafter))
    assert out == reference
    assert 0 < sum(stats.accepted) < sum(stats.drafted)  # drafts pass at some steps, not at all
    assert stats.method == "layerskip" and stats.method_params["skip"] == skip_label(SKIP_SETS[case])
    alone, _ = generate(
        model,
        prompts[2:3],
        Plan(GenerationConfig(40), drafter=drafter.with_gamma(3), drafts=DraftSettings(adaptive_drafts=True)),
    )
    assert alone == reference[2:3]


def test_skip_sets_are_labelled_as_the_flags_write_them():
    assert skip_label({(3, "a"), (5, "m"), 7, (1, "a"), (1, "m")}) == "1,3a,5m,7"
    assert skip_label({1, 3}) == "1,3"  # whole blocks as before
    with pytest.raises(ValueError, match="neither a block index"):
        sublayers_of({(1, "x")})


def test_sublayer_skip_sampling_lossless_on_a_real_model():
    """Attention everywhere: every context changes the logits, so the draft's cache and ragged acceptance matter."""
    model = tiny_model(n_future=1, vocab_size=4, seed=3)
    with torch.no_grad():
        model.heads.outputs[0].weight.mul_(60)  # peaked distributions, so that drafts disagree with the target
    drafter = layer_skip_drafter(model, {(0, "a"), (1, "m")}, gamma=2)
    stats = check_real_model(model, Plan(GenerationConfig(max_new_tokens=4, temperature=1.0, seed=5), drafter=drafter))
    assert 0 < sum(stats.accepted) < sum(stats.drafted)


@pytest.mark.slow
def test_compiled_sublayer_skip_equals_autoregressive(counting_target):
    prompts = [[3, 9, 1, 4, 4], [7]]
    reference, _ = generate(counting_target, prompts, Plan(GenerationConfig(12), HeadsSettings(heads=1)))
    drafter = layer_skip_drafter(counting_target, SKIP_SETS["mixed"], compile=True, gamma=3)
    out, _ = generate(counting_target, prompts, Plan(GenerationConfig(12), drafter=drafter))
    assert out == reference


# -- the flags
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", {(1, "a"), (1, "m")}),
        ("0a,2m", {(0, "a"), (2, "m")}),
        ("0a, 1,2m", {(0, "a"), (1, "a"), (1, "m"), (2, "m")}),
        ("0a,0m,1a,1m,2a", {(0, "a"), (0, "m"), (1, "a"), (1, "m"), (2, "a")}),  # all but one sublayer
    ],
)
def test_skip_sets_parse(text, expected):
    assert drafter_setup.parse_skip_layers(text, tiny_model()) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1x", "--skip-layers '1x' must be blocks such as 2,4,5, sublayers such as 3a,5m (a: attention, m: MLP), or "
         "auto."),
        ("1,,2", "--skip-layers '1,,2' must be blocks such as 2,4,5"),
        ("a1", "--skip-layers 'a1' must be blocks such as 2,4,5"),
        ("3a", "--skip-layers 3a must name some but not all of the 3 blocks of head 1's path (0..2: the trunk, then"),
        ("0,1,2", "--skip-layers 0,1,2 must name some but not all"),
        ("0,1a,1m,2", "must name some but not all of the 3 blocks of head 1's path (0..2: the trunk, then head 1's own "
         "block) or of their sublayers (3a, 5m)."),
    ],
)  # fmt: skip
def test_bad_skip_sets_are_one_sentence(text, message):
    """The set's errors name the setting; the commands spell it as their flag."""
    with pytest.raises(UserError, match=__import__("re").escape(message)), settings_named_by_flags():
        drafter_setup.parse_skip_layers(text, tiny_model())


def search_settings(**given) -> drafter_setup.LayerSkipSettings:
    with settings_named_by_flags():
        return drafter_setup.LayerSkipSettings(**given)


def test_bad_search_settings_are_one_sentence_naming_their_flags(monkeypatch):
    with pytest.raises(UserError, match="--skip-sublayers chooses how --skip-layers auto searches; add --skip-layers"):
        search_settings(skip_layers="1,2", skip_sublayers=True)
    with pytest.raises(UserError, match="--skip-sublayers chooses how --skip-layers auto searches"):
        search_settings(skip_sublayers=True)  # no set at all
    with pytest.raises(UserError, match="--search-trials 0 must be at least 1."):
        search_settings(skip_layers="auto", search_trials=0)
    with pytest.raises(UserError, match="--search-seconds 0 must be above 0."):
        search_settings(skip_layers="auto", search_seconds=0.0)
    found = drafter_setup.importlib.util.find_spec
    monkeypatch.setattr(
        drafter_setup.importlib.util, "find_spec", lambda name, *a: None if name == "optuna" else found(name, *a)
    )
    with pytest.raises(UserError, match=r"Optuna, which is not installed; .*pip install -e '\.\[search\]'\."):
        search_settings(skip_layers="auto", skip_sublayers=True)
    search_settings(skip_layers="auto")  # the block search needs no extra


# -- the searches
COSTS = DraftCosts(step_ms=1.0, head=0.1, attention=0.12, feed_forward=0.15)
"""Stand-in costs (a target step's units): the search's objective is then a function of the counts alone."""


@pytest.fixture(scope="module")
def search_prompts():
    generator = torch.Generator().manual_seed(4)
    return [torch.randint(0, 40, (n,), generator=generator).tolist() for n in (7, 3)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_sublayer_search_finds_the_same_set_twice_within_its_budget(
    temperature, counting_target, search_prompts, monkeypatch
):
    pytest.importorskip("optuna", reason="the sublayer search needs the search extra: pip install -e '.[search]'")
    decoded, suggested = [], []  # every set the searches decode, every set their samplers suggest
    decode_with, call = skip_search_module.decode_with, Trials.__call__
    monkeypatch.setattr(skip_search_module, "decode_with", lambda *args: decoded.append(args[-1]) or decode_with(*args))
    monkeypatch.setattr(Trials, "__call__", lambda self, skip: suggested.append(skip) or call(self, skip))

    def config(drafter):
        return Plan(GenerationConfig(8, temperature, seed=7), drafter=drafter)

    found, runs = [], []
    for _ in range(2):
        trials, before = Trials(counting_target, search_prompts, config, 3, COSTS), (len(decoded), len(suggested))
        result = search_sublayers(trials, budget=12, seconds=600, seed=7, log=lambda line: None)
        assert 1 <= result.evaluated == len(trials.seen) == len(decoded) - before[0] <= 12  # each set decoded once
        times = {skip: trials.time_per_token(trial) for skip, trial in trials.seen.items()}
        assert times[result.skip] == min(times.values())  # the best set it decoded
        assert result.ms_per_token == pytest.approx(times[result.skip] * COSTS.step_ms)
        found.append((result.skip, result.trial))
        runs.append(suggested[before[1] :])
    assert found[0] == found[1]  # the same set, with the same counts
    assert runs[0] == runs[1]  # after the same suggestions, in the same order
    assert runs[0][:3] == [sublayers_of({block}) for block in range(3)]  # starting from one whole block each


def test_the_block_search_is_greedy_forward_selection(counting_target, search_prompts):
    def config(drafter):
        return Plan(GenerationConfig(8), drafter=drafter)

    trials = Trials(counting_target, search_prompts, config, 3, COSTS)
    lines = []
    result = search_blocks(trials, seconds=600, log=lines.append)
    blocks = sorted({b for b, _ in result.skip})
    assert result.skip == sublayers_of(blocks) and 1 <= len(blocks) <= 2  # whole blocks, not all
    first_round = {b: trials.time_per_token(trials({b})) for b in range(3)}
    assert min(first_round.values()) >= trials.time_per_token(result.trial)
    assert len(lines) == len(blocks) + (len(blocks) < 2) and "skip-layers search: skipping" in lines[0]
    again = search_blocks(Trials(counting_target, search_prompts, config, 3, COSTS), seconds=600, log=lines.append)
    assert again.skip == result.skip


def test_measured_costs_are_rounded_shares_of_a_step(counting_target, search_prompts):
    threads = torch.get_num_threads()
    costs = skip_search_module.measure_costs(counting_target, search_prompts[0], 2, rounds=3)
    assert costs.step_ms > 0 and torch.get_num_threads() == threads  # timed on one thread, then as it was
    for cost, measured in zip((costs.head, costs.attention, costs.feed_forward), costs.measured, strict=True):
        steps = cost / skip_search_module.COST_RESOLUTION
        assert measured >= 0 and abs(steps - round(steps)) < 1e-9 and abs(cost - measured) <= 0.005 + 1e-9
