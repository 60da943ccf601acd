import json
import logging
import os
import shutil
import sys

import numpy as np
import pytest

from mtp.data import packing
from mtp.data.packing import TokenizerConfig, open_packed, prepare
from mtp.data.sources import SourceConfig
from mtp.errors import UserError


@pytest.fixture
def source(corpus_dir):
    return SourceConfig(kind="files", paths=[str(corpus_dir / "*.txt")])


@pytest.mark.parametrize("kind", ["byte", "bpe", "pretrained"])
def test_packing_round_trip(kind, source, corpus_dir, tmp_path):
    path = None
    if kind == "pretrained":
        path = tmp_path / "tokenizer.json"
        from mtp.data.tokenizer import train_bpe

        train_bpe([p.read_text() for p in corpus_dir.glob("*.txt")], 600).save(str(path))
    packed = prepare(
        source, TokenizerConfig(kind=kind, vocab_size=500, path=str(path) if path else None), 0.2, tmp_path / "c"
    )
    assert packed.meta["dtype"] == "uint16"
    eot = packed.meta["eot_id"]
    documents = []
    for split in ("train", "validation"):
        tokens = np.asarray(packed.tokens(split))
        assert tokens.size == packed.meta["tokens"][split] and tokens[-1] == eot
        pieces = np.split(tokens, np.flatnonzero(tokens == eot) + 1)[:-1]
        assert len(pieces) == packed.meta["documents"][split]
        documents += [packed.tokenizer.decode(piece[:-1].tolist()) for piece in pieces]
    originals = [p.read_text() for p in corpus_dir.glob("*.txt")]
    assert sorted(documents) == sorted(originals)


def test_rerun_reuses_and_a_change_rebuilds(source, tmp_path, monkeypatch):
    cache = tmp_path / "c"
    first = prepare(source, TokenizerConfig(kind="byte"), 0.1, cache)
    built = []
    original = packing._build
    monkeypatch.setattr(packing, "_build", lambda *a: (built.append(a), original(*a)))
    assert prepare(source, TokenizerConfig(kind="byte"), 0.1, cache).path == first.path
    assert built == []
    changed = prepare(source, TokenizerConfig(kind="byte"), 0.2, cache)
    assert changed.path != first.path and len(built) == 1
    bpe = prepare(source, TokenizerConfig(kind="bpe", vocab_size=300), 0.1, cache)
    assert bpe.path not in {first.path, changed.path}


def test_a_changed_file_rebuilds(corpus_dir, tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(corpus_dir, corpus)
    source = SourceConfig(kind="files", paths=[str(corpus / "*.txt")])
    first = prepare(source, TokenizerConfig(kind="byte"), 0.1, tmp_path / "c")
    (corpus / "doc000.txt").write_text("changed")
    assert prepare(source, TokenizerConfig(kind="byte"), 0.1, tmp_path / "c").path != first.path


def test_interrupted_preparation_is_never_trusted(source, tmp_path, monkeypatch):
    cache = tmp_path / "c"

    def interrupted(out, *args):
        out.mkdir(parents=True)
        (out / "train.bin").write_bytes(b"\0" * 10)  # a partial shard, then the process dies
        raise KeyboardInterrupt

    monkeypatch.setattr(packing, "_build", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare(source, TokenizerConfig(kind="byte"), 0.1, cache)
    assert [p.name for p in cache.iterdir() if p.suffix != ".lock"] == []  # nothing a later run would trust
    monkeypatch.undo()
    (cache / (packing.fingerprint(source, TokenizerConfig(kind="byte"), 0.1) + ".partial-dead")).mkdir()
    packed = prepare(source, TokenizerConfig(kind="byte"), 0.1, cache)
    assert packed.meta["tokens"]["train"] > 0
    if sys.platform != "win32":  # the lock holder removes what a dead builder left
        assert list(cache.glob("*.partial-*")) == []


def test_damaged_shard_is_detected(source, tmp_path):
    packed = prepare(source, TokenizerConfig(kind="byte"), 0.1, tmp_path / "c")
    shard = packed.path / "train.bin"
    os.truncate(shard, shard.stat().st_size // 2)
    with pytest.raises(UserError, match="damaged.*delete that folder"):
        open_packed(packed.path)


def test_meta_records_settings(source, tmp_path):
    packed = prepare(source, TokenizerConfig(kind="byte"), 0.1, tmp_path / "c")
    meta = json.loads((packed.path / "meta.json").read_text())
    assert meta["tokenizer"]["kind"] == "byte" and meta["source"]["kind"] == "files" and meta["vocab_size"] == 257


def test_large_vocabularies_pack_as_uint32():
    assert packing.token_dtype(65536) == "uint16" and packing.token_dtype(65537) == "uint32"


def test_preparing_says_what_it_does_and_where_it_caches(source, tmp_path, caplog):
    """The first run's long silent minute (tokenizer training, packing) says what it is doing; a rerun says it
    reuses the cache."""
    with caplog.at_level(logging.INFO, logger="mtp.data.packing"):
        packed = prepare(source, TokenizerConfig(kind="bpe", vocab_size=300), 0.2, tmp_path)
    said = "\n".join(r.getMessage() for r in caplog.records)
    documents = packed.meta["documents"]
    assert f"training a BPE tokenizer of 300 tokens on {documents['train']} training documents" in said
    assert f"packed train: {documents['train']} documents into {packed.meta['tokens']['train']} tokens" in said
    assert f"data cached at {packed.path}" in said
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="mtp.data.packing"):
        prepare(source, TokenizerConfig(kind="bpe", vocab_size=300), 0.2, tmp_path)
    assert [r.getMessage() for r in caplog.records] == [f"data: reusing {packed.path}"]
