"""Start training from a trained mtp model: take its trunk and head 1 (and heads of the same type), add heads, freeze.

``init_from=PATH`` (an mtp checkpoint, a Hugging Face Llama directory or a Meta multi-token directory: see
:mod:`mtp.interop`) keeps the checkpoint's model as it is (vocabulary, tokenizer, width, blocks) and grows it to
``model.n_future`` heads of ``model.head_type``: ``model.n_layers`` becomes the checkpoint's blocks plus the new
heads' blocks, so no trunk block is given up. Every head type computes head 1 the same way (all of ``layers``,
the shared norm, the first unembedding), so the trunk and head 1 carry over between types; heads 2..n carry over
too when the checkpoint has them and they are of the same type. ``freeze`` then picks what trains:

- ``none``: everything (the paper's fine-tuning of a next-token model into an MTP model);
- ``trunk``: all but the embedding and the trunk blocks (head 1 and the heads train);
- ``loaded``: only what was added (Medusa-1).

Frozen parameters get no gradient and no optimizer state, and stay bit-identical through training.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from mtp.checkpoint.format import CHECKPOINT_KEY, model_weights, read_checkpoint
from mtp.checkpoint.load import foreign_format, model_chat, read_foreign, read_foreign_config
from mtp.errors import UserError
from mtp.interop.chat import ModelChat
from mtp.model import MTPModel
from mtp.model.config import HEAD_TYPES, ModelConfig, head_blocks, stored_model_config, swiglu_width
from mtp.model.heads import current_names

FREEZE_MODES = ("none", "trunk", "loaded")
# settings the trunk's weights fix; the checkpoint's value must be the config's
SHAPE_SETTINGS = ("vocab_size", "d_model", "n_heads", "n_kv_heads", "ffn_multiple_of", "rope_theta", "norm_eps")
# settings taken from the checkpoint too, unless the command line sets them: the rotary tables' reach
CONTEXT_SETTINGS = ("max_seq_len",)
# settings that change what head 2..n's weights mean: the checkpoint's heads carry over only when all are equal
HEAD_SETTINGS = ("head_type", "share_depth", "medusa_layers", "eagle3_layers", "draft_vocab")


@dataclass
class Start:
    """A checkpoint to start from: its model config, weights (the model's own names), tokenizer JSON and what it
    declares about chat (carried into the checkpoints trained from it)."""

    path: str
    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: str
    chat: ModelChat = ModelChat()

    @classmethod
    def read(cls, path: str | Path) -> Start:
        """An mtp checkpoint, or a Hugging Face Llama or Meta multi-token directory (:mod:`mtp.interop`)."""
        if foreign_format(path):
            files = read_foreign(path)
            chat = model_chat(path, Tokenizer.from_str(files.tokenizer))
            return cls(str(path), files.config, current_names(files.weights), files.tokenizer, chat)
        checkpoint = read_checkpoint(path)
        if Path(path).is_dir():
            raise UserError(
                f"init_from={path} is a sharded (FSDP) checkpoint folder; start from a single-file .ckpt (train the "
                "first model with another strategy, or convert it with torch.distributed.checkpoint.format_utils)."
            )
        meta = checkpoint[CHECKPOINT_KEY]
        weights = current_names(model_weights(checkpoint))  # a checkpoint of the earlier layout too
        config, chat = stored_model_config(meta["model_config"]), ModelChat.from_dict(meta.get("chat"))
        return cls(str(path), config, weights, meta["tokenizer"], chat)

    def grown(self, settings: dict[str, Any]) -> dict[str, Any]:
        """The model settings to train: ``settings`` with ``n_layers`` grown from the checkpoint's blocks.

        Shape settings that contradict the checkpoint are a user error naming all of them and their fix.
        """
        asked = {name: settings.get(name, getattr(ModelConfig, name)) for name in SHAPE_SETTINGS}
        same = {name: asked[name] == getattr(self.config, name) for name in SHAPE_SETTINGS}
        # what ffn_multiple_of fixes is the SwiGLU width: another multiple that gives the same width is as good
        # (at another d_model the width differs anyway: d_model is the setting to name)
        same["ffn_multiple_of"] = (
            not same["d_model"] or swiglu_width(asked["d_model"], asked["ffn_multiple_of"]) == self.config.ffn_hidden
        )
        wrong = [(name, asked[name], getattr(self.config, name)) for name in SHAPE_SETTINGS if not same[name]]
        if wrong:
            has = ", ".join(f"model.{name}={trained}" for name, _, trained in wrong)
            values = ", ".join(str(value) for _, value, _ in wrong)
            fix = " ".join(f"model.{name}={trained}" for name, _, trained in wrong)
            raise UserError(
                f"init_from={self.path} has {has} but the config asks for {values}; add the overrides {fix} "
                "(or choose the size and model presets it was trained with)."
            )
        head_type = settings.get("head_type", ModelConfig.head_type)
        if head_type not in HEAD_TYPES:  # ModelConfig's validation says which types there are
            return settings
        n_future, share_depth = settings.get("n_future", ModelConfig.n_future), settings.get("share_depth", False)
        return {**settings, "n_layers": self.config.n_layer_blocks + head_blocks(head_type, n_future, share_depth)}

    def load_into(self, model: MTPModel) -> set[str]:
        """Copy the checkpoint's trunk, head 1 and same-type heads into ``model``; returns the parameter names loaded.

        New heads start as their type prescribes: blocks (transformer, causal) as copies of head 1's block,
        unembeddings of types that have their own as copies of head 1's (Medusa's residual layers stay zero).
        """
        same_heads = all(getattr(self.config, s) == getattr(model.config, s) for s in HEAD_SETTINGS)
        own = model.state_dict()
        taken = {}
        for name, tensor in self.weights.items():
            shared = name.startswith(("tok_embeddings.", "layers.", "norm.", "heads.outputs.0."))
            if (shared or same_heads) and name in own and own[name].shape == tensor.shape:
                taken[name] = tensor
        model.load_state_dict(taken, strict=False)
        model.heads.grow(
            model.head_block(1), {name.removeprefix("heads.") for name in taken if name.startswith("heads.")}
        )
        return set(taken)


def start_config(path: str | Path) -> ModelConfig:
    """The model config of a checkpoint to start from (any format :class:`Start` reads), without its weights."""
    if foreign_format(path):
        return read_foreign_config(path)
    return stored_model_config(read_checkpoint(path, mmap=Path(path).is_file())[CHECKPOINT_KEY]["model_config"])


def settings_from_checkpoint(path: str | Path, settings: dict[str, Any], explicit: Collection[str]) -> dict[str, Any]:
    """``settings`` with the shapes of the checkpoint at ``path``: vocabulary, width, heads, key-value heads, SwiGLU
    width, rope theta, norm eps and context are the checkpoint's, so a user starting from a model names none of them.

    ``explicit``: the model settings the user set on the command line. One that contradicts the checkpoint's weights
    is a user error naming the override to drop; an explicit context (``max_seq_len``) is kept, as rotary tables
    reach any length.
    """
    trained = start_config(path)
    contradicted = []
    for name in SHAPE_SETTINGS:
        ours = getattr(trained, name)
        same = settings.get(name, ours) == ours
        if name == "ffn_multiple_of" and "d_model" not in explicit:  # another multiple giving the same width is fine
            same = swiglu_width(trained.d_model, settings.get(name, ours)) == trained.ffn_hidden
        if name in explicit and not same:
            contradicted.append(name)
        else:
            settings = {**settings, name: ours}
    if contradicted:
        has = ", ".join(f"model.{name}={getattr(trained, name)}" for name in contradicted)
        asked = " ".join(f"model.{name}={settings[name]}" for name in contradicted)
        raise UserError(
            f"init_from={path} has {has}, which its weights fix, but the command line asks for {asked}; drop "
            f"{'that override' if len(contradicted) == 1 else 'those overrides'} (init_from takes the shapes from the "
            "checkpoint)."
        )
    for name in CONTEXT_SETTINGS:
        if name not in explicit:
            settings = {**settings, name: getattr(trained, name)}
    if "causal_first_token" not in explicit and settings.get("head_type") == trained.head_type:
        # heads of the checkpoint's type carry over: what they were trained to read at position 0 comes with them
        settings = {**settings, "causal_first_token": trained.causal_first_token}
    return settings


def freeze(model: MTPModel, mode: str, loaded: set[str]) -> None:
    """Stop gradients of what ``mode`` freezes (see the module docstring)."""
    if mode == "none":
        return
    if mode == "loaded":
        frozen = loaded
        if all(name in loaded for name, _ in model.named_parameters()):
            raise UserError(
                "freeze=loaded leaves nothing to train: the checkpoint already holds every head; ask for more "
                "heads (model.n_future) or another model.head_type, or use freeze=trunk or freeze=none."
            )
    else:  # trunk
        trunk = {id(p) for p in [model.tok_embeddings.weight, *model.trunk_blocks.parameters()]}
        frozen = {name for name, p in model.named_parameters() if id(p) in trunk}
    for name, parameter in model.named_parameters():
        if name in frozen:
            parameter.requires_grad_(False)


def check_freeze(mode: str, init_from: str | None) -> None:
    if mode not in FREEZE_MODES:
        raise UserError(f"freeze={mode!r} is not one of {', '.join(FREEZE_MODES)}.")
    if mode != "none" and not init_from:
        raise UserError(f"freeze={mode} needs a trained model to start from; set init_from=PATH/last.ckpt.")
