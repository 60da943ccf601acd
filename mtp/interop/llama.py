"""Each head path of an MTP model as a Hugging Face ``LlamaForCausalLM``: its configuration and its weights.

Head k's path is the trunk blocks, head k's block (none for linear heads), the shared final norm and head k's
unembedding. It computes exactly what ``LlamaForCausalLM`` computes with the same weights: RMSNorm in fp32,
rotary on (first half, second half) pairs (transformers' ``rotate_half``), SwiGLU with w1 = gate, w3 = up,
w2 = down, grouped-query attention, no biases, untied embeddings. Nothing here imports transformers.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from mtp.config import ModelConfig
from mtp.model import MTPModel

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


def head_path_state_dict(model: MTPModel, k: int) -> dict[str, Tensor]:
    """Head k's path (1-based) under Hugging Face Llama names; the tensors are the model's own (no copies)."""
    blocks = [*model.trunk_blocks]
    head_block = model.head_block(k)
    if head_block is not None:
        blocks.append(head_block)
    state = {"model.embed_tokens.weight": model.tok_embeddings.weight}
    for i, block in enumerate(blocks):
        for name, tensor in block.state_dict(keep_vars=True).items():
            state[f"model.layers.{i}.{BLOCK_NAMES[name]}"] = tensor
    state["model.norm.weight"] = model.norm.weight
    state["lm_head.weight"] = model.unembedding(k).weight
    return state
