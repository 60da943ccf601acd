"""How fast this machine reads memory with the decoder's threads, and what that allows a decoding step.

A batch-1 decoding step on a CPU multiplies a few rows by every matrix of the model once: its arithmetic is small and
its cost is the bytes it streams from memory. So ``read bandwidth / bytes a step streams`` is the most tokens per
second autoregressive decoding can reach on this machine at a given precision (:func:`limits`), the line mtp's and
llama.cpp's figures are measured against.

The bandwidth is the best of several rounds of two reads of a buffer much larger than the caches (by default the size
of the model's float32 matrices), with the threads the decoder uses: a sum over a float32 buffer (the plain streaming
read) and a matrix-vector product over it as a matrix (BLAS's streaming read, what a step's products are): each
round's faster, the best round (a round the machine's other work slowed counts for nothing).

    python -m mtp.commands.bandwidth [--megabytes 540] [--threads 2]
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

PRECISIONS = {"float32": 32.0, "bfloat16": 16.0, "int8": 8.0, "int4": 4.0}
"""Bits a weight streams at each precision (int8 and int4 add their scales: :func:`streamed_bytes`)."""
GROUP = 32
"""int4's weights per scale (and zero point), as llama.cpp's Q4_0 blocks and torch's int4 packing group them;
int8 has one scale per output channel."""


@dataclass
class Bandwidth:
    """The read bandwidth measured (bytes per second): the sum's, the matrix-vector product's, and the best."""

    sum_bytes_per_s: float
    mv_bytes_per_s: float
    threads: int
    megabytes: float

    @property
    def best(self) -> float:
        return max(self.sum_bytes_per_s, self.mv_bytes_per_s)

    def to_dict(self) -> dict[str, float]:
        return {"sum_gb_per_s": self.sum_bytes_per_s / 1e9, "mv_gb_per_s": self.mv_bytes_per_s / 1e9,
                "gb_per_s": self.best / 1e9, "threads": self.threads, "megabytes": self.megabytes}  # fmt: skip


def read_bandwidth(nbytes: int, threads: int | None = None, rounds: int = 7) -> Bandwidth:
    """The best of ``rounds`` rounds of reading ``nbytes`` of float32 (at least 256 MB: beyond any cache) as a sum and
    as a matrix-vector product, with ``threads`` threads (None: torch's current number)."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        columns = 4096
        rows = max(nbytes, 256 * 2**20) // (4 * columns)
        matrix = torch.randn(rows, columns)
        vector = torch.randn(columns)
        size = matrix.numel() * 4
        best_sum = best_mv = 0.0
        matrix.sum(), torch.mv(matrix, vector)  # warm-up: pages touched, threads started
        for _ in range(rounds):
            start = time.perf_counter()
            matrix.sum()
            best_sum = max(best_sum, size / (time.perf_counter() - start))
            start = time.perf_counter()
            torch.mv(matrix, vector)
            best_mv = max(best_mv, size / (time.perf_counter() - start))
        return Bandwidth(best_sum, best_mv, torch.get_num_threads(), size / 2**20)
    finally:
        torch.set_num_threads(previous)


def step_matrices(model: nn.Module) -> list[torch.Tensor]:
    """The weights a batch-1 autoregressive step reads whole: every matrix of the trunk and head 1's path and head 1's
    unembedding (the input embedding is read one row a token; the draft heads are not read)."""
    matrices = [p for block in model.layers for p in block.parameters() if p.dim() == 2]
    return [*matrices, model.unembedding(1).weight]


def streamed_bytes(model: nn.Module, precision: str) -> int:
    """Bytes a batch-1 autoregressive step of ``model`` streams with its matrices at ``precision``: the weights, plus
    int8's float32 scale per output channel and int4's float32 scale and zero point per :data:`GROUP` weights."""
    bits = PRECISIONS[precision]
    total = 0
    for matrix in step_matrices(model):
        total += matrix.numel() * bits / 8
        if precision == "int8":
            total += matrix.size(0) * 4
        elif precision == "int4":
            total += matrix.numel() / GROUP * 8
    return int(total)


def limits(model: nn.Module, bandwidth: Bandwidth, precisions: tuple[str, ...] = tuple(PRECISIONS)) -> dict:
    """Per precision: the bytes a step streams and the tokens per second the bandwidth allows autoregressive
    decoding at batch 1 (one step a token)."""
    out = {}
    for precision in precisions:
        nbytes = streamed_bytes(model, precision)
        out[precision] = {"megabytes": nbytes / 1e6, "tokens_per_s": bandwidth.best / nbytes}
    return out
