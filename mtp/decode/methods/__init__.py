"""The decoding methods, one module each in this folder, registered by name (:mod:`.base`): the target's heads, a
draft model, layer skip, prompt lookup. Every module here is imported with the package, so a new method is one new
module: a :class:`~mtp.decode.methods.base.DecodingMethod` subclass with ``@register`` gets the decoding command's
flags (a test file may register one the same way); what the layers above do with it is theirs to register."""

import importlib
import pkgutil

from mtp.decode.methods.base import (
    REGISTRY,
    DecodingMethod,
    DrafterSettings,
    Target,
    drafters,
    register,
    unregister,
)

for _module in ("heads", *sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name not in ("base", "heads"))):
    importlib.import_module(f"{__name__}.{_module}")  # each registers its method on import: the heads first

__all__ = [
    "REGISTRY",
    "DecodingMethod",
    "DrafterSettings",
    "Target",
    "drafters",
    "register",
    "unregister",
]
