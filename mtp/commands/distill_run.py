"""What the distillation command is asked, typed (:class:`DistillRun`): its flags by name, read from the command line
or from a training run's ``distill`` node (:func:`mtp.commands.distill.settings_of`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class DistillRun:
    """What a distillation is asked: this command's flags by name, typed (the parsed flags, or a training run's
    ``distill`` node over their defaults: :func:`settings_of`; the defaults are the flags'); each function below reads
    the ones it needs."""

    checkpoint: Path
    out: Path
    source: str | None
    paths: list[str]
    packages: list[str]
    name: str
    subset: str | None
    split: str
    text_field: str
    streaming: bool
    val_fraction: float
    prompt_tokens: str
    """MIN,MAX (or one count for both)."""
    prompts_per_document: int
    prompts: Path | None
    prompt_field: str
    chat_template: bool
    replies: str
    new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    batch_size: int
    device: str
    dtype: str
    shard_prompts: int | None
    max_prompts: int
    max_tokens: int
    max_minutes: float
    force: bool

    def __post_init__(self) -> None:
        """A config's values as the flags read them: paths as Paths, one path or package as a list of one, the
        prompt span as its MIN,MAX text."""
        self.checkpoint, self.out = Path(self.checkpoint), Path(self.out)
        self.prompts = Path(self.prompts) if self.prompts is not None else None
        self.paths = [self.paths] if isinstance(self.paths, str) else list(self.paths)
        self.packages = [self.packages] if isinstance(self.packages, str) else list(self.packages)
        if isinstance(self.prompt_tokens, list | tuple):
            self.prompt_tokens = ",".join(map(str, self.prompt_tokens))
        self.prompt_tokens = str(self.prompt_tokens)
        self.max_minutes = float(self.max_minutes or 0.0)  # a config's null: no time budget; its 8: 8.0
