import torch

from mtp.decode import KVCache
from tests.decode.helpers import tiny_model


def cached_logits(model, tokens, cache, n_heads):
    """All n_heads heads' logits (n_heads, B, S, V) from one cached forward."""
    head1, hidden = model.forward_cached(tokens, cache, n_heads)
    return torch.stack([head1] + [model.head_logits(k, h) for k, h in enumerate(hidden, start=2)])


def test_cached_forward_equals_full_forward_for_ragged_rows():
    model = tiny_model()
    tokens = torch.randint(0, 40, (3, 14))
    with torch.no_grad():
        full = model(tokens)  # (4, 3, 14, 40)
        cache = KVCache.for_model(model, 3, 32)
        cache.rollback([0, 0, 0])
        pieces = [cached_logits(model, tokens[:, :6], cache, 4)]
        # rows advance by different amounts: roll two rows back and re-feed what they dropped
        cache.rollback([6, 4, 2])
        refeed = torch.stack([tokens[0, 6:10], tokens[1, 4:8], tokens[2, 2:6]])
        again = cached_logits(model, refeed, cache, 4)
    torch.testing.assert_close(pieces[0], full[:, :, :6], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again[:, 0], full[:, 0, 6:10], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again[:, 1], full[:, 1, 4:8], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again[:, 2], full[:, 2, 2:6], rtol=1e-5, atol=1e-5)
    assert cache.host_lengths == [10, 8, 6] and cache.lengths.tolist() == [10, 8, 6]


def test_fewer_heads_skip_the_other_head_blocks():
    model = tiny_model()
    tokens = torch.randint(0, 40, (1, 5))
    with torch.no_grad():
        two = cached_logits(model, tokens, KVCache.for_model(model, 1, 8), 2)
        torch.testing.assert_close(two, model(tokens)[:2], rtol=1e-5, atol=1e-5)


def test_keep_rows_drops_finished_rows():
    model = tiny_model()
    tokens = torch.randint(0, 40, (3, 9))
    with torch.no_grad():
        full = model(tokens)
        cache = KVCache.for_model(model, 3, 16)
        cached_logits(model, tokens[:, :5], cache, 4)
        cache.keep_rows([0, 2])
        rest = cached_logits(model, tokens[[0, 2], 5:], cache, 4)
    torch.testing.assert_close(rest, full[:, [0, 2], 5:], rtol=1e-5, atol=1e-5)
