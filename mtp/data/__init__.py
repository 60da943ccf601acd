"""Data: sources (datasets), tokenizers (tokenizers), packed shards and the LightningDataModule.

``MTPDataModule`` is imported on first use, so that the lighter modules (packing, tokenizer) load without Lightning.
"""

__all__ = ["MTPDataModule"]


def __getattr__(name: str):
    if name == "MTPDataModule":
        from mtp.data.datamodule import MTPDataModule  # start-up time: Lightning and datasets only when asked

        return MTPDataModule
    raise AttributeError(f"module 'mtp.data' has no attribute {name!r}")
