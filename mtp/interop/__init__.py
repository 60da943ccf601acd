"""Conversions between mtp models and other formats (no foreign package is imported at module level)."""
