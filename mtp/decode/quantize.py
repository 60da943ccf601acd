"""Quantized targets on CPU (``quantize="int8"`` or ``"int4"``): weight-only, every matrix a decoding step multiplies
(the verification path's blocks, head 1's unembedding, the draft heads', a draft model's) stored in 8 or 4 bits and
multiplied by PyTorch's own weight-only CPU kernels, the activations rounded to bfloat16 for the product:

- int8: one scale per output channel (its largest magnitude / 127, as the int8 drafts' :mod:`mtp.decode.int8`),
  multiplied by ``torch._weight_int8pack_mm``;
- int4: groups of :data:`GROUP_SIZE` inputs per output channel, each with a scale and an offset (16 levels from the
  group's minimum to its maximum: llama.cpp's Q4_1 layout), packed by ``aten._convert_weight_to_int4pack_for_cpu``
  and multiplied by ``aten._weight_int4pack_mm_for_cpu``.

Unlike the int8 drafts, every call multiplies the quantized weights whatever its number of rows (a prompt's too), so
the verifying forward and the drafting forward read the same weights; and each output row of these kernels depends on
its own input row alone, so a step verifying k rows gives each row what a step of that row alone gives: greedy
output at each precision equals that precision's own autoregressive output. It is not float32's: how often it is the
same is measured per run (each quantized row of a timed comparison), never assumed.

Why these kernels (:mod:`mtp.commands.int8_kernels` on the smollm2 shapes at 1 and 4 rows reruns the comparison): on
SmolLM2's shapes, each matrix streamed from beyond the caches, they were the only candidates faster than float32 at
one row and at four on every shape: int8 weights with bfloat16 rows through ``_weight_int8pack_mm`` (with float32
rows it has no fast path and is several times slower than float32), int4 through ``_weight_int4pack_mm_for_cpu`` with
bfloat16 rows (float32 rows: far slower again). A multiply-and-sum over the dequantized int8 weights compiled by
Inductor was faster still at one row on the largest matrices but slower than float32 at four, and choosing a kernel
by row count would make a row's rounding depend on how many rows its step verifies, which greedy exactness forbids.
torchao 0.18's ``Int8WeightOnlyConfig`` computes ``mm(x, int8.to(x.dtype)) * scale`` on CPU, converting the whole
matrix at every call (slower than float32 eager; compiled, slower than ``_weight_int8pack_mm``), and 0.18 has no CPU
int4 layout any more. So no extra package is needed.

The kernels' limits, checked where a plan is made (:func:`check_quantizable`) before any weight is converted: CPU
only; a float32 or bfloat16 model; for int4, every matrix's input width a multiple of :data:`GROUP_SIZE` (the model's
width and its MLP's); an output width that is not a multiple of 16 (the kernel's) is padded with zero rows.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from mtp.decode.int8 import per_channel_int8
from mtp.errors import SettingError
from mtp.model.config import ModelConfig

Quantize = Literal["none", "int8", "int4"]
QUANTIZE: tuple[str, ...] = get_args(Quantize)
GROUP_SIZE = 32
"""Inputs per int4 group (each with its own scale and offset): the smallest the kernel takes (32, 64, 128 or 256), the
most accurate, and llama.cpp's Q4_0/Q4_1 block."""
INT4_OUT_MULTIPLE = 16
"""The int4 kernel's packing takes output widths that are multiples of this; others are padded with zero rows."""
DTYPES = (torch.float32, torch.bfloat16)
"""Model dtypes a quantized target decodes in (the products' rows go through bfloat16 either way)."""


def check_quantizable(quantize: str, config: ModelConfig, device: torch.device, dtype: torch.dtype) -> None:
    """A :class:`~mtp.errors.SettingError` (one sentence naming what is supported) where ``quantize`` cannot run on a
    model of ``config`` in ``dtype`` on ``device``; nothing for ``"none"``."""
    if quantize == "none":
        return
    if device.type != "cpu":
        raise SettingError(
            f"{{quantize}} runs PyTorch's weight-only CPU kernels, and the model is on {device.type}; decode on CPU, "
            "or leave {quantize:none}.",
            quantize=quantize,
        )
    if dtype not in DTYPES:
        name = str(dtype).removeprefix("torch.")
        raise SettingError(
            f"{{quantize}} decodes float32 and bfloat16 models, and this one is {name}; load it in float32 or bfloat16 "
            "({dtype:name}), or leave {quantize:none}.",
            quantize=quantize,
            dtype=name,
        )
    if quantize == "int4":
        widths = {"width (d_model)": config.d_model, "MLP width": config.ffn_hidden}
        odd = {name: width for name, width in widths.items() if width % GROUP_SIZE}
        if odd:
            name, width = next(iter(odd.items()))
            raise SettingError(
                f"{{quantize}} quantizes groups of {GROUP_SIZE} inputs, and this model's {name} {width} is not a "
                f"multiple of {GROUP_SIZE}; use {{quantize:int8}}, or a model whose width and MLP width are.",
                quantize=quantize,
            )


def int4_groups(weight: Tensor) -> tuple[Tensor, Tensor]:
    """A matrix (out, in) (out a multiple of :data:`INT4_OUT_MULTIPLE`, in of :data:`GROUP_SIZE`) as the int4 kernel's
    packed weight and its scales and offsets (in / GROUP_SIZE, out, 2) in bfloat16: each group's 16 levels from its
    minimum to its maximum, the matrix about (level - 8) * scale + offset."""
    out_features, in_features = weight.shape
    groups = weight.float().reshape(out_features, in_features // GROUP_SIZE, GROUP_SIZE)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scales = ((high - low).clamp(min=1e-12) / 15).bfloat16().float()  # as the kernel will read them
    offsets = (low + 8 * scales).bfloat16().float()  # the kernel's zero point is the value of level 8
    levels = torch.round((groups - (offsets - 8 * scales)[..., None]) / scales[..., None]).clamp(0, 15)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(levels.to(torch.int32).view(out_features, -1), 1)
    return packed, torch.stack([scales, offsets], dim=-1).transpose(0, 1).contiguous().bfloat16()


class QuantizedMatrices:
    """A stack of matrices (blocks, in, out), as the packed inference form keeps them, quantized weight-only to
    ``precision`` (int8 or int4, see the module's docstring): ``self(x)`` for x (blocks, ..., in) is each block's
    x @ matrix, (blocks, ..., out), in x's dtype, through the quantized weights at every row count."""

    def __init__(self, stacked: Tensor, precision: str) -> None:
        assert stacked.device.type == "cpu" and precision in ("int8", "int4"), "check_quantizable says so first"
        self.precision, self.out_features = precision, stacked.size(-1)
        self.weights: list[tuple[Tensor, Tensor]] = []  # per block: the kernel's weight, its scales (and offsets)
        for matrix in stacked:
            weight = matrix.T  # (out, in)
            if precision == "int8":
                int8, scales = per_channel_int8(weight)
                self.weights.append((int8, scales.bfloat16()))
            else:
                padding = -self.out_features % INT4_OUT_MULTIPLE
                padded = torch.cat([weight, weight.new_zeros(padding, weight.size(1))]) if padding else weight
                self.weights.append(int4_groups(padded))

    def __call__(self, x: Tensor) -> Tensor:
        """x (blocks, ..., in) -> (blocks, ..., out): each block's rows times its matrix, in x's dtype."""
        rows = x.reshape(x.size(0), -1, x.size(-1)).bfloat16()
        if self.precision == "int8":
            out = [
                torch._weight_int8pack_mm(part, w, scales) for part, (w, scales) in zip(rows, self.weights, strict=True)
            ]
        else:
            multiply = torch.ops.aten._weight_int4pack_mm_for_cpu
            out = [multiply(part, w, GROUP_SIZE, scales) for part, (w, scales) in zip(rows, self.weights, strict=True)]
        stacked = out[0][None] if len(out) == 1 else torch.stack(out)
        if stacked.size(-1) != self.out_features:  # int4's padded rows
            stacked = stacked[..., : self.out_features]
        return stacked.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


class QuantizedUnembedding:
    """Logits (..., V) of x (..., d) through a quantized copy of an unembedding weight (V, d)."""

    def __init__(self, weight: Tensor, precision: str) -> None:
        self.matrix = QuantizedMatrices(weight.T[None], precision)

    def __call__(self, x: Tensor) -> Tensor:
        return self.matrix(x[None])[0]
