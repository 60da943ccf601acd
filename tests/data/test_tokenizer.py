import pytest

from mtp.data.tokenizer import EOT, byte_tokenizer, eot_id, load_pretrained, train_bpe
from mtp.errors import UserError

TEXT = "def parse(x):\n    return x  # café ✓\n"


def test_byte_tokenizer_ids_are_the_utf8_bytes():
    tokenizer = byte_tokenizer()
    assert tokenizer.encode(TEXT).ids == list(TEXT.encode())
    assert tokenizer.decode(list(TEXT.encode())) == TEXT
    assert tokenizer.get_vocab_size() == 257 and eot_id(tokenizer) == 256


def test_byte_decoding_of_invalid_utf8_gives_replacement_characters():
    assert byte_tokenizer().decode([0xFF, ord("a")]) == "\ufffda"


def test_bpe_round_trip_and_size(corpus_dir):
    texts = [p.read_text() for p in sorted(corpus_dir.glob("*.txt"))]
    tokenizer = train_bpe(texts, vocab_size=400)
    assert tokenizer.get_vocab_size() == 400
    assert tokenizer.decode(tokenizer.encode(TEXT).ids) == TEXT
    assert len(tokenizer.encode(texts[0]).ids) < len(texts[0].encode()) / 1.5  # merges compress code


def test_bpe_vocabulary_below_bytes_is_refused():
    with pytest.raises(UserError, match="at least 257"):
        train_bpe(["abc"], vocab_size=100)


def test_pretrained_loads_a_tokenizer_json(tmp_path):
    path = tmp_path / "tokenizer.json"
    train_bpe([TEXT * 10], vocab_size=300).save(str(path))
    tokenizer = load_pretrained(path)
    assert tokenizer.token_to_id(EOT) is not None
    assert tokenizer.decode(tokenizer.encode(TEXT).ids) == TEXT


def test_pretrained_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_pretrained(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="not a valid tokenizer.json"):
        load_pretrained(bad)


def test_a_model_path_becomes_its_tokenizer_where_the_run_is_built(tiny_checkpoints, tmp_path):
    """A draft model for a target trains on the target's own tokens: data.tokenizer.path=TARGET.ckpt. The data layer
    reads tokenizer files only; the run's assembly (mtp.training.train.data_tokenizer) turns a model's path into its
    tokenizer's file."""
    from omegaconf import OmegaConf

    from mtp.checkpoint.load import load_checkpoint
    from mtp.data.packing import TokenizerConfig
    from mtp.training.train import data_tokenizer

    def resolved(path):
        tokenizer = {"kind": "pretrained", "path": str(path)}
        cfg = OmegaConf.create({"data": {"cache_dir": str(tmp_path / "cache"), "tokenizer": tokenizer}})
        return TokenizerConfig(**data_tokenizer(cfg, None))

    target = tiny_checkpoints["mtp4"]
    expected = load_checkpoint(target).tokenizer.to_str()
    assert load_pretrained(resolved(target).path).to_str() == expected
    as_file = tmp_path / "tokenizer.json"
    as_file.write_text(expected)
    assert resolved(as_file).path == str(as_file)  # a tokenizer file stays as it is
    # the data cache is keyed by the tokenizer itself, wherever it was read from
    assert resolved(target).identity() == resolved(as_file).identity()
    assert resolved(tiny_checkpoints["byte8"]).identity() != resolved(target).identity()
    with pytest.raises(UserError, match="truncated or not a PyTorch checkpoint"):
        (tmp_path / "cut.ckpt").write_bytes(b"\x00" * 16)
        resolved(tmp_path / "cut.ckpt")
    with pytest.raises(UserError, match="not a valid tokenizer.json"):  # the data layer opens no checkpoint
        load_pretrained(target)
