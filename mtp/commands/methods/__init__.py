"""The drafting methods the commands offer, one module each in this folder, registered by name (:mod:`.base`): a
draft model, layer skip, prompt lookup. Every module here is imported with the package, so a new method is one new
module: a :class:`~mtp.commands.methods.base.DraftingMethod` subclass with ``@register`` gets decode's flags and
bench_decode's rows (a test file may register one the same way)."""

import importlib
import pkgutil

from mtp.commands.methods.base import REGISTRY, DraftingMethod, Target, register, unregister

for _module in pkgutil.iter_modules(__path__):  # each registers its method on import, in name order
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["REGISTRY", "DraftingMethod", "Target", "register", "unregister"]
