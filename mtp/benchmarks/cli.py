"""Argument types shared by the benchmark scripts."""

from __future__ import annotations

import argparse


def int_list(text: str) -> list[int]:
    """A comma-separated list of positive integers, e.g. 1,2,4,8."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers, e.g. 1,2,4,8") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} has a value below 1; every entry must be a positive integer")
    return values
