"""Data: sources (datasets), tokenizers (tokenizers), packed shards and the LightningDataModule."""

from mtp.data.datamodule import MTPDataModule

__all__ = ["MTPDataModule"]
