"""Packed token shards: documents joined with end-of-text into flat uint16/uint32 ``.bin`` files.

A cache entry is a folder ``<cache_dir>/<source>-<tokenizer>-<fingerprint>/`` holding ``train.bin``,
``validation.bin``, ``tokenizer.json`` and ``meta.json``. The fingerprint covers the source, the
tokenizer and the settings, so a rerun reuses the entry and any change builds a new one. An entry
is built in a temporary folder and renamed into place only when complete: a folder under the final
name is always whole, and an interrupted build leaves only a ``.partial-*`` folder that no run trusts.

Processes preparing the same entry at once (a sweep's jobs, the nodes of a run) take turns on an exclusive
lock, ``<cache_dir>/<name>.lock``: the first builds, the others wait and then open what it built. The kernel
releases the lock of a process that dies, so a killed builder blocks nobody; the next lock holder removes the
partial folders it left. Lock files stay (removing one would let two processes lock different files).
A write that fails (a full disk, a read-only or forbidden folder) is one :class:`UserError` naming the file.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer
from tqdm.auto import tqdm

from mtp.data.induction import generator_digest, induction_tokenizer
from mtp.data.sources import (
    SourceConfig,
    iter_texts,
    load_documents,
    source_identity,
    split_documents,
    stdlib_without_tests,
)
from mtp.data.tokenizer import TOKENIZER_KINDS, build_tokenizer, eot_id, pretrained_json
from mtp.errors import FULL_DISK, UserError

try:
    import fcntl
except ImportError:  # Windows: concurrent builds are not avoided, but the rename keeps them safe
    fcntl = None

FORMAT_VERSION = 1
SPLITS = ("train", "validation")
log = logging.getLogger(__name__)


@dataclass
class TokenizerConfig:
    kind: str = "bpe"
    vocab_size: int = 8192
    """bpe: vocabulary size to train (end-of-text included)."""
    path: str | None = None
    """pretrained: a tokenizer.json file. A model's path (an mtp checkpoint, a Hugging Face or Meta directory, a GGUF
    file; a draft for that model) is replaced by its tokenizer's file where the run is assembled
    (mtp.training.train)."""
    train_bytes: int = 0
    """bpe: train on at most this many bytes of the training split (0: all of it)."""

    def __post_init__(self) -> None:
        if self.kind not in TOKENIZER_KINDS:
            raise UserError(f"data.tokenizer.kind={self.kind!r} is not one of {', '.join(TOKENIZER_KINDS)}.")

    def identity(self) -> dict[str, Any]:
        if self.kind == "byte":
            return {"kind": "byte"}
        if self.kind == "induction":
            return {"kind": "induction", "generator": generator_digest()}
        if self.kind == "bpe":
            return {"kind": "bpe", "vocab_size": self.vocab_size, "train_bytes": self.train_bytes}
        if not self.path or not Path(self.path).is_file():
            raise UserError(
                f"data.tokenizer.path={self.path!r} is not a tokenizer.json file or a model checkpoint; "
                "point it at one."
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
    """The packed data for these settings: reused if already built, otherwise built now (by one process at a time:
    one that finds another building the same entry waits for it and reuses its result)."""
    cache_dir = Path(cache_dir)
    name = fingerprint(source, tokenizer, val_fraction)
    final = cache_dir / name
    if not (final / "meta.json").is_file():
        with writing_to_cache(cache_dir):
            cache_dir.mkdir(parents=True, exist_ok=True)
        with _exclusive(cache_dir / f"{name}.lock", final) as locked:
            if not (final / "meta.json").is_file():  # another process may have built it while this one waited
                log.info("preparing the data once for these settings (later runs reuse it): %s", final)
                _build_into_place(final, source, tokenizer, val_fraction, remove_stale=locked)
                log.info("data cached at %s", final)
    else:
        log.info("data: reusing %s", final)
    return open_packed(final)


def _build_into_place(
    final: Path, source: SourceConfig, tokenizer: TokenizerConfig, val_fraction: float, remove_stale: bool
) -> None:
    """Build in a partial folder, then rename it to ``final``. ``remove_stale``: this process holds the entry's lock,
    so every other partial folder of that name is a dead builder's."""
    if remove_stale:
        for stale in final.parent.glob(f"{final.name}.partial-*"):
            shutil.rmtree(stale, ignore_errors=True)
    partial = final.with_name(f"{final.name}.partial-{uuid.uuid4().hex[:8]}")
    try:
        _build(partial, source, tokenizer, val_fraction, final.name)
        try:
            os.rename(partial, final)
        except OSError as err:
            if not (final / "meta.json").is_file():  # else another process (no lock) finished it first: use theirs
                raise UserError(_write_failure(final, err)) from err
    finally:
        shutil.rmtree(partial, ignore_errors=True)


@contextmanager
def _exclusive(lock_path: Path, entry: Path) -> Iterator[bool]:
    """Hold an exclusive lock on ``lock_path``, saying so when waiting for another process; yields whether it is
    held (not without fcntl, nor on a file system without locks: then builds may overlap, and the rename keeps
    them safe)."""
    if fcntl is None:
        yield False
        return
    with writing_to_cache(lock_path):
        lock = open(lock_path, "a")
    with lock:  # closing the file releases the lock, and so does the kernel when this process dies
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process preparing %s", entry)
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError:  # ENOLCK, EOPNOTSUPP: some network file systems
            yield False
            return
        yield True


@contextmanager
def writing_to_cache(path: Path) -> Iterator[None]:
    """Turn a failed write at ``path`` (a full disk, a forbidden or read-only folder) into one sentence."""
    try:
        yield
    except OSError as err:
        raise UserError(_write_failure(path, err)) from err


def _write_failure(path: Path, err: OSError) -> str:
    path = err.filename or path  # mkdir names the folder it could not create; a write names no file
    if err.errno in FULL_DISK:
        fix = "free space there or set data.cache_dir to another disk"
    elif err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "make that folder writable or set data.cache_dir to a writable folder"
    else:
        fix = "check that folder or set data.cache_dir to another folder"
    return f"could not write the data cache at {path} ({err.strerror or err}); {fix}."


def _build(out: Path, source: SourceConfig, tok_config: TokenizerConfig, val_fraction: float, name: str) -> None:
    with writing_to_cache(out):
        out.mkdir(parents=True)
    if source.kind == "stdlib" and (warning := stdlib_without_tests()):
        log.warning(warning)
    splits = split_documents(load_documents(source), val_fraction)
    if tok_config.kind == "bpe":
        documents = _count(splits["train"])
        limit = f" (their first {tok_config.train_bytes:,} bytes)" if tok_config.train_bytes else ""
        log.info(
            "training a BPE tokenizer of %d tokens on %s training documents%s",
            tok_config.vocab_size, "the" if documents is None else documents, limit,
        )  # fmt: skip
    start = time.perf_counter()
    if tok_config.kind == "induction":
        tokenizer = induction_tokenizer()
    else:
        tokenizer = build_tokenizer(
            tok_config.kind,
            _training_texts(splits["train"], tok_config.train_bytes),
            tok_config.vocab_size,
            tok_config.path,
        )
    if tok_config.kind == "bpe":
        log.info("trained the tokenizer in %.1f s", time.perf_counter() - start)
    dtype = token_dtype(tokenizer.get_vocab_size())
    eot = eot_id(tokenizer)
    counts: dict[str, int] = {}
    documents: dict[str, int] = {}
    for split in SPLITS:
        counts[split], documents[split] = _write_shard(out / f"{split}.bin", splits[split], tokenizer, eot, dtype)
        log.info("packed %s: %d documents into %d tokens", split, documents[split], counts[split])
    if counts["train"] == 0:
        raise UserError(f"the {source.kind} source gave no training text; point data.source at non-empty documents.")
    _write_text(out / "tokenizer.json", tokenizer.to_str(pretty=True))
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
    _write_text(out / "meta.json", json.dumps(meta, indent=2))


def _write_text(path: Path, text: str) -> None:
    with writing_to_cache(path), open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _training_texts(dataset, max_bytes: int):
    seen = 0
    for batch in iter_texts(dataset):
        for text in batch:
            yield text
            seen += len(text)
            if max_bytes and seen >= max_bytes:
                return


def _count(dataset) -> int | None:
    """The number of documents of a dataset, None for a streamed one (unknown until read)."""
    try:
        return len(dataset)
    except TypeError:
        return None


def _write_shard(path: Path, dataset, tokenizer: Tokenizer, eot: int, dtype: str) -> tuple[int, int]:
    """Encode every document, append end-of-text after each, write as ``dtype``; returns (tokens, documents). A
    progress bar on a terminal counts the documents."""
    n_tokens = n_docs = 0
    with writing_to_cache(path):
        f = open(path, "wb")
    progress = tqdm(total=_count(dataset), desc=f"packing {path.stem}", unit=" docs", disable=None)
    try:
        for texts in iter_texts(dataset, batch_size=512):
            encodings = tokenizer.encode_batch(texts)  # with the tokenizer's own start token, if any
            ids = list(itertools.chain.from_iterable(e.ids + [eot] for e in encodings))
            array = np.asarray(ids, dtype=dtype)
            with writing_to_cache(path):  # only the writes: an error reading the documents is not the cache's
                f.write(array.tobytes())
            n_tokens += array.size
            n_docs += len(texts)
            progress.update(len(texts))
    finally:
        progress.close()
        with writing_to_cache(path):  # a full disk may show only here, when the last buffer is flushed
            f.close()
    return n_tokens, n_docs
