"""int8 matrices for the draft side of decoding on CPU (``draft_dtype="int8"``): each matrix stored as int8 with one
scale per output channel (its largest magnitude / 127), multiplied by one of two kernels, by the matrix's role:

- the blocks' matrices (q/k/v, attention output, gate/up, down; causal depths' input matrices; medusa's residual
  layers): ``torch._weight_int8pack_mm``, weight-only, its input rounded to bfloat16 but not quantized;
- unembeddings: fbgemm's dynamically quantized linear (``torch.ops.quantized.linear_dynamic``, what
  ``torch.ao.quantization.quantize_dynamic`` runs), which also rounds its input rows to 8 bits (one scale per call)
  and sums in int32.

A call over more rows than the kernel gains at (:data:`MAX_ROWS`: a prompt's step, a large batch) multiplies the
float matrix instead.

Why: a decoding step reads whole matrices for a few rows, so on a CPU its cost is the bytes it reads, and an int8
matrix is a quarter of a float32 one. The kernels were chosen by timing PyTorch's CPU int8 products at a step's shapes
against the float32 ones the decoder runs (``python -m mtp.commands.int8_kernels``), then by accuracy where they ran
alike (the figures: docs/decoders-in-depth.md, "The int8 kernels, measured"). At the few rows of a batch-1 step the
weight-only kernel (bfloat16 input) is as fast as fbgemm's on the blocks' matrices and slower on the largest
unembeddings; from a few dozen rows on it is slower than float32. With a float32 input the same operator has no fast
CPU path.

Accuracy decides between the two at equal speed. LLM activations have outlier channels, which rounding a block's
input to 8 bits spoils and bfloat16 does not. The unembedding's input is the final normed state, which rounds to 8
bits with little harm, and its matrix is the largest, where fbgemm leads most: hence the split. One fbgemm call over a
whole prompt, whose first token's outlier activations share the call's one input scale, is far less accurate: one more
reason for :data:`MAX_ROWS`.

fbgemm's input uses all 8 bits where the CPU has VNNI (its int8 products sum in int32 without saturating); without
it, 7 bits, as PyTorch's own default configuration for x86 does. Every product here is for drafting only: head 1's
verification stays in the model's dtype, so greedy output is unchanged and sampling stays lossless (drafts are sampled
from the int8 draft's own distribution, which is the proposal they are verified with). Quantized tensors, which
fbgemm's packing takes, are deprecated in PyTorch 2.13 (a warning, silenced here): when they go, this module is the
one place to change.
"""

from __future__ import annotations

import warnings
from typing import Literal

import torch
from torch import Tensor

from mtp.errors import SettingError

Kernel = Literal["weight_only", "fbgemm"]
"""``weight_only``: ``torch._weight_int8pack_mm``, the input in bfloat16 (the blocks' matrices); ``fbgemm``: the
dynamically quantized linear (unembeddings)."""

MAX_ROWS: dict[str, int] = {"weight_only": 16, "fbgemm": 32}
"""A call over more rows than this (per matrix) multiplies the float matrix instead: there the kernel is no faster
than float32 (see the module's docstring), and a prompt's rows would share fbgemm's one input scale."""

ENGINES = ("fbgemm", "x86", "qnnpack")
"""Quantized engines that run per-channel dynamic linears on CPU, in order of preference (x86 routes linears to
fbgemm, qnnpack is ARM's)."""


def _engine() -> str:
    supported = torch.backends.quantized.supported_engines
    engine = next((e for e in ENGINES if e in supported), None)
    if engine is None:
        raise SettingError(
            f"{{draft_dtype}} needs PyTorch's int8 CPU kernels, which this build lacks (its quantized engines: "
            f"{', '.join(supported)}); leave {{draft_dtype:auto}}.",
            draft_dtype="int8",
        )
    return engine


def _full_input_range() -> bool:
    """Whether fbgemm's inputs may use all 8 bits: only with VNNI, whose int8 products sum without int16 saturation."""
    is_vnni = getattr(torch.cpu, "_is_vnni_supported", None)
    return bool(is_vnni()) if is_vnni is not None else False


def per_channel_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """A matrix (out, in) as int8 (out, in) and one float32 scale per output channel (out,): its largest magnitude /
    127, so that the matrix is about int8 * scale[:, None]."""
    weight = weight.float()
    scales = weight.abs().amax(dim=1).clamp(min=1e-12) / 127  # a zero row keeps a valid scale
    return torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous(), scales


class Int8Matrices:
    """A stack of matrices (blocks, in, out), as the packed inference form keeps them, in int8 with per-output-channel
    scales, multiplied by ``kernel``: ``self(x)`` for x (blocks, ..., in) is each block's x @ matrix, (blocks, ...,
    out), in x's dtype. The float stack is kept (not copied: the float form holds it) for calls over more than
    :data:`MAX_ROWS` rows."""

    def __init__(self, stacked: Tensor, kernel: Kernel = "weight_only") -> None:
        assert stacked.device.type == "cpu", "int8 drafting runs on CPU (DraftSettings.check_device says so)"
        self.full, self.kernel, self.max_rows = stacked, kernel, MAX_ROWS[kernel]
        self.int8, self.scales = [], []  # per block: (out, in) int8, (out,) float32
        for matrix in stacked:
            int8, scales = per_channel_int8(matrix.T)
            self.int8.append(int8)
            self.scales.append(scales)
        if kernel == "weight_only":
            self.bf16_scales = [scales.bfloat16() for scales in self.scales]
            return
        engine, previous = _engine(), torch.backends.quantized.engine
        self.reduce_range = not _full_input_range()
        self.packed = []
        try:
            torch.backends.quantized.engine = engine  # the engine packs (and so picks the kernel); the call follows it
            for int8, scales in zip(self.int8, self.scales, strict=True):
                zeros = torch.zeros(len(scales), dtype=torch.long)
                with warnings.catch_warnings():  # quantized tensors are deprecated; fbgemm's packing still takes them
                    warnings.simplefilter("ignore", UserWarning)
                    quantized = torch._make_per_channel_quantized_tensor(int8, scales.double(), zeros, 0)
                self.packed.append(torch.ops.quantized.linear_prepack(quantized, None))
        finally:
            torch.backends.quantized.engine = previous
        self.int8 = []  # fbgemm keeps its own packed copy

    def __call__(self, x: Tensor) -> Tensor:
        """x (blocks, ..., in) -> (blocks, ..., out): each block's rows times its matrix, in x's dtype."""
        rows = x.reshape(x.size(0), -1, x.size(-1))
        if rows.size(1) > self.max_rows:
            return torch.bmm(rows, self.full).view(*x.shape[:-1], self.full.size(-1))
        if self.kernel == "weight_only":
            rows = rows.bfloat16()
            out = [
                torch._weight_int8pack_mm(part, int8, scales)
                for part, int8, scales in zip(rows, self.int8, self.bf16_scales, strict=True)
            ]
        else:
            rows, linear = rows.float(), torch.ops.quantized.linear_dynamic
            out = [linear(part, packed, self.reduce_range) for part, packed in zip(rows, self.packed, strict=True)]
        stacked = out[0][None] if len(out) == 1 else torch.stack(out)
        return stacked.view(*x.shape[:-1], stacked.size(-1)).to(x.dtype)

    def weights(self) -> list[Tensor]:
        """The int8 matrices (out, in) the kernel reads (``torch.int8``), one per block."""
        if self.kernel == "weight_only":
            return self.int8
        return [torch.ops.quantized.linear_unpack(packed)[0].int_repr() for packed in self.packed]

    def dequantized(self) -> Tensor:
        """The matrices (blocks, in, out) these stand for, back in float32."""
        return torch.stack([(w.float() * s[:, None]).T for w, s in zip(self.weights(), self.scales, strict=True)])


class Int8Unembedding:
    """Logits (..., V) of x (..., d) through an int8 copy of an unembedding weight (V, d) (fbgemm's kernel)."""

    def __init__(self, weight: Tensor) -> None:
        self.matrix = Int8Matrices(weight.T[None], "fbgemm")

    def __call__(self, x: Tensor) -> Tensor:
        return self.matrix(x[None])[0]
