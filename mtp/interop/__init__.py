"""Conversions between mtp models and other formats (no foreign package is imported at module level).

Models come in from two kinds of directory and one kind of file besides mtp's own checkpoints:

- a Hugging Face Llama directory (``config.json`` + safetensors or ``pytorch_model.bin``): its next-token path
  becomes the trunk and head 1; ``mtp_heads.safetensors`` + ``mtp_config.json``, if present (written by
  ``scripts/export.py``), add the other heads (:mod:`mtp.interop.hf`);
- a MiMo folder (``config.json`` of ``MiMoForCausalLM``: a Qwen2 trunk and one MTP layer, as vLLM serves it): a
  causal-head model of two heads (:mod:`mtp.interop.mimo`, which also writes one);
- a Meta multi-token directory (``params.json`` + ``consolidated.00.pth``, ``n_future_tokens`` heads)
  (:mod:`mtp.interop.meta`);
- a GGUF file of the Llama architecture (llama.cpp's format, quantized or not) (:mod:`mtp.interop.gguf`).

:class:`ModelFiles` is what each reader returns: what an mtp checkpoint would have held. The readers depend on the
config and the model only; :mod:`mtp.checkpoint.load` dispatches to them, and the exporters
(:mod:`mtp.pretrained.export`) sit above that loader.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from mtp.model.config import ModelConfig


@dataclass
class ModelFiles:
    """A model read from a foreign directory: its config, weights under mtp's names, and tokenizer JSON."""

    config: ModelConfig
    weights: dict[str, Tensor]
    tokenizer: str
