"""Draft heads in the layouts the serving engines load: EAGLE-3 (vLLM, SGLang, llama.cpp) and Medusa (vLLM).

Each engine reads a draft as a Hugging Face directory of its own (config.json, model.safetensors) beside the target
model it drafts for; these are the names and settings they read, from their sources:

- **EAGLE-3** (vLLM ``model_executor/models/llama_eagle3.py``, SGLang ``models/llama_eagle3.py``, llama.cpp's
  ``convert_hf_to_gguf.py`` into its ``eagle3`` architecture): ``midlayer.*`` the one decoder layer under Llama's
  names, its attention's q/k/v reading [input_layernorm(embedding); hidden_norm(state)] (2d wide); ``fc.weight``
  (d, 3d) over the target's three layers' inputs, low to high as ``eagle_aux_hidden_state_layer_ids`` lists them;
  ``norm.weight``; ``lm_head.weight`` over the draft vocabulary; ``d2t`` (int64, the offset of each draft id's target
  id: target = draft + d2t[draft]) and ``t2d`` (bool over the target's vocabulary) when it is reduced. No embedding:
  the engines take the target's. The layer ids are read from ``eagle_config.eagle_aux_hidden_state_layer_ids`` by
  vLLM and from the top level by llama.cpp's converter: both are written. mtp's ``eagle3`` heads are this exactly.
- **Medusa** (vLLM ``model_executor/models/medusa.py``, ``transformers_utils/configs/medusa.py``): ``blocks.{h}.layers
  .{j}.weight`` (head h's residual layers x + SiLU(W x), no bias) on the target's final normed state, then
  ``lm_heads.{h}.weight``; ``token_map`` (int64 target ids) with ``truncated_vocab_size`` when the vocabulary is
  reduced. mtp's ``medusa`` heads are this exactly.

Other head types are no such draft: ``transformer`` heads are blocks beside head 1's block on the trunk output
(head 2 alone equals a one-draft EAGLE-3 whose ``fc`` passes the last layer's input through, with the embedding half
of q/k/v zero: tests/interop/test_engines.py builds it), ``causal`` heads are DeepSeek-V3 MTP modules (which the
engines run only inside architectures that declare them, not Llama), ``linear`` heads are unembeddings of the trunk
output.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from mtp.errors import SettingError
from mtp.interop.llama import BLOCK_NAMES, llama_config
from mtp.model import MTPModel
from mtp.model.config import ModelConfig

ENGINE_FORMATS = {"eagle3": "eagle3", "medusa": "medusa"}
"""Each engine layout and the mtp head type it carries exactly."""
EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"
EAGLE3_LAYER = {
    **{name: hf for name, hf in BLOCK_NAMES.items() if name != "attention_norm.weight"},
    "attention_norm.embedding_norm.weight": "input_layernorm.weight",
    "attention_norm.state_norm.weight": "hidden_norm.weight",
}
"""The draft layer's tensors: mtp name (under ``heads.layer.``) -> its name under ``midlayer.``."""


def carries(config: ModelConfig, layout: str) -> bool:
    """Whether ``layout`` carries this model's heads (:data:`ENGINE_FORMATS`): heads of its type, a draft at least."""
    return config.head_type == ENGINE_FORMATS[layout] and config.n_future > 1


def check_carries(config: ModelConfig, layout: str) -> None:
    """A :class:`~mtp.errors.SettingError` naming the export's ``format`` unless ``layout`` carries this model's
    heads."""
    head_type = ENGINE_FORMATS[layout]
    if not carries(config, layout):
        carried = ", ".join(f"{fmt} carries {kind} heads" for fmt, kind in ENGINE_FORMATS.items())
        what = f"{config.head_type} heads" if config.n_future > 1 else "no draft heads (model.n_future=1)"
        raise SettingError(
            f"{{format}} cannot carry this checkpoint's {what} ({carried}); train heads of that type "
            f"(model.head_type={head_type}), or export {{format:hf}}, which keeps every head for mtp to read back.",
            format=layout,
        )


def eagle3_layout(model: MTPModel) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The EAGLE-3 draft of ``model`` (eagle3 heads): its tensors under the engines' names, and its config.json."""
    config = model.config
    check_carries(config, "eagle3")
    heads = model.heads
    layer = {f"heads.layer.{name}": tensor for name, tensor in heads.layer.state_dict().items()}
    tensors = {f"midlayer.{hf}": layer[f"heads.layer.{name}"] for name, hf in EAGLE3_LAYER.items()}
    tensors |= {"fc.weight": heads.fc.weight, "norm.weight": heads.norm.weight, "lm_head.weight": model.head_weight(2)}
    tensors |= vocabulary_maps(model)
    settings = {
        "architectures": [EAGLE3_ARCHITECTURE],
        "model_type": "llama",
        **llama_config(config),
        "num_hidden_layers": 1,
        "draft_vocab_size": tensors["lm_head.weight"].size(0),
        "target_hidden_size": config.d_model,
        "eagle_aux_hidden_state_layer_ids": config.feature_layers,  # llama.cpp's converter reads it here
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": config.feature_layers, "use_aux_hidden_state": True},
    }
    return tensors, settings


def vocabulary_maps(model: MTPModel) -> dict[str, Tensor]:
    """``d2t`` (draft id -> target id offset, int64) and ``t2d`` (target ids the draft scores, bool) of a reduced draft
    vocabulary (EAGLE-3's names); none for a draft over every token."""
    vocab = model.head_vocab(2)
    if vocab is None:
        return {}
    in_draft = torch.zeros(model.config.vocab_size, dtype=torch.bool)
    in_draft[vocab.cpu()] = True
    return {"d2t": (vocab - torch.arange(vocab.numel(), device=vocab.device)).long(), "t2d": in_draft}


def medusa_layout(model: MTPModel) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The Medusa heads of ``model`` (medusa heads) under vLLM's names, and their config.json."""
    config = model.config
    check_carries(config, "medusa")
    tensors = {}
    for h in range(config.n_future - 1):
        for j, layer in enumerate(model.heads.residual_layers(h + 2)):
            tensors[f"blocks.{h}.layers.{j}.weight"] = layer.weight
        tensors[f"lm_heads.{h}.weight"] = model.head_weight(h + 2)
    vocab = model.head_vocab(2)
    if vocab is not None:
        tensors["token_map"] = vocab.long()
    settings = {
        "architectures": ["MedusaModel"],
        "model_type": "medusa",
        "hidden_size": config.d_model,
        "vocab_size": config.vocab_size,
        "num_heads": config.n_future - 1,
        "num_hidden_layers": config.medusa_layers,
        "truncated_vocab_size": tensors["lm_heads.0.weight"].size(0),
        "medusa_fc_bias": False,
    }
    return tensors, settings
