"""MiMo folders: a causal-head mtp model as the Hugging Face layout vLLM runs with its own MTP layer, and back.

Xiaomi's MiMo (``MiMoForCausalLM``, ``model_type`` qwen2) is the one dense architecture among those whose MTP layers
vLLM drafts with natively (``speculative_config={"method": "mtp"}``). Its layout, from vLLM's
``model_executor/models/mimo.py`` and ``mimo_mtp.py``:

- the trunk is a Qwen2 model: Llama's blocks with biases on q, k and v (``model.layers.{i}.*``, ``model.norm``,
  ``model.embed_tokens``, ``lm_head``);
- ``model.mtp_layers.0``: ``token_layernorm`` (the embedding of the token after the position), ``hidden_layernorm``
  (the trunk's last state there, before its final norm), ``input_proj`` (2H -> H, no bias) over the two normed
  inputs concatenated **hidden first**, one Qwen2 decoder layer under its own names (``input_layernorm``,
  ``self_attn.{q,k,v,o}_proj``, ``post_attention_layernorm``, ``mlp.{gate,up,down}_proj``), then
  ``final_layernorm``; the embedding and ``lm_head`` are the target's. vLLM zeroes the token input at position 0,
  reads ``mtp_layers.0`` only, and reuses it for every further draft.

mtp's causal depth 2 is that layer: ``eh_proj`` reads [embedding; hidden] (embedding first), so ``input_proj`` is
``eh_proj`` with its two halves of columns swapped; ``enorm`` is ``token_layernorm``, ``hnorm`` ``hidden_layernorm``;
the q/k/v biases are zero; ``final_layernorm`` is a copy of the shared norm. A model trained with
``model.causal_first_token=zero`` reads what vLLM feeds at position 0 too, so both compute the same drafts.

Depths beyond 2 are not written (vLLM reads layer 0 alone). Nothing here imports transformers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mtp.errors import SettingError, UserError
from mtp.interop import ModelFiles
from mtp.interop.hf import read_json, read_tensors
from mtp.interop.llama import BLOCK_NAMES, check_tensors, expected_shapes, ffn_multiple_for, head_path_names
from mtp.interop.tokenizer import directory_tokenizer
from mtp.model import MTPModel
from mtp.model.config import ModelConfig

MIMO_ARCHITECTURE = "MiMoForCausalLM"
CARRIED = "causal"
"""The mtp head type this layout carries exactly (as :data:`mtp.interop.engines.ENGINE_FORMATS` names the engines')."""
MTP_LAYER = "model.mtp_layers.0."
"""The prefix of the one MTP layer vLLM reads."""
FIRST_TOKEN_KEY = "mtp_causal_first_token"
"""config.json's record of what the layer was trained to read at position 0 (mtp's
:attr:`~mtp.model.config.ModelConfig.causal_first_token`); a folder without it is taken to follow vLLM's rule."""
BIASES = ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias")
LAYER_NORMS = {"inputs.0.enorm.weight": "token_layernorm.weight", "inputs.0.hnorm.weight": "hidden_layernorm.weight"}
"""Depth 2's input norms: mtp name (under ``heads.``) -> MiMo name (under :data:`MTP_LAYER`)."""


def refusal(config: ModelConfig) -> SettingError | None:
    """Why the MiMo layout cannot carry this model, one sentence naming the export's ``format``; None when it can:
    causal heads (depth 2 becomes the MTP layer), two or more, over the whole vocabulary."""
    if config.head_type != CARRIED:
        return SettingError(
            f"{{format}} carries causal heads (DeepSeek-V3's MTP modules, MiMo's layer), not this checkpoint's "
            f"{config.head_type} heads; train with model=causal2 (model.head_type=causal), or export {{format:hf}}, "
            "which keeps every head for mtp to read back.",
            format="mimo",
        )
    if config.n_future < 2:
        return SettingError(
            "{format} writes the model's depth 2 as its MTP layer, and this checkpoint has one head "
            "(model.n_future=1); train with model=causal2 or more heads.",
            format="mimo",
        )
    if config.draft_vocab:
        return SettingError(
            f"{{format}} drafts over the whole vocabulary (vLLM's MiMo layer scores with lm_head), and this "
            f"checkpoint's heads score a reduced one (model.draft_vocab={config.draft_vocab}); train with "
            "model.draft_vocab=0.",
            format="mimo",
        )
    return None


def check_carries(config: ModelConfig) -> None:
    """The :class:`~mtp.errors.SettingError` of :func:`refusal` unless the MiMo layout carries this model."""
    reason = refusal(config)
    if reason is not None:
        raise reason


def mimo_names(config: ModelConfig) -> dict[str, str]:
    """MiMo name -> mtp name of every tensor copied as it is: the trunk and head 1 (a Llama's names, which Qwen2's
    are), depth 2's block and its input norms. ``input_proj`` (a permutation of ``eh_proj``), the zero biases and
    ``final_layernorm`` (the shared norm) are derived (:func:`mimo_layout`)."""
    names = head_path_names(config, 1)
    names |= {f"{MTP_LAYER}{hf}": f"heads.layers.0.{ours}" for ours, hf in BLOCK_NAMES.items()}
    names |= {f"{MTP_LAYER}{hf}": f"heads.{ours}" for ours, hf in LAYER_NORMS.items()}
    return names


def mimo_layout(model: MTPModel) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """``model``'s trunk, head 1 and depth 2 under MiMo's names, and its config.json (without the token ids and the
    dtype, which the exporter adds)."""
    config = model.config
    check_carries(config)
    own, d = model.state_dict(), config.d_model
    tensors = {mimo: own[ours] for mimo, ours in mimo_names(config).items()}
    eh_proj = own["heads.inputs.0.eh_proj.weight"]  # (d, 2d) over [embedding; hidden]
    tensors[f"{MTP_LAYER}input_proj.weight"] = torch.cat([eh_proj[:, d:], eh_proj[:, :d]], dim=1)  # [hidden; embedding]
    tensors[f"{MTP_LAYER}final_layernorm.weight"] = own["norm.weight"].clone()
    for i in range(config.n_layer_blocks):
        for bias in BIASES:
            tensors |= {f"model.layers.{i}.{bias}": _zero_bias(tensors, f"model.layers.{i}.{bias}")}
    for bias in BIASES:
        tensors[f"{MTP_LAYER}{bias}"] = _zero_bias(tensors, f"{MTP_LAYER}{bias}")
    return tensors, mimo_config(config)


def _zero_bias(tensors: dict[str, Tensor], name: str) -> Tensor:
    """The zero bias of the projection whose weight sits beside ``name``."""
    weight = tensors[name.removesuffix(".bias") + ".weight"]
    return weight.new_zeros(weight.size(0))


def mimo_config(config: ModelConfig) -> dict[str, Any]:
    """config.json's fields (Qwen2's, MiMo's architecture, one MTP layer) for a model with this config."""
    return {
        "architectures": [MIMO_ARCHITECTURE],
        "model_type": "qwen2",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.ffn_hidden,
        "num_hidden_layers": config.n_layer_blocks,  # the trunk and head 1's block
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_seq_len,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "max_window_layers": config.n_layer_blocks,
        "attention_dropout": 0.0,
        "num_nextn_predict_layers": 1,
        FIRST_TOKEN_KEY: config.causal_first_token,
    }


def is_mimo(hf_config: dict[str, Any]) -> bool:
    """Whether a config.json declares MiMo's architecture."""
    return MIMO_ARCHITECTURE in (hf_config.get("architectures") or [])


def read_mimo_config(path: Path) -> ModelConfig:
    """The mtp config of a MiMo folder (its config.json): a causal-head model of two heads (depth 2 its MTP layer);
    one sentence for a folder that declares no MTP layer."""
    hf = read_json(path / "config.json")
    layers = hf.get("num_nextn_predict_layers") or 0
    if layers < 1:
        raise UserError(
            f"{path} is a MiMo folder with no MTP layer (num_nextn_predict_layers={layers}); give one that holds "
            "model.mtp_layers.0, as mtp's mimo export writes it."
        )
    try:
        width, heads = hf["hidden_size"], hf["num_attention_heads"]
        if hf.get("head_dim", width // heads) * heads != width:
            raise UserError(
                f"{path}: head_dim={hf['head_dim']} is not hidden_size / num_attention_heads, which mtp's model needs."
            )
        return ModelConfig(
            vocab_size=hf["vocab_size"],
            d_model=width,
            n_layers=hf["num_hidden_layers"] + 1,  # the MTP layer is depth 2's block
            n_heads=heads,
            n_kv_heads=hf.get("num_key_value_heads") or heads,
            ffn_multiple_of=ffn_multiple_for(width, hf["intermediate_size"]),
            n_future=2,
            head_type=CARRIED,
            causal_first_token=hf.get(FIRST_TOKEN_KEY, "zero"),
            max_seq_len=hf.get("max_position_embeddings", 4096),
            rope_theta=float(hf.get("rope_theta", 10000.0)),
            norm_eps=hf.get("rms_norm_eps", 1e-6),
        )
    except KeyError as err:
        raise UserError(f"{path / 'config.json'} lacks {err.args[0]}; is it a MiMo config?") from err


def read_mimo(path: Path) -> ModelFiles:
    """A MiMo folder as a causal-head mtp model: the trunk and head 1 from the Qwen2 model, depth 2 from
    ``model.mtp_layers.0``. Refused in one sentence: a folder with no MTP layer, a q/k/v bias that is not zero (mtp's
    blocks have none), and a ``final_layernorm`` other than the trunk's norm (mtp's heads share it)."""
    config = read_mimo_config(path)
    tensors = read_tensors(path)
    if not any(name.startswith(MTP_LAYER) for name in tensors):
        raise UserError(
            f"{path} is a MiMo folder with no MTP layer (no {MTP_LAYER}* tensors); give one that holds it, as "
            "mtp's mimo export writes it."
        )
    for name in [n for n in tensors if n.endswith(BIASES)]:
        if tensors[name].count_nonzero():
            raise UserError(
                f"{path}: {name} is not zero, and mtp's blocks have no q/k/v biases; mtp imports MiMo folders whose "
                "biases are zero (as mtp's mimo export writes them)."
            )
        del tensors[name]
    expected = expected_shapes(config)
    names = mimo_names(config)
    d = config.d_model
    derived = {
        f"{MTP_LAYER}input_proj.weight": torch.Size((d, 2 * d)),
        f"{MTP_LAYER}final_layernorm.weight": torch.Size((d,)),
    }
    check_tensors(tensors, {mimo: expected[ours] for mimo, ours in names.items()} | derived, path)
    if not torch.equal(tensors[f"{MTP_LAYER}final_layernorm.weight"], tensors["model.norm.weight"]):
        raise UserError(
            f"{path}: the MTP layer's final_layernorm differs from model.norm, and mtp's causal heads share the final "
            "norm; mtp imports MiMo folders whose two norms are equal (as mtp's mimo export writes them)."
        )
    weights = {ours: tensors[mimo] for mimo, ours in names.items()}
    input_proj = tensors[f"{MTP_LAYER}input_proj.weight"]  # (d, 2d) over [hidden; embedding]
    weights["heads.inputs.0.eh_proj.weight"] = torch.cat([input_proj[:, d:], input_proj[:, :d]], dim=1)
    return ModelFiles(config, weights, directory_tokenizer(path))
