import pytest
import torch

from mtp.model import MTPModel
from mtp.model.config import ModelConfig


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


@pytest.mark.parametrize("first_token", ["keep", "zero"])
def test_causal_heads_follow_deepseek_v3(first_token):
    """h_k = Block_k(W_k [RMSNorm(Emb(t_{i+k-1})); RMSNorm(h_{k-1})]), written out by hand; logits through the shared
    norm and unembedding. With ``causal_first_token=zero`` the embedding read at position 0 is a zero vector (vLLM's
    MiMo layer)."""
    model = MTPModel(tiny(n_future=3, head_type="causal", causal_first_token=first_token)).double()
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
            if first_token == "zero":
                embedded[:, 0] = 0
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


def test_eagle3_heads_draft_as_eagle3_decodes():
    """EAGLE-3 written out by hand, one position and one draft at a time as a decoder runs it (vLLM's
    llama_eagle3.py): the fused state f_i = fc([x_a(i); x_b(i); x_c(i)]) of the inputs of trunk layers a, b, c; the
    layer's cache holds, at every position p <= i, keys and values of [RMSNorm(Emb(t_{p+1})); RMSNorm(f_p)]; draft 1
    from i is the layer's output at i, h = f_i + Attention(...), out = h + SwiGLU(RMSNorm(h)), through its own norm
    and unembedding; draft j + 1 reads draft j's output state and token t_{i+j+1} at position i + j, attending to
    the cache and to its own chain's entries at i+1..i+j. Every head's logits equal the training forward's (the
    training-time test's masked attention over the unrolled steps)."""
    torch.manual_seed(0)
    model = MTPModel(tiny(n_future=4, head_type="eagle3", eagle3_layers=[5, 0, 3])).double()
    with torch.no_grad():
        for name, p in model.named_parameters():  # norm weights away from 1, so that a swapped or lost norm shows
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    layer, heads = model.heads.layer, model.heads
    a, d, eps = layer.attention, model.config.d_model, model.config.norm_eps
    window = torch.randint(0, 61, (1, 12))
    inputs, following = window[:, :9], torch.stack([window[:, j : j + 9] for j in (1, 2, 3)])

    def rms(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def rotate(x, position):  # x (heads, head_dim), Llama's halves
        cos, sin = model.rope_cos[position], model.rope_sin[position]
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def entry(token, state, position):  # (q, k, v) of the layer at one position, heads split, q and k rotated
        x = torch.cat([rms(model.tok_embeddings.weight[token], layer.attention_norm.embedding_norm.weight),
                       rms(state, layer.attention_norm.state_norm.weight)])  # fmt: skip
        q = rotate((a.wq.weight @ x).view(a.n_heads, a.head_dim), position)
        k = rotate((a.wk.weight @ x).view(a.n_kv_heads, a.head_dim), position)
        return q, k, (a.wv.weight @ x).view(a.n_kv_heads, a.head_dim)

    def layer_out(q, keys, values, state):  # attention over the given entries, then the residual and SwiGLU
        group = a.n_heads // a.n_kv_heads
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)  # (n, heads, hd)
        scores = torch.einsum("hd,nhd->hn", q, keys) / a.head_dim**0.5
        y = torch.einsum("hn,nhd->hd", scores.softmax(dim=-1), values).reshape(-1)
        h = state + a.wo.weight @ y
        f = layer.feed_forward
        g = rms(h, layer.ffn_norm.weight)
        return h + f.w2.weight @ (torch.nn.functional.silu(f.w1.weight @ g) * (f.w3.weight @ g))

    with torch.no_grad():
        logits = model(inputs, following=following)  # (4, 1, 9, 61)
        x, layer_inputs = model.tok_embeddings(inputs), []
        cos, sin = model.rotary(9)
        for block in model.layers:
            layer_inputs.append(x)
            x = block(x, cos, sin)
        torch.testing.assert_close(logits[0, 0], rms(x[0], model.norm.weight) @ heads.outputs[0].weight.T)
        fused = heads.fc(torch.cat([layer_inputs[i] for i in (5, 0, 3)], dim=-1))[0]  # (9, d)
        text = window[0].tolist()
        cache = [entry(text[p + 1], fused[p], p) for p in range(9)]  # (q, k, v) of each position's first step
        for i in range(9):
            chain_keys, chain_values, state = [], [], fused[i]
            for j in range(3):  # draft j + 1 from i, at position i + j
                q, k, v = cache[i] if j == 0 else entry(text[i + j + 1], state, i + j)
                if j:
                    chain_keys.append(k)
                    chain_values.append(v)
                keys = torch.stack([c[1] for c in cache[: i + 1]] + chain_keys)
                values = torch.stack([c[2] for c in cache[: i + 1]] + chain_values)
                state = layer_out(q, keys, values, state)
                expected = rms(state, heads.norm.weight) @ heads.outputs[1].weight.T
                torch.testing.assert_close(logits[j + 1, 0, i], expected)
    assert d == 32 and heads.fc.weight.shape == (32, 96) and a.wq.weight.shape == (32, 64)


@pytest.mark.parametrize("head_type", ["transformer", "linear", "causal", "medusa", "eagle3"])
def test_next_token_logits_are_head_ones_without_the_following_tokens(head_type):
    """What a caller asks of the model's own next-token prediction (a near-tie's margin, an export's check) needs no
    following tokens, which causal and EAGLE-3 heads read for heads 2..n."""
    torch.manual_seed(0)
    extra = {"eagle3_layers": [5, 0, 3]} if head_type == "eagle3" else {}
    model = MTPModel(tiny(head_type=head_type, draft_vocab=17 if head_type == "eagle3" else 0, **extra)).double()
    window = torch.randint(0, 61, (2, 12))
    idx, following = window[:, :9], torch.stack([window[:, j : j + 9] for j in (1, 2, 3)])
    with torch.no_grad():
        torch.testing.assert_close(model.next_token_logits(idx), model(idx, following)[0], rtol=0, atol=1e-12)
