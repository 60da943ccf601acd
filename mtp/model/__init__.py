"""The model: its parts (:mod:`~mtp.model.blocks`), the head types (:mod:`~mtp.model.heads`) and MTPModel
(:mod:`~mtp.model.transformer`), re-exported here: ``from mtp.model import MTPModel``."""

from mtp.model.transformer import MTPModel

__all__ = ["MTPModel"]
