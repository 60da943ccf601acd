"""int8 matrices for the draft side of decoding on CPU (``draft_dtype="int8"``): each matrix stored as int8 with one
scale per output channel, multiplied by fbgemm's dynamically quantized linear (``torch.ops.quantized.linear_dynamic``,
what ``torch.ao.quantization.quantize_dynamic`` runs): each call quantizes its input rows to 8 bits (one scale for the
call), multiplies in int8 with int32 sums, and rescales to float; a call over many rows uses the float matrix.

A decoding step reads whole matrices for a few rows, so on a CPU its cost is the bytes it reads: an int8 matrix is a
quarter of a float32 one. Kernels measured on this project's 2-core CPU (Xeon with AVX512-VNNI, torch 2.13, one
thread, weights streamed from beyond L2, interleaved, lower-quartile of 30 calls, best of 5 rounds), in us:

======================  ====  =========================  ===================  ====================  ==============
matrix (in -> out)      rows  float32 (faster of the     fbgemm dynamic int8  ``_weight_int8pack``  ``_int_mm``,
                              decoder's layout and       (chosen)             ``_mm`` (int8         rows quantized
                              ``F.linear``)                                   weight, float input)  by hand
======================  ====  =========================  ===================  ====================  ==============
192 -> 320 (q/k/v)      1     19                         20                   36                    28
192 -> 1024 (gate/up)   3     73                         37                   322                   61
192 -> 8192 (unembed)   1     261                        123                  940                   277
192 -> 8192 (unembed)   8     770                        290                  10,557                344
576 -> 3072 (gate/up)   3     269                        142                  2,956                 420
576 -> 49152 (unembed)  1     9,641                      1,147                28,002                5,763
576 -> 49152 (unembed)  3     7,638                      1,296                47,637                5,710
======================  ====  =========================  ===================  ====================  ==============

fbgemm's kernel is the fastest at the rows a batch-1 step drafts from (1 to 3); oneDNN's, through the same operator,
is 2-4x slower on the small matrices at those rows and faster only from 8 rows on the large ones (192 -> 8192 at 8
rows: 180 us); ``torch._weight_int8pack_mm`` is 3-10x slower than float with a float input and, with a bfloat16 one,
2-4x slower than fbgemm's (4.3 ms for the 49152-row unembedding at one row). The gain is in the large matrices
(unembeddings, SmolLM2-sized blocks): on the CPU default model's 192-wide blocks int8 saves little, a call's fixed
cost about equal to what it saves in bytes.

What it costs in accuracy, measured on SmolLM2-135M's layer-skip draft (blocks 10, 12, .., 24 of 30 skipped; 877
positions of 8 HumanEval prompts, one position per call as decoding steps run): the int8 draft's logits are 15% off
the float draft's (norm of the difference over the norm) and its argmax differs at a third of the positions, yet
where the float draft is right the int8 one mostly is too: first-draft acceptance against head 1 0.195 greedy and
0.164 sampled (temperature 0.8, top-p 0.95), against float's 0.208 and 0.173 at the same positions (6% and 5% fewer
accepted). Rounding the inputs costs most of that error (LLM activations have outlier channels): the weight-only
kernel above, its input in bfloat16, halves it (7%, argmax differing at 16%; acceptance 0.206 and 0.169), but at 2-4x
fbgemm's time; with fbgemm the layer-skip draft's time per step halves (224 -> 114 ms, the same run), for 5-6% fewer
first drafts accepted. The rows of one call share one input scale, so one call over a whole prompt, where the first
token's outlier activations sit, is far worse (43% off, greedy acceptance 0.157 against 0.228, 382 positions): a call
over more than :data:`INT8_ROWS` rows multiplies the float matrices instead.

The input's range is the full 8 bits where the CPU has VNNI (its int8 products sum in int32 without saturating);
without it, 7 bits, as PyTorch's own default configuration for x86 does. Every product of these matrices is for
drafting only: head 1's verification stays in the model's dtype, so greedy output is unchanged and sampling stays
lossless (drafts are sampled from the int8 draft's own distribution, which is the proposal they are verified with).
Quantized tensors, which fbgemm's packing takes, are deprecated in PyTorch 2.13 (a warning, silenced here): when they
go, this module is the one place to change.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from mtp.decode.settings import SettingError

INT8_ROWS = 32
"""A product over more rows than this (per matrix) multiplies the float matrix instead: such a call (a prompt's step,
a large batch) is bound by arithmetic more than by reading weights, and its rows share one input scale, which a
prompt's outlier rows ruin (see the module's docstring)."""

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
    """Whether inputs may use all 8 bits: only with VNNI, whose int8 products sum without int16 saturation."""
    is_vnni = getattr(torch.cpu, "_is_vnni_supported", None)
    return bool(is_vnni()) if is_vnni is not None else False


class Int8Matrices:
    """A stack of matrices (blocks, in, out), as the packed inference form keeps them, in int8 with per-output-channel
    scales: ``self(x)`` for x (blocks, ..., in) is each block's x @ matrix, (blocks, ..., out), in x's dtype. The float
    stack is kept (not copied: the float form holds it) for calls over more than :data:`INT8_ROWS` rows."""

    def __init__(self, stacked: Tensor) -> None:
        assert stacked.device.type == "cpu", "int8 drafting runs on CPU (GenerationConfig.check_device says so)"
        engine, previous = _engine(), torch.backends.quantized.engine
        self.reduce_range = not _full_input_range()
        self.packed = []
        try:
            torch.backends.quantized.engine = engine  # the engine packs (and so picks the kernel); the call follows it
            for matrix in stacked:
                weight = matrix.T.float().contiguous()  # (out, in)
                scales = weight.abs().amax(dim=1).clamp(min=1e-12).double() / 127  # a zero row keeps a valid scale
                zeros = torch.zeros(weight.size(0), dtype=torch.long)
                with warnings.catch_warnings():  # quantized tensors are deprecated; fbgemm's packing still takes them
                    warnings.simplefilter("ignore", UserWarning)
                    quantized = torch.quantize_per_channel(weight, scales, zeros, 0, torch.qint8)
                self.packed.append(torch.ops.quantized.linear_prepack(quantized, None))
        finally:
            torch.backends.quantized.engine = previous
        self.full = stacked

    def __call__(self, x: Tensor) -> Tensor:
        """x (blocks, ..., in) -> (blocks, ..., out): each block's rows times its matrix, in x's dtype."""
        rows = x.reshape(x.size(0), -1, x.size(-1))
        if rows.size(1) > INT8_ROWS:
            return torch.bmm(rows, self.full).view(*x.shape[:-1], self.full.size(-1))
        rows = rows.float()
        linear = torch.ops.quantized.linear_dynamic
        out = [linear(part, packed, self.reduce_range) for part, packed in zip(rows, self.packed, strict=True)]
        stacked = out[0][None] if len(out) == 1 else torch.stack(out)
        return stacked.view(*x.shape[:-1], stacked.size(-1)).to(x.dtype)

    def weights(self) -> list[Tensor]:
        """The int8 matrices (out, in) the kernel reads (quantized ``torch.qint8`` tensors), one per block."""
        return [torch.ops.quantized.linear_unpack(packed)[0] for packed in self.packed]

    def dequantized(self) -> Tensor:
        """The matrices (blocks, in, out) these stand for, back in float32."""
        return torch.stack([weight.dequantize().T for weight in self.weights()])


class Int8Unembedding:
    """Logits (..., V) of x (..., d) through an int8 copy of an unembedding weight (V, d)."""

    def __init__(self, weight: Tensor) -> None:
        self.matrix = Int8Matrices(weight.T[None])

    def __call__(self, x: Tensor) -> Tensor:
        return self.matrix(x[None])[0]
