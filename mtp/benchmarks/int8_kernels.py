"""The int8 and int4 kernels PyTorch has on CPU against the float32 products the decoder runs, at a decoding step's
shapes: the measurement that chose :mod:`mtp.decode.int8`'s kernels and :mod:`mtp.decode.quantize`'s (a quantized
target's, which must be fast at one row and at a verifying step's few).

    python -m mtp.commands.int8_kernels [--rows 1,3,8,32] [--threads 1] [--shapes default|smollm2|all]

Each candidate multiplies x (rows, in) by a matrix (in -> out); the matrix is one of enough copies (64 MB of float32)
that it streams from beyond L2, as in a decoding step. Candidates run interleaved, 30 calls each per round, 5 rounds:
the lower quartile of a round (a call the machine's other work did not interrupt), the best round. Prints microseconds
per call and each candidate's error (norm of the difference from float32's product over its norm).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from mtp.decode.quantize import GROUP_SIZE, int4_groups

SHAPES = {
    "default": [("192 -> 320 (q/k/v)", 192, 320), ("192 -> 1024 (gate/up)", 192, 1024),
                ("512 -> 192 (down)", 512, 192), ("192 -> 8192 (unembed)", 192, 8192)],
    "smollm2": [("576 -> 960 (q/k/v)", 576, 960), ("576 -> 3072 (gate/up)", 576, 3072),
                ("1536 -> 576 (down)", 1536, 576), ("576 -> 49152 (unembed)", 576, 49152)],
}  # fmt: skip
"""(label, in, out) of the matrices of the CPU default model (d 192, vocabulary 8192) and of SmolLM2-135M."""


def _prepared(weight: Tensor) -> dict[str, object]:
    """One matrix (out, in) in every candidate's layout."""
    scales = weight.abs().amax(dim=1).clamp(min=1e-12) / 127
    int8 = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
    with warnings.catch_warnings():  # quantized tensors are deprecated; the packing still takes them
        warnings.simplefilter("ignore", UserWarning)
        quantized = torch.quantize_per_channel(weight, scales.double(), torch.zeros(len(weight), dtype=torch.long), 0,
                                               torch.qint8)  # fmt: skip
    packed = {}
    previous = torch.backends.quantized.engine
    for engine in ("fbgemm", "onednn"):
        if engine in torch.backends.quantized.supported_engines:
            torch.backends.quantized.engine = engine
            packed[engine] = torch.ops.quantized.linear_prepack(quantized, None)
    torch.backends.quantized.engine = previous
    int4, int4_scales = int4_groups(weight)
    return {"W": weight, "WT": weight.T.contiguous(), "int8": int8, "scales": scales, "int8T": int8.T.contiguous(),
            "packed": packed, "int4": int4, "int4_scales": int4_scales}  # fmt: skip


@torch.compile(dynamic=True)
def _compiled_int8_sum(x: Tensor, int8: Tensor, scales: Tensor) -> Tensor:
    """x (rows, in) times int8 (out, in) dequantized inside one compiled multiply-and-sum (Inductor's own loop)."""
    return (x[:, None, :] * int8.float()).sum(-1) * scales


def _int_mm(x: Tensor, m: dict) -> Tensor:  # rows quantized by hand, int8 x int8 -> int32
    row_scales = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
    return torch._int_mm(torch.round(x / row_scales).to(torch.int8), m["int8T"]).float() * row_scales * m["scales"]


CANDIDATES: dict[str, Callable[[Tensor, dict], Tensor]] = {
    "float32 (decoder's layout)": lambda x, m: torch.mm(x, m["WT"]) if x.size(0) == 1 else torch.mm(m["W"], x.T).T,
    "float32 F.linear": lambda x, m: F.linear(x, m["W"]),
    "fbgemm dynamic int8": lambda x, m: torch.ops.quantized.linear_dynamic(x, m["packed"]["fbgemm"], False),
    "onednn dynamic int8": lambda x, m: torch.ops.quantized.linear_dynamic(x, m["packed"]["onednn"], False),
    "_weight_int8pack_mm": lambda x, m: torch._weight_int8pack_mm(x, m["int8"], m["scales"]),
    "_weight_int8pack_mm (bf16 x)": lambda x, m: torch._weight_int8pack_mm(
        x.bfloat16(), m["int8"], m["scales"].bfloat16()
    ).float(),
    "_int_mm (rows quantized)": _int_mm,
    "int8 multiply-and-sum (compiled)": lambda x, m: _compiled_int8_sum(x, m["int8"], m["scales"]),
    "_weight_int4pack_mm_for_cpu": lambda x, m: torch.ops.aten._weight_int4pack_mm_for_cpu(
        x, m["int4"], GROUP_SIZE, m["int4_scales"].float()
    ),
    "_weight_int4pack_mm_for_cpu (bf16 x)": lambda x, m: torch.ops.aten._weight_int4pack_mm_for_cpu(
        x.bfloat16(), m["int4"], GROUP_SIZE, m["int4_scales"]
    ).float(),
}
"""Each candidate's product x (rows, in) @ W^T, W (out, in), from its layout of W."""


def measure(inputs: int, outputs: int, rows: int, rounds: int = 5, calls: int = 30) -> dict[str, tuple[float, float]]:
    """Candidate -> (microseconds per call, error against float32), for one shape; candidates that fail to run (an
    engine this build lacks) are left out."""
    copies = [
        _prepared(torch.randn(outputs, inputs) * 0.05) for _ in range(max(2, (64 << 20) // (4 * inputs * outputs)))
    ]
    x = torch.randn(rows, inputs)
    exact = x @ copies[0]["W"].T
    errors = {}
    for name, product in CANDIDATES.items():
        try:
            errors[name] = float((product(x, copies[0]) - exact).norm() / exact.norm())
        except (KeyError, RuntimeError):
            continue
    best = dict.fromkeys(errors, float("inf"))
    turn = 0
    for _ in range(rounds):
        for name in errors:
            times = []
            for _ in range(calls):
                matrix = copies[turn % len(copies)]
                turn += 1
                start = time.perf_counter()
                CANDIDATES[name](x, matrix)
                times.append(time.perf_counter() - start)
            best[name] = min(best[name], sorted(times)[len(times) // 4])
    return {name: (1e6 * best[name], errors[name]) for name in errors}
