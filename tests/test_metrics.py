import torch

from mtp.training.metrics import ExpectedTokensPerForward, accepted_prefix_lengths


def test_accepted_prefix_lengths_by_hand():
    # head 1 argmax over positions 0..4 (guesses for tokens 1..5)
    head1 = [10, 11, 12, 13, 14]
    # head 2 at t guesses token t+2: agrees with head1[t+1] at t=0 and t=2
    head2 = [11, 99, 13, 99, 0]
    # head 3 at t guesses token t+3: agrees with head1[t+2] at t=0 and t=1
    head3 = [12, 13, 99, 0, 0]
    predictions = torch.tensor([head1, head2, head3]).unsqueeze(1)  # (3, 1, 5)
    # positions 0..2 have every comparison available: t=0 accepts 2 drafts, t=1 none (head 2 fails first), t=2 one
    assert accepted_prefix_lengths(predictions).tolist() == [[3, 1, 2]]


def test_single_head_is_one_token_per_forward():
    metric = ExpectedTokensPerForward()
    metric.update(torch.randint(0, 5, (1, 2, 9)))
    assert metric.compute().item() == 1.0


def test_metric_averages_over_batches():
    metric = ExpectedTokensPerForward()
    agree = torch.tensor([[[1, 1, 1]], [[1, 1, 1]]])  # every draft accepted: 2 tokens per position
    disagree = torch.tensor([[[1, 2, 3]], [[5, 5, 5]]])  # never: 1 token
    metric.update(agree)
    metric.update(disagree)
    assert metric.compute().item() == 1.5
