import pytest
import torch

from mtp.config import ModelConfig
from mtp.model import MTPModel


def tiny(**kwargs) -> ModelConfig:
    values = dict(vocab_size=61, d_model=32, n_layers=9, n_heads=4, n_kv_heads=2, n_future=4)
    values.update(kwargs)
    return ModelConfig(**values)


def n_params(config: ModelConfig) -> int:
    return sum(p.numel() for p in MTPModel(config).parameters())


@pytest.mark.parametrize("n_future", [2, 4, 8])
def test_parameter_count_matches_next_token_model(n_future):
    assert n_params(tiny(n_future=n_future)) == n_params(tiny(n_future=1))


def test_layout_follows_released_checkpoints():
    model = MTPModel(tiny(n_future=4))
    assert len(model.layers) == 6 and len(model.heads.layers) == 3
    assert model.head_block(1) is model.layers[-1]
    assert [model.head_block(k) for k in (2, 3, 4)] == list(model.heads.layers)  # heads 2..n in order
    assert len(model.heads.outputs) == 1 and model.tok_embeddings.weight is not model.heads.outputs[0].weight


def test_linear_heads_have_their_own_unembedding():
    model = MTPModel(tiny(n_future=3, head_type="linear"))
    assert len(model.layers) == 9 and model.heads.blocks() == [] and len(model.heads.outputs) == 3
    assert model.unembedding(2) is model.heads.outputs[1]


@pytest.mark.parametrize("head_type", ["transformer", "linear"])
def test_forward_shape(head_type):
    model = MTPModel(tiny(head_type=head_type))
    logits = model(torch.randint(0, 61, (2, 7)))
    assert logits.shape == (4, 2, 7, 61)


@pytest.mark.parametrize("head_type", ["transformer", "linear"])
def test_causal_a_change_at_t_never_changes_logits_before_t(head_type):
    torch.manual_seed(0)
    model = MTPModel(tiny(head_type=head_type)).double()
    idx = torch.randint(0, 61, (1, 12))
    t = 7
    changed = idx.clone()
    changed[0, t] = (idx[0, t] + 1) % 61
    with torch.no_grad():
        before, after = model(idx), model(changed)
    assert torch.equal(before[:, :, :t], after[:, :, :t])
    assert not torch.allclose(before[:, :, t], after[:, :, t])


def test_grouped_query_attention_matches_repeated_heads():
    """GQA through SDPA equals plain attention with each key/value head repeated."""
    torch.manual_seed(0)
    model = MTPModel(tiny(n_future=1, n_layers=2))
    attention = model.layers[0].attention
    x = torch.randn(2, 5, 32)
    cos, sin = model.rotary(5)
    expected_k = attention.wk(x).view(2, 5, 2, 8).repeat_interleave(2, dim=2)
    expected_v = attention.wv(x).view(2, 5, 2, 8).repeat_interleave(2, dim=2)
    from mtp.model.blocks import apply_rotary

    q = apply_rotary(attention.wq(x).view(2, 5, 4, 8).transpose(1, 2), cos, sin)
    k = apply_rotary(expected_k.transpose(1, 2), cos, sin)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, expected_v.transpose(1, 2), is_causal=True)
    torch.testing.assert_close(attention(x, cos, sin), attention.wo(y.transpose(1, 2).reshape(2, 5, 32)))


def test_causal_heads_follow_deepseek_v3():
    """h_k = Block_k(W_k [RMSNorm(Emb(t_{i+k-1})); RMSNorm(h_{k-1})]), written out by hand; logits through the shared
    norm and unembedding."""
    model = MTPModel(tiny(n_future=3, head_type="causal")).double()
    with torch.no_grad():
        for module in model.heads.inputs:  # norm weights away from 1, so that swapped norms show
            module.enorm.weight.uniform_(0.5, 1.5)
            module.hnorm.weight.uniform_(0.5, 1.5)
    window = torch.randint(0, 61, (2, 9))
    inputs, following = window[:, :7], torch.stack([window[:, 1:8], window[:, 2:9]])
    d = model.config.d_model

    def rms(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + model.config.norm_eps) * weight

    with torch.no_grad():
        logits = model(inputs, following=following)
        cos, sin = model.rotary(7)
        hidden = model.layers[-1](model.trunk(inputs), cos, sin)
        for k in (2, 3):
            module, block = model.heads.inputs[k - 2], model.heads.layers[k - 2]
            embedded = model.tok_embeddings(following[k - 2])
            w = module.eh_proj.weight
            mixed = rms(embedded, module.enorm.weight) @ w[:, :d].T + rms(hidden, module.hnorm.weight) @ w[:, d:].T
            hidden = block(mixed, cos, sin)
            expected = rms(hidden, model.norm.weight) @ model.heads.outputs[0].weight.T
            torch.testing.assert_close(logits[k - 1], expected)


def test_every_head_type_keeps_the_parameter_budget_where_it_counts_blocks():
    """causal heads count their blocks in n_layers like parallel ones; a shared depth is one block."""
    assert len(MTPModel(tiny(head_type="causal")).heads.layers) == 3
    shared = MTPModel(tiny(head_type="causal", share_depth=True))
    assert len(shared.heads.layers) == 1 and len(shared.layers) == 8 and len(shared.heads.inputs) == 1
    medusa = MTPModel(tiny(head_type="medusa"))
    assert len(medusa.layers) == 9 and len(medusa.heads.outputs) == 4 and len(medusa.heads.residuals) == 3
    assert all(
        torch.equal(o.weight, medusa.heads.outputs[0].weight) for o in medusa.heads.outputs
    )  # copies of head 1's
    assert all(layer.weight.abs().sum() == 0 for head in medusa.heads.residuals for layer in head.layers)
