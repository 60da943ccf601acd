"""Tiny models for the decoding tests."""

import torch

from mtp.config import ModelConfig
from mtp.model import MTPModel


def tiny_model(n_future: int = 4, vocab_size: int = 40, seed: int = 0, **kwargs) -> MTPModel:
    torch.manual_seed(seed)
    config = ModelConfig(
        vocab_size=vocab_size, d_model=32, n_layers=n_future + 2, n_heads=4, n_kv_heads=2, n_future=n_future, **kwargs
    )
    return MTPModel(config).eval()


def cyclic_windows(batch: int, length: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """Token t+1 = token t + 1 (mod vocab), from random starts: every head can learn its offset exactly."""
    starts = torch.randint(0, vocab, (batch, 1), generator=generator)
    return (starts + torch.arange(length)) % vocab
