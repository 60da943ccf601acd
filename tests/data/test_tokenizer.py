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
