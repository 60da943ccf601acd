"""The bandwidth limit: the bytes a decoding step streams, counted by hand for a tiny model at every precision, and the
tokens per second a measured bandwidth allows."""

import pytest

from mtp.benchmarks.bandwidth import Bandwidth, limits, read_bandwidth, streamed_bytes
from mtp.model import MTPModel
from mtp.model.config import ModelConfig


def tiny() -> MTPModel:
    return MTPModel(ModelConfig(vocab_size=128, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, n_future=2))


def test_a_step_streams_every_matrix_of_head_1s_path_and_its_unembedding():
    model = tiny()
    d, ffn, kv = 32, model.config.ffn_hidden, 2 * 8
    per_block = [(d, d), (kv, d), (kv, d), (d, d), (ffn, d), (ffn, d), (d, ffn)]  # q, k, v, o, w1, w3, w2 (out, in)
    blocks = model.config.n_layer_blocks  # the trunk and head 1's block; head 2's block is not read
    shapes = per_block * blocks + [(128, d)]
    weights = sum(o * i for o, i in shapes)
    assert streamed_bytes(model, "float32") == 4 * weights
    assert streamed_bytes(model, "bfloat16") == 2 * weights
    assert streamed_bytes(model, "int8") == weights + 4 * sum(o for o, _ in shapes)
    assert streamed_bytes(model, "int4") == weights // 2 + weights // 32 * 8


def test_the_limit_is_the_bandwidth_over_the_bytes_a_step_streams():
    model = tiny()
    measured = Bandwidth(sum_bytes_per_s=2e9, mv_bytes_per_s=3e9, threads=2, megabytes=256)
    out = limits(model, measured, ("float32", "int8"))
    assert out["float32"]["tokens_per_s"] == pytest.approx(3e9 / streamed_bytes(model, "float32"))
    assert out["int8"]["tokens_per_s"] > out["float32"]["tokens_per_s"]
    assert measured.to_dict()["gb_per_s"] == 3.0


def test_a_measured_bandwidth_is_positive_and_restores_the_threads():
    import torch

    threads = torch.get_num_threads()
    measured = read_bandwidth(1, threads=1, rounds=1)  # the floor: 256 MB, beyond the caches
    assert measured.best > 0 and measured.threads == 1 and measured.megabytes == pytest.approx(256)
    assert torch.get_num_threads() == threads
