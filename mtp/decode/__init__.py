"""Decoding: KV cache, sampling, and autoregressive / self-speculative generation as plain functions."""

from mtp.decode.cache import KVCache
from mtp.decode.generation import DecodeStats, GenerationConfig, generate

__all__ = ["DecodeStats", "GenerationConfig", "KVCache", "generate"]
