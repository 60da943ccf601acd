import pytest
import torch

from mtp.loss import mtp_loss
from mtp.model import MTPModel
from tests.decode.helpers import cyclic_windows, tiny_model


@pytest.fixture(scope="session")
def trained_model() -> MTPModel:
    """A 4-head model trained for a few seconds on a counting pattern, so that most drafts are accepted."""
    model = tiny_model(n_future=4, vocab_size=24, seed=1).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(150):
        loss = mtp_loss(model, cyclic_windows(16, 24, 24, generator)).total
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval()
