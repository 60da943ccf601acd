"""Packed token shards: documents joined with end-of-text into flat uint16/uint32 ``.bin`` files.

A cache entry is a folder ``<cache_dir>/<source>-<tokenizer>-<fingerprint>/`` holding ``train.bin``,
``validation.bin``, ``tokenizer.json`` and ``meta.json``. The fingerprint covers the source, the
tokenizer and the settings, so a rerun reuses the entry and any change builds a new one. An entry
is built in a temporary folder and renamed into place only when complete: a folder under the final
name is always whole, and an interrupted build leaves only a ``.partial-*`` folder that no run trusts.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from mtp.data.sources import SourceConfig, iter_texts, load_documents, source_identity, split_documents
from mtp.data.tokenizer import TOKENIZER_KINDS, build_tokenizer, eot_id, is_checkpoint, pretrained_json
from mtp.errors import UserError

FORMAT_VERSION = 1
SPLITS = ("train", "validation")


@dataclass
class TokenizerConfig:
    kind: str = "bpe"
    vocab_size: int = 8192
    """bpe: vocabulary size to train (end-of-text included)."""
    path: str | None = None
    """pretrained: a tokenizer.json file, or an mtp checkpoint whose tokenizer to use (a draft for that model)."""
    train_bytes: int = 0
    """bpe: train on at most this many bytes of the training split (0: all of it)."""

    def __post_init__(self) -> None:
        if self.kind not in TOKENIZER_KINDS:
            raise UserError(f"data.tokenizer.kind={self.kind!r} is not one of {', '.join(TOKENIZER_KINDS)}.")

    def identity(self) -> dict[str, Any]:
        if self.kind == "byte":
            return {"kind": "byte"}
        if self.kind == "bpe":
            return {"kind": "bpe", "vocab_size": self.vocab_size, "train_bytes": self.train_bytes}
        if not self.path or not (Path(self.path).is_file() or is_checkpoint(self.path)):
            raise UserError(
                f"data.tokenizer.path={self.path!r} is not a tokenizer.json file or an mtp checkpoint; point it at one."
            )
        return {"kind": "pretrained", "sha256": hashlib.sha256(pretrained_json(self.path).encode()).hexdigest()}


def fingerprint(source: SourceConfig, tokenizer: TokenizerConfig, val_fraction: float) -> str:
    settings = {
        "format": FORMAT_VERSION,
        "source": source_identity(source),
        "tokenizer": tokenizer.identity(),
        "val_fraction": val_fraction,
    }
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    return f"{source.kind}-{tokenizer.kind}-{digest}"


@dataclass
class PackedData:
    """A complete cache entry, opened read-only."""

    path: Path
    meta: dict[str, Any]
    tokenizer: Tokenizer

    def tokens(self, split: str) -> np.memmap:
        return np.memmap(self.path / f"{split}.bin", dtype=self.meta["dtype"], mode="r")


def token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 2**16 else "uint32"


def open_packed(path: Path) -> PackedData:
    """Open a cache entry, checking that every shard has the size its meta.json promises."""
    meta = json.loads((path / "meta.json").read_text())
    itemsize = np.dtype(meta["dtype"]).itemsize
    for split in SPLITS:
        shard = path / f"{split}.bin"
        expected = meta["tokens"][split] * itemsize
        if not shard.is_file() or shard.stat().st_size != expected:
            raise UserError(
                f"data cache {path} is damaged ({shard.name} is not {expected} bytes); delete that folder and rerun."
            )
    return PackedData(path, meta, Tokenizer.from_file(str(path / "tokenizer.json")))


def prepare(source: SourceConfig, tokenizer: TokenizerConfig, val_fraction: float, cache_dir: str | Path) -> PackedData:
    """The packed data for these settings: reused if already built, otherwise built now."""
    cache_dir = Path(cache_dir)
    name = fingerprint(source, tokenizer, val_fraction)
    final = cache_dir / name
    if (final / "meta.json").is_file():
        return open_packed(final)
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = cache_dir / f"{name}.partial-{uuid.uuid4().hex[:8]}"
    try:
        _build(partial, source, tokenizer, val_fraction, name)
        try:
            os.rename(partial, final)
        except OSError:  # another process finished the same entry first: use theirs
            if not (final / "meta.json").is_file():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return open_packed(final)


def _build(out: Path, source: SourceConfig, tok_config: TokenizerConfig, val_fraction: float, name: str) -> None:
    out.mkdir(parents=True)
    splits = split_documents(load_documents(source), val_fraction)
    tokenizer = build_tokenizer(
        tok_config.kind,
        _training_texts(splits["train"], tok_config.train_bytes),
        tok_config.vocab_size,
        tok_config.path,
    )
    dtype = token_dtype(tokenizer.get_vocab_size())
    eot = eot_id(tokenizer)
    counts: dict[str, int] = {}
    documents: dict[str, int] = {}
    for split in SPLITS:
        counts[split], documents[split] = _write_shard(out / f"{split}.bin", splits[split], tokenizer, eot, dtype)
    if counts["train"] == 0:
        raise UserError(f"the {source.kind} source gave no training text; point data.source at non-empty documents.")
    tokenizer.save(str(out / "tokenizer.json"))
    meta = {
        "name": name,
        "source": asdict(source),
        "tokenizer": asdict(tok_config),
        "val_fraction": val_fraction,
        "dtype": dtype,
        "vocab_size": tokenizer.get_vocab_size(),
        "eot_id": eot,
        "tokens": counts,
        "documents": documents,
    }
    # meta.json is written last: its presence marks a complete entry.
    (out / "meta.json").write_text(json.dumps(meta, indent=2))


def _training_texts(dataset, max_bytes: int):
    seen = 0
    for batch in iter_texts(dataset):
        for text in batch:
            yield text
            seen += len(text)
            if max_bytes and seen >= max_bytes:
                return


def _write_shard(path: Path, dataset, tokenizer: Tokenizer, eot: int, dtype: str) -> tuple[int, int]:
    """Encode every document, append end-of-text after each, write as ``dtype``; returns (tokens, documents)."""
    n_tokens = n_docs = 0
    with open(path, "wb") as f:
        for texts in iter_texts(dataset, batch_size=512):
            encodings = tokenizer.encode_batch(texts)  # with the tokenizer's own start token, if any
            ids = list(itertools.chain.from_iterable(e.ids + [eot] for e in encodings))
            array = np.asarray(ids, dtype=dtype)
            f.write(array.tobytes())
            n_tokens += array.size
            n_docs += len(texts)
    return n_tokens, n_docs
