"""Cached decoding: autoregressive, self-speculative (chains and trees of the heads' drafts) and drafted.

The parts, bottom to top: the engine (:mod:`~mtp.decode.inference`, :mod:`~mtp.decode.cache`), the acceptance rules
(:mod:`~mtp.decode.acceptance`), the proposers (:mod:`~mtp.decode.proposers`), and the loop
(:mod:`~mtp.decode.loop`); settings and statistics beside them (:mod:`~mtp.decode.settings`,
:mod:`~mtp.decode.stats`).
"""

from mtp.decode.cache import KVCache
from mtp.decode.loop import generate
from mtp.decode.settings import DraftSettings, GenerationConfig, HeadsSettings, StepSettings
from mtp.decode.stats import DecodeStats
from mtp.errors import SettingError

__all__ = [
    "DecodeStats",
    "DraftSettings",
    "GenerationConfig",
    "HeadsSettings",
    "KVCache",
    "SettingError",
    "StepSettings",
    "generate",
]
