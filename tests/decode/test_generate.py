import itertools

import pytest
import torch

from mtp.decode import GenerationConfig, generate
from mtp.decode import generation as generate_module
from mtp.decode.sampling import processed_probs
from tests.decode.helpers import tiny_model

RAGGED = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [3, 3]]


def greedy(model, prompts, heads, max_new_tokens=24):
    return generate(model, prompts, GenerationConfig(max_new_tokens=max_new_tokens, heads=heads))


@pytest.mark.parametrize("prompts", [[[5, 6, 7]], RAGGED], ids=["batch1", "ragged"])
def test_greedy_self_speculative_equals_autoregressive_on_a_random_model(prompts):
    model = tiny_model()
    reference, _ = greedy(model, prompts, heads=1)
    for heads in range(2, 5):
        out, stats = greedy(model, prompts, heads)
        assert out == reference, f"heads={heads}"
        assert stats.drafted[0] > 0


@pytest.mark.parametrize("prompts", [[[5, 6, 7]], [[1, 2], [7, 8, 9, 10, 11], [20]]], ids=["batch1", "ragged"])
def test_greedy_self_speculative_equals_autoregressive_when_drafts_pass(trained_model, prompts):
    reference, _ = greedy(trained_model, prompts, heads=1, max_new_tokens=30)
    for heads in range(2, 5):
        out, stats = greedy(trained_model, prompts, heads, max_new_tokens=30)
        assert out == reference, f"heads={heads}"
        assert min(stats.acceptance) > 0.5  # the accepting branch really ran
    assert stats.tokens_per_forward > 2.5


def test_each_row_equals_decoding_it_alone():
    model = tiny_model()
    for config in (
        GenerationConfig(max_new_tokens=15, heads=3),
        GenerationConfig(15, temperature=1.0, heads=3, seed=7),
    ):
        batch, _ = generate(model, RAGGED, config)
        for row, prompt in enumerate(RAGGED):
            alone = GenerationConfig(**{**config.__dict__, "seed": config.seed + row})
            assert generate(model, [prompt], alone)[0][0] == batch[row]


def test_eos_and_length_stop_rows_independently(trained_model):
    reference, _ = greedy(trained_model, [[1, 2], [7, 8]], heads=1, max_new_tokens=12)
    eos = reference[0][4]
    config = GenerationConfig(max_new_tokens=12, heads=4, eos_id=eos)
    out, stats = generate(trained_model, [[1, 2], [7, 8]], config)
    assert out[0] == reference[0][: reference[0].index(eos)]
    expected_second = reference[1][: reference[1].index(eos)] if eos in reference[1] else reference[1]
    assert out[1] == expected_second
    assert stats.tokens == sum(map(len, out))


def test_same_seed_same_output_other_seed_other_output():
    model = tiny_model()
    config = GenerationConfig(max_new_tokens=20, temperature=1.0, top_k=20, heads=4, seed=1)
    first, _ = generate(model, RAGGED, config)
    assert generate(model, RAGGED, config)[0] == first
    assert generate(model, RAGGED, GenerationConfig(**{**config.__dict__, "seed": 2}))[0] != first


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


def test_processed_probs_masks():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]])
    top2 = processed_probs(logits, 1.0, top_k=2)
    assert (top2[0, 2:] == 0).all() and top2.sum().item() == pytest.approx(1.0)
    full = torch.softmax(logits, -1)[0]
    nucleus = processed_probs(logits, 1.0, top_p=0.8)[0]
    kept = nucleus > 0
    assert full[kept].sum() >= 0.8 and full[kept][:-1].sum() < 0.8 if kept.sum() > 1 else True
    assert kept.tolist() == [True, True, False, False, False] or kept.tolist() == [True, True, True, False, False]
    cold = processed_probs(logits, 0.1)
    assert cold[0, 0] > 0.99


def sequences_from(model, config, n_rows, prompt):
    out, _ = generate(model, [prompt] * n_rows, config)
    return [tuple(row) for row in out]


def exact_joint(model, prompt, config, length):
    """Probability of every continuation of `length` tokens under autoregressive sampling from head 1."""
    vocab = model.config.vocab_size
    joint = {}
    with torch.no_grad():
        for continuation in itertools.product(range(vocab), repeat=length):
            tokens = torch.tensor([prompt + list(continuation)])
            probs = processed_probs(model(tokens)[0, 0], config.temperature, config.top_k, config.top_p)
            p = 1.0
            for i, token in enumerate(continuation):
                p *= probs[len(prompt) - 1 + i, token].item()
            joint[continuation] = p
    return joint


def total_variation(samples, joint):
    counts = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    return 0.5 * sum(abs(counts.get(k, 0) / len(samples) - p) for k, p in joint.items())


@pytest.fixture(scope="module")
def peaked_model():
    """Vocabulary 4, 3 heads, logits scaled up so that heads disagree sharply with head 1's conditionals."""
    model = tiny_model(n_future=3, vocab_size=4, seed=3)
    with torch.no_grad():
        model.outputs[0].weight.mul_(60)
    return model


N_SAMPLES = 12_000
TOLERANCE = 0.035  # total variation; sampling noise at this size is about 0.01, a wrong rule gives > 0.1


@pytest.mark.parametrize("filters", [{}, {"top_k": 3}, {"top_p": 0.9}], ids=["plain", "top_k", "top_p"])
def test_lossless_sampling_matches_the_exact_distribution(peaked_model, filters):
    config = GenerationConfig(max_new_tokens=3, temperature=1.0, heads=3, seed=11, **filters)
    joint = exact_joint(peaked_model, [1, 2], config, 3)
    speculative = sequences_from(peaked_model, config, N_SAMPLES, [1, 2])
    autoregressive = sequences_from(
        peaked_model, GenerationConfig(**{**config.__dict__, "heads": 1}), N_SAMPLES, [1, 2]
    )
    assert total_variation(autoregressive, joint) < TOLERANCE
    assert total_variation(speculative, joint) < TOLERANCE
    assert all(joint[s] > 0 for s in speculative)  # never a token that top-k / top-p removed


def test_a_wrong_acceptance_rule_fails_the_same_check(peaked_model, monkeypatch):
    config = GenerationConfig(max_new_tokens=3, temperature=1.0, heads=3, seed=11)
    joint = exact_joint(peaked_model, [1, 2], config, 3)
    monkeypatch.setattr(generate_module, "accept_drafts", lambda u, p, q: u < 1)  # accepts every draft
    assert total_variation(sequences_from(peaked_model, config, N_SAMPLES, [1, 2]), joint) > 2 * TOLERANCE
