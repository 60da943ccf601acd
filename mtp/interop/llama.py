"""Each head path of an MTP model as a Hugging Face ``LlamaForCausalLM``: its configuration and its weights.

Head k's path is the trunk blocks, head k's block (none for linear heads), the shared final norm and head k's
unembedding. It computes exactly what ``LlamaForCausalLM`` computes with the same weights: RMSNorm in fp32,
rotary on (first half, second half) pairs (transformers' ``rotate_half``), SwiGLU with w1 = gate, w3 = up,
w2 = down, grouped-query attention, no biases, untied embeddings. Nothing here imports transformers.

The tensors a Llama of a given config holds, and their shapes (:func:`expected_shapes`, :func:`check_tensors`), are
checked here for every format that reads one (Hugging Face, Meta, GGUF).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mtp.errors import UserError
from mtp.model import MTPModel
from mtp.model.config import ModelConfig
from mtp.model.heads import HEADS

BLOCK_NAMES = {
    # one block: mtp name -> Hugging Face Llama name
    "attention_norm.weight": "input_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
}


def llama_config(config: ModelConfig) -> dict[str, Any]:
    """Keyword arguments of ``transformers.LlamaConfig`` for one head path of a model with this config."""
    return {
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.ffn_hidden,
        "num_hidden_layers": config.n_layer_blocks,  # the trunk and one head's block, as in `layers`
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.d_model // config.n_heads,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_seq_len,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
    }


def check_head_path(config: ModelConfig, k: int) -> None:
    """Fail with one sentence unless head k (1-based) of a model with this config is a Llama."""
    if not 1 <= k <= config.n_future:
        raise UserError(f"head {k} does not exist: the model has heads 1..{config.n_future}.")
    if k > 1 and HEADS[config.head_type].not_a_llama:
        raise UserError(
            f"head {k} of a {config.head_type}-head model {HEADS[config.head_type].not_a_llama}, so it is not a "
            "Llama; export head 1 "
            "(the full model travels with it in mtp_heads.safetensors)."
        )


def head_path_names(config: ModelConfig, k: int = 1) -> dict[str, str]:
    """Head k's path (1-based): Hugging Face Llama name -> mtp name (MTPModel's state dict)."""
    check_head_path(config, k)
    n_trunk = config.n_layer_blocks - int(config.head1_block)
    blocks = [f"layers.{i}" for i in range(n_trunk)]
    if k == 1 and config.head1_block:
        blocks.append(f"layers.{n_trunk}")
    elif k > 1 and config.head_blocks:  # a parallel head's block (no other type with blocks is a Llama path)
        blocks.append(f"heads.layers.{k - 2}")
    names = {"model.embed_tokens.weight": "tok_embeddings.weight"}
    for i, block in enumerate(blocks):
        names.update({f"model.layers.{i}.{hf}": f"{block}.{ours}" for ours, hf in BLOCK_NAMES.items()})
    names["model.norm.weight"] = "norm.weight"
    names["lm_head.weight"] = f"heads.outputs.{k - 1 if HEADS[config.head_type].own_unembeddings else 0}.weight"
    return names


def head_path_state_dict(model: MTPModel, k: int) -> dict[str, Tensor]:
    """Head k's path (1-based) under Hugging Face Llama names; the tensors are the model's own (no copies)."""
    own = model.state_dict(keep_vars=True)
    return {hf: own[ours] for hf, ours in head_path_names(model.config, k).items()}


def ffn_multiple_for(d_model: int, hidden: int) -> int:
    """An ``ffn_multiple_of`` that gives this SwiGLU width at this model width (mtp derives the width from both).

    mtp's width is int(8 d / 3) rounded up to the multiple m; the smallest divisor m of ``hidden`` above
    hidden - int(8 d / 3) gives ``hidden`` exactly. Widths below int(8 d / 3) cannot be expressed.
    """
    base = int(8 * d_model / 3)  # mtp.model.config.swiglu_width
    if hidden < base:
        raise UserError(
            f"a SwiGLU width of {hidden} at width {d_model} is below 8/3 of the width ({base}), which mtp's "
            "model cannot express; import a model whose intermediate size is at least that."
        )
    return next(m for m in range(1, hidden + 1) if hidden % m == 0 and m > hidden - base)


def interleaved_to_halves(weight: Tensor, head_dim: int) -> Tensor:
    """Rows of a q or k projection reordered within each attention head from pairs (2i, 2i + 1) to
    (i, i + head_dim / 2), so that half-split rotary on the new rows equals interleaved rotary on the old: what
    Meta's checkpoints and llama.cpp's GGUF files (whose converter permutes the rows the other way) need."""
    out_features, in_features = weight.shape
    n = out_features // head_dim
    return weight.view(n, head_dim // 2, 2, in_features).transpose(1, 2).reshape(out_features, in_features)


def expected_shapes(config: ModelConfig) -> dict[str, torch.Size]:
    """Every tensor of a model with this config, and its shape (built on the meta device: no memory)."""
    with torch.device("meta"):
        return {name: t.shape for name, t in MTPModel(config).state_dict().items()}


def check_tensors(tensors: dict[str, Tensor], expected: dict[str, torch.Size], source: Path) -> None:
    """One sentence naming the first missing, misshapen or unexpected tensor."""
    missing = [name for name in expected if name not in tensors]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UserError(f"{source} lacks tensor {missing[0]}{more}; the files are incomplete, export or copy again.")
    for name, shape in expected.items():
        if tensors[name].shape != shape:
            raise UserError(
                f"{source}: tensor {name} has shape {tuple(tensors[name].shape)}, but the config needs {tuple(shape)}."
            )
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise UserError(
            f"{source} has tensor {unexpected[0]} that the config does not describe (a different architecture?)."
        )
