"""Cached decoding: autoregressive, self-speculative (chains and trees of the heads' drafts) and drafted.

The parts, bottom to top: the engine (:mod:`~mtp.decode.inference`, :mod:`~mtp.decode.cache`), the plan of a run and
its parts (:mod:`~mtp.decode.plan`, :mod:`~mtp.decode.settings`), the acceptance rules (:mod:`~mtp.decode.acceptance`),
the heads' proposers (:mod:`~mtp.decode.heads_proposer`), and the loop (:mod:`~mtp.decode.loop`); the other
methods, each with its proposer, above it (:mod:`~mtp.decode.methods`); statistics beside them
(:mod:`~mtp.decode.stats`).
"""

from mtp.decode.cache import KVCache
from mtp.decode.loop import generate
from mtp.decode.plan import Drafting, Plan
from mtp.decode.settings import DraftSettings, GenerationConfig, HeadsSettings, StepSettings
from mtp.decode.stats import DecodeStats
from mtp.errors import SettingError

__all__ = [
    "DecodeStats",
    "DraftSettings",
    "Drafting",
    "GenerationConfig",
    "HeadsSettings",
    "KVCache",
    "Plan",
    "SettingError",
    "StepSettings",
    "generate",
]
