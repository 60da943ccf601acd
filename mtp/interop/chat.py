"""What a model declares about chat in its own files: the template (Jinja, as transformers renders it) and the
tokens that open and end a turn. A GGUF file keeps them in its metadata (``tokenizer.chat_template``,
``tokenizer.ggml.bos/eos_token_id``), a Hugging Face directory in ``tokenizer_config.json`` (or
``chat_template.jinja``); an mtp checkpoint carries those of the model its training started from
(:func:`mtp.checkpoint.load.model_chat` reads every format). :class:`ChatTemplate` renders a user message in that
template, as the benchmarks put HumanEval to a chat model and self-distillation its prompts."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from mtp.errors import SettingError, literal
from mtp.interop.gguf import metadata, open_gguf


@dataclass(frozen=True)
class ModelChat:
    """What a model says about chat: its template (Jinja, as transformers renders it) and special tokens."""

    template: str | None = None
    bos_token: str = ""
    eos_token: str | None = None
    """The token that ends the model's turn (llama.cpp's and transformers' ``eos``): generation stops there too."""

    def to_dict(self) -> dict[str, Any] | None:
        """The checkpoint's entry: None where the model declares no template (nothing to carry)."""
        return asdict(self) if self.template else None

    @classmethod
    def from_dict(cls, entry: dict[str, Any] | None) -> ModelChat:
        return cls(**entry) if entry else cls()


def gguf_chat(path: Path, tokenizer: Tokenizer | None) -> ModelChat:
    """A GGUF file's template and, given its tokenizer, its start and end tokens."""
    meta = metadata(open_gguf(path), skip_arrays=True)

    def token(key: str) -> str | None:
        return tokenizer.id_to_token(meta[key]) if tokenizer is not None and key in meta else None

    return ModelChat(
        meta.get("tokenizer.chat_template"),
        token("tokenizer.ggml.bos_token_id") or "",
        token("tokenizer.ggml.eos_token_id"),
    )


def hf_chat(path: Path) -> ModelChat:
    """A Hugging Face directory's template (the default of named ones) and start and end tokens."""
    config = hf_tokenizer_config(path)
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if template is None and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text(encoding="utf-8")

    def token(key: str) -> str | None:
        value = config.get(key)
        return value.get("content") if isinstance(value, dict) else value

    return ModelChat(template, token("bos_token") or "", token("eos_token"))


def hf_tokenizer_config(path: Path) -> dict[str, Any]:
    config_file = path / "tokenizer_config.json"
    return json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}


class ChatTemplate:
    """A model's chat template, rendered as transformers' ``apply_chat_template`` renders it (a sandboxed Jinja
    environment with trim_blocks and lstrip_blocks), for one user message and the assistant's turn to come."""

    def __init__(self, chat: ModelChat, model: str | os.PathLike) -> None:
        if not chat.template:
            raise SettingError(
                f"{{chat_template:name}}: {literal(model)} declares no chat template (an mtp checkpoint carries that "
                "of the model its training started from, a GGUF file keeps it in tokenizer.chat_template, a Hugging "
                "Face directory in tokenizer_config.json); drop {chat_template:name}.",
                chat_template=True,
            )
        try:
            from jinja2 import TemplateError  # optional (comes with transformers): only for chat templates
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as err:  # optional: only chat templates need it
            raise SettingError(
                "{chat_template:name} renders the model's template with jinja2; pip install jinja2.", chat_template=True
            ) from err

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = raise_exception
        self._error = TemplateError
        self._bos, self._eos = chat.bos_token, chat.eos_token or ""
        try:
            self._template = environment.from_string(chat.template)
        except TemplateError as err:
            raise SettingError(
                f"{{chat_template:name}}: {literal(model)}'s chat template does not parse ({literal(err)}); drop "
                "{chat_template:name}.",
                chat_template=True,
            ) from None

    def render(self, text: str) -> str:
        """``text`` as a user message, followed by the opening of the assistant's reply."""
        messages = [{"role": "user", "content": text}]
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=True, bos_token=self._bos, eos_token=self._eos
            )
        except self._error as err:
            raise SettingError(
                f"{{chat_template:name}}: the model's chat template failed ({literal(err)}); drop "
                "{chat_template:name}.",
                chat_template=True,
            ) from None
