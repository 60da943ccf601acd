from dataclasses import fields

import pytest
import torch

from mtp.decode import GenerationConfig, generate
from mtp.decode.inference import InferenceModel
from mtp.decode.plan import Plan
from mtp.decode.settings import PARTS, DraftSettings, HeadsSettings
from mtp.decode.tree import DraftTree
from mtp.errors import SettingError
from tests.decode.helpers import HEAD_TYPES, fixed_logits_model, head1_logits, tiny_model

RAGGED = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [3, 3]]


def greedy(model, prompts, heads, max_new_tokens=24, **settings):
    return generate(model, prompts, Plan().changed(max_new_tokens=max_new_tokens, heads=heads, **settings))


def greedy_without_cache(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """The reference: head 1's argmax from a full forward over the whole sequence at every step, no cache."""
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            tokens.append(int(head1_logits(model, torch.tensor([tokens]))[0, -1].argmax()))
    return tokens[len(prompt) :]


@pytest.mark.parametrize(  # one prompt alone: transformer heads everyday, the other types with the slow tests
    ("prompts", "head_type"),
    [
        pytest.param(prompts, kind, id=f"{batch}-{kind}", marks=[pytest.mark.slow] if slow else [])
        for batch, prompts in (("batch1", [[5, 6, 7]]), ("ragged", RAGGED))
        for kind in HEAD_TYPES
        for slow in [batch == "batch1" and kind != "transformer"]
    ],
)
def test_greedy_decoding_equals_the_cache_free_reference_on_a_random_model(prompts, head_type):
    model = tiny_model(**HEAD_TYPES[head_type])
    reference = [greedy_without_cache(model, prompt, 24) for prompt in prompts]
    for heads in range(1, 5):
        out, stats = greedy(model, prompts, heads)
        assert out == reference, f"heads={heads}"
        assert heads == 1 or stats.drafted[0] > 0


@pytest.mark.parametrize("head_type", HEAD_TYPES)
def test_greedy_decoding_with_a_reduced_draft_vocabulary_equals_the_reference(head_type):
    """Heads 2..n drafting among 20 of the 40 tokens: their drafts pass or fail, head 1's output stays exact."""
    model = tiny_model(draft_vocab=20, **HEAD_TYPES[head_type])
    reference = [greedy_without_cache(model, prompt, 24) for prompt in RAGGED]
    chosen = set(model.draft_tokens.tolist())
    for heads in (2, 4):
        out, stats = greedy(model, RAGGED, heads)
        assert out == reference, f"heads={heads}"
        assert stats.drafted[0] > 0
    assert any(token not in chosen for row in reference for token in row)  # head 1 emits tokens no draft can


@pytest.mark.parametrize("head_type", HEAD_TYPES)
def test_greedy_decoding_with_a_draft_vocabulary_chosen_at_decoding_equals_the_reference(head_type):
    """Heads 2..n scoring only token ids 0..19 of 40 (GenerationConfig.draft_first_ids): their drafts pass or fail, head
    1's output stays exact, with tokens no draft can be."""
    model = tiny_model(**HEAD_TYPES[head_type])
    reference = [greedy_without_cache(model, prompt, 24) for prompt in RAGGED]
    for heads in (2, 4):
        out, stats = greedy(model, RAGGED, heads, draft_first_ids=20)
        assert out == reference, f"heads={heads}"
        assert stats.drafted[0] > 0
    assert any(token >= 20 for row in reference for token in row)


def test_a_draft_vocabulary_at_decoding_is_refused_beside_a_trained_one_or_beyond_the_vocabulary():
    trained = tiny_model(draft_vocab=20).config
    with pytest.raises(SettingError, match="trained to score its 20 most frequent tokens, and draft_first_ids=8 would"):
        HeadsSettings(heads=2, draft_first_ids=8).check_for(trained)
    with pytest.raises(SettingError, match="draft_first_ids=40 must be below the vocabulary's 40 tokens"):
        Plan(GenerationConfig(), heads=HeadsSettings(heads=2, draft_first_ids=40)).check(tiny_model().config, [[1]])


@pytest.mark.parametrize(  # linear: fixed-logits tests; causal-shared, medusa and causal alone (~4-5 s each) slow
    ("head_type", "prompts"),
    [
        pytest.param(kind, prompts, id=f"{batch}-{kind}", marks=[pytest.mark.slow] if slow else [])
        for batch, prompts in (("batch1", [[5, 6, 7]]), ("ragged", [[1, 2], [7, 8, 9, 10, 11], [20]]))
        for kind in ("transformer", "causal", "causal-shared", "medusa")
        for slow in [kind in ("causal-shared", "medusa") or (kind, batch) == ("causal", "batch1")]
    ],
)
def test_greedy_decoding_equals_the_cache_free_reference_when_drafts_pass(trained_models, prompts, head_type):
    trained_model = trained_models(head_type)
    reference = [greedy_without_cache(trained_model, prompt, 30) for prompt in prompts]
    for heads in range(1, 5):
        out, stats = greedy(trained_model, prompts, heads, max_new_tokens=30)
        assert out == reference, f"heads={heads}"
        assert heads == 1 or min(stats.acceptance) > 0.5  # the accepting branch really ran
    assert stats.tokens_per_forward > 2.5


@pytest.mark.parametrize("seed", range(4))
def test_greedy_self_speculative_equals_autoregressive_when_drafts_pass_and_fail_at_random(seed):
    """Random argmax tables over 5 tokens: drafts match by chance at any position, also after a rejected one."""
    tables = torch.randn(4, 5, 5, generator=torch.Generator().manual_seed(seed))
    model = fixed_logits_model(tables)
    prompts = [[0], [1, 2], [3, 4, 0, 1], [2]]
    reference = [greedy_without_cache(model, prompt, 20) for prompt in prompts]
    for heads in range(1, 5):
        out, _ = greedy(model, prompts, heads, max_new_tokens=20)
        assert out == reference, f"heads={heads}"


@pytest.mark.parametrize("head_type", ["transformer", "causal", "medusa"])
def test_each_row_equals_decoding_it_alone(head_type):
    model = tiny_model(**HEAD_TYPES[head_type])
    for config in (
        Plan(GenerationConfig(max_new_tokens=15), heads=HeadsSettings(heads=3)),
        Plan(GenerationConfig(15, temperature=1.0, seed=7), heads=HeadsSettings(heads=3)),
    ):
        batch, _ = generate(model, RAGGED, config)
        for row, prompt in enumerate(RAGGED):
            alone = config.changed(seed=config.sampling.seed + row)
            assert generate(model, [prompt], alone)[0][0] == batch[row]


def test_eos_and_length_stop_rows_independently(trained_model):
    reference, _ = greedy(trained_model, [[1, 2], [7, 8]], heads=1, max_new_tokens=12)
    eos = reference[0][4]
    config = Plan(GenerationConfig(max_new_tokens=12, eos_id=eos), heads=HeadsSettings(heads=4))
    out, stats = generate(trained_model, [[1, 2], [7, 8]], config)
    assert out[0] == reference[0][: reference[0].index(eos)]
    expected_second = reference[1][: reference[1].index(eos)] if eos in reference[1] else reference[1]
    assert out[1] == expected_second
    assert stats.tokens == sum(map(len, out))


def test_same_seed_same_output_other_seed_other_output():
    model = tiny_model()
    config = Plan(GenerationConfig(max_new_tokens=20, temperature=1.0, top_k=20, seed=1), heads=HeadsSettings(heads=4))
    first, _ = generate(model, RAGGED, config)
    assert generate(model, RAGGED, config)[0] == first
    assert generate(model, RAGGED, config.changed(seed=2))[0] != first


def test_stats_add_up(trained_model):
    out, stats = greedy(trained_model, [[3], [9, 10]], heads=4, max_new_tokens=40)
    assert stats.tokens == sum(map(len, out)) == 80
    assert all(a <= d for a, d in zip(stats.accepted, stats.drafted, strict=True))
    # every row-step emits 1 token plus its accepted drafts (the last step of a row may be cut by the budget)
    assert stats.row_forwards <= stats.tokens <= stats.row_forwards + sum(stats.accepted)
    assert stats.tokens_per_forward == pytest.approx(stats.tokens / stats.row_forwards)
    _, plain = greedy(trained_model, [[3]], heads=1, max_new_tokens=10)
    assert plain.tokens_per_forward == 1.0 and plain.forwards == 10 and plain.acceptance == []
    line = stats.line()
    assert "tokens/forward=" in line and "accept=" in line and "tokens/s=" in line and "forwards=" in line
    assert "ms/forward=" in line and "prefill_ms=" in line
    # ms/forward is the decoding steps' mean, the prompt's step apart
    decode_ms = stats.ms_per_forward * (stats.forwards - stats.prefills)
    assert decode_ms + 1000 * stats.prefill_s == pytest.approx(1000 * stats.wall_time_s)
    assert 0 < stats.prefill_s < stats.wall_time_s


def test_decoding_follows_weights_changed_in_place_once_the_model_is_told():
    """The packed inference form is reused across calls; weights written in between (an optimizer step, an edit) are
    decoded once the writer says so (``weights_changed``)."""
    model = tiny_model()
    before, _ = greedy(model, [[5, 6, 7]], heads=3)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.5 * torch.randn_like(parameter))
    model.weights_changed()
    out, _ = greedy(model, [[5, 6, 7]], heads=3)
    assert out == [greedy_without_cache(model, [5, 6, 7], 24)] != before


def test_decoding_follows_weights_written_where_no_counter_sees_once_the_model_is_told():
    """A write through ``.data``: ``weights_changed`` is the model's way to say it; a ``load_state_dict`` says it
    itself; a move to another dtype is seen."""
    model, other = tiny_model(), tiny_model(seed=1)
    greedy(model, [[5, 6, 7]], heads=3)
    for mine, theirs in zip(model.parameters(), other.parameters(), strict=True):
        mine.data.copy_(theirs.data)
    model.weights_changed()
    out, _ = greedy(model, [[5, 6, 7]], heads=3)
    assert out == [greedy_without_cache(other, [5, 6, 7], 24)]
    model.load_state_dict(tiny_model().state_dict())
    out, _ = greedy(model, [[5, 6, 7]], heads=3)
    assert out == [greedy_without_cache(model, [5, 6, 7], 24)] != [greedy_without_cache(other, [5, 6, 7], 24)]
    form = InferenceModel.of(model, 3)
    assert InferenceModel.of(model.double(), 3) is not form and InferenceModel.of(model.float(), 3) is not form


def test_a_released_model_keeps_no_form_and_decodes_the_same_after():
    """InferenceModel.release drops the forms built for a model (a training run's validation decodes, then trains on):
    none is held after it, the next decode builds a new one, and it decodes what it did before."""
    from mtp.decode.inference import _built

    model = tiny_model()
    before, _ = greedy(model, [[5, 6, 7]], heads=3)
    form = InferenceModel.of(model, 3)
    InferenceModel.release(model)
    assert model not in _built
    after, _ = greedy(model, [[5, 6, 7]], heads=3)
    assert after == before and InferenceModel.of(model, 3) is not form
    InferenceModel.release(tiny_model())  # a model never decoded: nothing to drop


def test_the_forms_of_one_models_weights_share_one_packed_path_and_drop_it_when_the_weights_change():
    """A benchmark decodes at k = 1..4 on the same weights: its forms share one packed trunk and head 1's unembedding
    (each a copy of the weights, with more copies derived from it), each still decoding autoregressive decoding's
    output; once the weights change, the forms of the old ones are dropped, not kept beside the new."""
    from mtp.decode.inference import _built

    model = tiny_model()
    reference = [greedy_without_cache(model, [5, 6, 7], 24)]
    assert all(greedy(model, [[5, 6, 7]], heads=k)[0] == reference for k in (1, 2, 3))
    forms = [InferenceModel.of(model, k) for k in (1, 2, 3)]
    assert all(form.path is forms[0].path and form.head1_output is forms[0].head1_output for form in forms)
    assert len(_built[model]) == 3
    model.weights_changed()
    fresh = InferenceModel.of(model, 2)
    assert fresh.path is not forms[0].path and fresh.head1_output is not forms[0].head1_output
    assert [form for _, form in _built[model].values()] == [fresh]


@pytest.mark.slow  # ~7 s: trains its own shared-depth model
def test_a_shared_causal_depth_drafts_beyond_the_trained_heads(trained_models):
    model = trained_models("causal-shared")
    prompts = [[1, 2], [7, 8, 9, 10, 11], [20]]
    reference = [greedy_without_cache(model, prompt, 30) for prompt in prompts]
    out, stats = greedy(model, prompts, heads=7, max_new_tokens=30)
    assert out == reference
    assert len(stats.acceptance) == 6 and stats.accepted[5] > 0  # depths 5..7, never trained, draft and pass


def test_eagle3_drafts_beyond_its_trained_depth(trained_models):
    """One layer drafts every depth: past the training-time test's unrolled steps too, greedy-exact."""
    model = trained_models("eagle3")
    prompts = [[1, 2], [7, 8, 9, 10, 11], [20]]
    reference = [greedy_without_cache(model, prompt, 30) for prompt in prompts]
    out, stats = greedy(model, prompts, heads=7, max_new_tokens=30)
    assert out == reference
    assert len(stats.acceptance) == 6 and stats.accepted[5] > 0  # depths 5..7, never trained, draft and pass


def test_drafting_beyond_the_trained_heads_needs_a_shared_depth():
    with pytest.raises(ValueError, match="share_depth"):
        greedy(tiny_model(head_type="causal"), [[1, 2]], heads=5)


@pytest.mark.parametrize("layout", [0, 1], ids=["x_at_W", "W_at_xT"])
@pytest.mark.parametrize("head_type", ["transformer", "causal"])
def test_greedy_decoding_equals_the_reference_in_either_matrix_layout(monkeypatch, trained_models, layout, head_type):
    """On CPU each product picks the layout measured faster (x @ W, or W @ x^T from matrices stored (out, in)); the
    choice depends on the machine, so each layout is forced here: both decode the reference's tokens, with drafts
    passing (the accepting branch), on a random model, and in ragged batches."""
    from mtp.decode import packed

    monkeypatch.setattr(packed, "faster_layout", lambda key, rows, products: layout)
    monkeypatch.setattr(packed, "_LAYOUTS", {})  # what earlier decodes measured: not consulted here
    weight_major, calls = packed.PackedBlocks.weight_major, []

    def counted(blocks):
        calls.append(blocks)
        return weight_major(blocks)

    monkeypatch.setattr(packed.PackedBlocks, "weight_major", counted)
    trained_model, prompts = trained_models(head_type), [[1, 2], [7, 8, 9, 10, 11], [20]]
    reference = [greedy_without_cache(trained_model, prompt, 30) for prompt in prompts]
    for heads in (1, 4):
        out, stats = greedy(trained_model, prompts, heads, max_new_tokens=30)
        assert out == reference, f"heads={heads}"
    assert stats.tokens_per_forward > 2.5
    random_model = tiny_model(**HEAD_TYPES[head_type])  # a cyclic model ignores much of attention; this one does not
    reference = [greedy_without_cache(random_model, prompt, 16) for prompt in RAGGED]
    for heads in (1, 4):
        assert greedy(random_model, RAGGED, heads, max_new_tokens=16)[0] == reference, f"heads={heads}"
    assert bool(calls) == bool(layout)  # the forced layout's matrices were the ones multiplied


def test_no_weight_major_copy_where_it_would_not_fit_in_memory(monkeypatch):
    """The faster layout may need a second copy of the blocks' matrices: where that copy would take more than a
    quarter of the memory available, decoding keeps the one layout without timing (and without the copy)."""
    from mtp.decode import inference, packed

    monkeypatch.setattr(packed, "_LAYOUTS", {})
    monkeypatch.setattr(packed, "available_bytes", lambda device: 1000)  # bytes: far below any copy
    timed = []
    monkeypatch.setattr(packed, "faster_layout", lambda key, rows, products: timed.append(key) or 1)
    model = tiny_model()
    reference = [greedy_without_cache(model, prompt, 8) for prompt in RAGGED]
    assert greedy(model, RAGGED, 4, max_new_tokens=8)[0] == reference
    assert not [key for key in timed if key[0] == "blocks"]  # the unembedding still times its own (no copy there)
    assert all(blocks._by_weight is None for blocks in inference.InferenceModel.of(model, 4, False, "auto", 0).path)


def test_generation_config_holds_sampling_and_acceptance_only():
    """Who drafts and how a step runs are settings of their own, each field owned by one part of a run."""
    assert [f.name for f in fields(GenerationConfig)] == [
        "max_new_tokens", "temperature", "top_k", "top_p", "eos_id", "seed", "acceptance", "typical_epsilon",
        "typical_delta",
    ]  # fmt: skip
    owned = [f.name for part in PARTS for f in fields(part)]
    assert len(owned) == len(set(owned))
    plan = [f.name for f in fields(Plan)]  # its parts, the drafter, and the tree or chain its step verifies
    assert plan == ["sampling", "heads", "drafter", "drafts", "step", "step_tree"] and len(plan) <= 8
    with pytest.raises(SettingError, match=r"^heads=0 must be at least 1\.$"):
        HeadsSettings(heads=0)
    with pytest.raises(SettingError, match=r"^drafts_per_step=0 must be at least 1\.$"):
        DraftSettings(drafts_per_step=0)
    with pytest.raises(SettingError, match="adaptive_drafts sizes chains; cut a tree with draft_p_min instead"):
        Plan(
            GenerationConfig(4),
            HeadsSettings(heads=3, tree=DraftTree.chain(2)),
            drafts=DraftSettings(adaptive_drafts=True),
        )
