"""Tiny models for the decoding tests."""

import torch

from mtp.model import MTPModel
from mtp.model.config import ModelConfig


def tiny_model(n_future: int = 4, vocab_size: int = 40, seed: int = 0, **kwargs) -> MTPModel:
    torch.manual_seed(seed)
    config = ModelConfig(
        vocab_size=vocab_size, d_model=32, n_layers=n_future + 2, n_heads=4, n_kv_heads=2, n_future=n_future, **kwargs
    )
    model = MTPModel(config).eval()
    if config.draft_vocab:  # a random subset, so that an index taken for a token id shows
        chosen = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(seed))[: config.draft_vocab]
        model.draft_tokens.copy_(chosen.sort().values)
    return model


HEAD_TYPES = {
    "transformer": {},
    "linear": {"head_type": "linear"},
    "causal": {"head_type": "causal"},
    "causal-shared": {"head_type": "causal", "share_depth": True},
    "medusa": {"head_type": "medusa", "medusa_layers": 2},
    "eagle3": {"head_type": "eagle3", "eagle3_layers": [2, 0, 1]},  # out of order: a feature read out of place shows
}
"""Settings of every head type (and variant) that decoding tests run on."""


def head1_logits(model: MTPModel, tokens: torch.Tensor) -> torch.Tensor:
    """Head 1's logits (B, T, V) from a full forward, no cache (causal heads' conditioning never reaches head 1)."""
    following = tokens.new_zeros(model.n_future - 1, *tokens.shape)
    with torch.no_grad():
        return model.unembedding(1)(model.head_states(tokens, following)[0])


def train_on_cycles(model: MTPModel, steps: int = 100) -> MTPModel:
    """Train on counting windows (token t+1 = token t + 1), so that most drafts are accepted."""
    from mtp.training.loss import mtp_loss

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        loss = mtp_loss(model, cyclic_windows(16, 24, model.config.vocab_size, generator)).total
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval()


def cyclic_windows(batch: int, length: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """Token t+1 = token t + 1 (mod vocab), from random starts: every head can learn its offset exactly."""
    starts = torch.randint(0, vocab, (batch, 1), generator=generator)
    return (starts + torch.arange(length)) % vocab


NEVER = -1e4
"""A logit that softmax turns into exactly 0 in float32: a token outside a distribution's support."""


def fixed_logits_model(tables: torch.Tensor) -> MTPModel:
    """A real MTPModel whose head k gives the logits ``tables[k - 1, a]`` after token a, whatever came before.

    tables: (n_future, V, V). Linear heads on an identity trunk (attention and feed-forward outputs zeroed),
    one-hot embeddings: the shared norm turns token a's embedding into sqrt(d) * e_a, and column a of
    unembedding k holds ``tables[k - 1, a] / sqrt(d)``. Decoding runs through the real cache and heads.
    """
    n_future, vocab, _ = tables.shape
    d_model = vocab + vocab % 2  # one head of even width for rotary
    config = ModelConfig(
        vocab_size=vocab, d_model=d_model, n_layers=1, n_heads=1, n_kv_heads=1, n_future=n_future, head_type="linear"
    )
    model = MTPModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0) if name.endswith("norm.weight") else p.zero_()
        model.tok_embeddings.weight[:, :vocab] = torch.eye(vocab)
        for k in range(n_future):
            model.heads.outputs[k].weight[:, :vocab] = tables[k].T / d_model**0.5
    return model.eval()
