"""The inference form with its KV cache computes what the full forward computes, at every position it is asked for."""

import pytest
import torch

from mtp.decode.inference import InferenceModel
from tests.decode import helpers


def tiny_model(**kwargs):
    """helpers.tiny_model with every norm weight away from 1, so that a norm weight lost in packing shows."""
    model = helpers.tiny_model(**kwargs)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.copy_(1 + 0.3 * torch.randn(parameter.shape, generator=generator))
    return model


def cached_step(inference: InferenceModel, tokens, cache, last):
    """Head 1's logits at every new position (B, S, V) and heads 2..k's at ``last`` (heads - 1, B, V), one step."""
    cache.begin(tokens.size(1))
    head1, trunk_out = inference.verify(tokens, cache)
    drafts = inference.draft(trunk_out, cache, torch.tensor(last)) if inference.heads > 1 else None
    cache.commit(tokens.size(1))
    return head1, drafts


def check_step(full, head1, drafts, rows_from: list[int], last: list[int]) -> None:
    """full: (n, B, T, V); row b of the step covers full positions rows_from[b] onwards."""
    for b, start in enumerate(rows_from):
        S = head1.size(1)
        torch.testing.assert_close(head1[b], full[0, b, start : start + S], rtol=1e-5, atol=1e-5)
        if drafts is not None:
            torch.testing.assert_close(
                drafts[:, b], full[1 : 1 + len(drafts), b, start + last[b]], rtol=1e-5, atol=1e-5
            )


@pytest.mark.parametrize(
    ("head_type", "compile"),
    [("transformer", False), ("linear", False), pytest.param("transformer", True, marks=pytest.mark.slow)],
    ids=["transformer", "linear", "transformer-compiled"],
)
def test_cached_steps_equal_the_full_forward_for_ragged_rows(head_type, compile):
    model = tiny_model(head_type=head_type)
    tokens = torch.randint(0, 40, (3, 14), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(tokens)  # (4, 3, 14, 40)
        inference = InferenceModel(model, heads=4, compile=compile)
        cache = inference.new_cache(3, 32)
        head1, drafts = cached_step(inference, tokens[:, :6], cache, last=[5, 3, 0])
        check_step(full, head1, drafts, [0, 0, 0], [5, 3, 0])
        # rows advance by different amounts: roll two rows back and re-feed what they dropped
        cache.rollback([6, 4, 2])
        refeed = torch.stack([tokens[0, 6:10], tokens[1, 4:8], tokens[2, 2:6]])
        head1, drafts = cached_step(inference, refeed, cache, last=[0, 3, 2])
        check_step(full, head1, drafts, [6, 4, 2], [0, 3, 2])
    assert cache.host_lengths == [10, 8, 6] and cache.lengths.tolist() == [10, 8, 6]


def test_fewer_heads_use_only_their_head_blocks():
    model = tiny_model()
    tokens = torch.randint(0, 40, (1, 5))
    with torch.no_grad():
        full = model(tokens)
        for heads in (1, 2, 3):
            inference = InferenceModel(model, heads)
            head1, drafts = cached_step(inference, tokens, inference.new_cache(1, 8), last=[4])
            check_step(full, head1, drafts, [0], [4])
            assert drafts is None or len(drafts) == heads - 1


def test_keep_rows_drops_finished_rows():
    model = tiny_model()
    tokens = torch.randint(0, 40, (3, 9))
    with torch.no_grad():
        full = model(tokens)
        inference = InferenceModel(model, heads=4)
        cache = inference.new_cache(3, 16)
        cached_step(inference, tokens[:, :5], cache, last=[4, 4, 4])
        cache.keep_rows([0, 2])
        head1, drafts = cached_step(inference, tokens[[0, 2], 5:], cache, last=[3, 1])
    check_step(full[:, [0, 2]], head1, drafts, [5, 5], [3, 1])
