"""Tokenizers, all as Hugging Face ``tokenizers.Tokenizer`` objects so that one JSON string saves any of them.

- ``byte``: ids 0..255 are the raw UTF-8 bytes, 256 is the end-of-text token.
- ``bpe``: byte-level BPE trained on the training split, vocabulary size from the config.
- ``pretrained``: any ``tokenizer.json`` file, or the tokenizer of an mtp checkpoint (a ``.ckpt`` file or sharded
  folder): a draft model trained this way shares its target's tokens.
- ``induction``: the fixed vocabulary of the induction task's stories (:mod:`mtp.data.induction`), each name two tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from mtp.errors import UserError

EOT = "<|endoftext|>"
END_TOKENS = (EOT, "</s>", "<|end_of_text|>", "<eos>")
"""End-of-text tokens, in the order looked for: mtp's (and GPT-2's), then Llama 2's, Llama 3's and Gemma's, so that
an imported model's tokenizer ends documents with its own token."""
TOKENIZER_KINDS = ("byte", "bpe", "pretrained", "induction")
UNK = "[UNK]"


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from each byte to a printable character (what the ByteLevel pre-tokenizer emits)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))


def byte_tokenizer() -> Tokenizer:
    """Byte ids 0..255 in byte order, then the end-of-text token at 256."""
    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([EOT])
    return tokenizer


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE with ``vocab_size`` entries (end-of-text included), trained on ``texts``."""
    if vocab_size < 257:
        raise UserError(f"a BPE vocabulary of {vocab_size} cannot hold the 256 bytes plus {EOT}; use at least 257.")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def fixed_vocabulary_tokenizer(words: Iterable[str], suffixes: Iterable[str]) -> Tokenizer:
    """A tokenizer of a fixed vocabulary (WordPiece): whitespace and punctuation cut the text into words, each a token
    if it is among ``words``, else cut longest-first into a word and ``suffixes`` (tokens ``##suffix``); what cannot be
    cut so is the unknown token. Ids: the unknown token, ``words``, the suffixes, end-of-text."""
    tokens = [UNK, *words, *(f"##{suffix}" for suffix in suffixes)]
    assert len(set(tokens)) == len(tokens), "a fixed vocabulary lists each token once"
    tokenizer = Tokenizer(models.WordPiece({token: i for i, token in enumerate(tokens)}, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.add_special_tokens([EOT])
    return tokenizer


def pretrained_json(path: str | Path) -> str:
    """The JSON of a tokenizer.json file. A model's path (a checkpoint, a Hugging Face or Meta directory, a GGUF file)
    is turned into its tokenizer's file where the run is assembled (:func:`mtp.training.train.build`), not here."""
    path = Path(path)
    if not path.is_file():
        raise UserError(
            f"tokenizer file {path} does not exist; set data.tokenizer.path to a tokenizer.json or a model checkpoint."
        )
    return path.read_text(encoding="utf-8", errors="replace")


def load_pretrained(path: str | Path) -> Tokenizer:
    try:
        tokenizer = Tokenizer.from_str(pretrained_json(path))
    except UserError:
        raise
    except Exception as err:  # tokenizers raises a bare Exception on malformed JSON
        raise UserError(f"{path} is not a valid tokenizer.json ({err}); point data.tokenizer.path at one.") from err
    if end_token(tokenizer) is None:
        tokenizer.add_special_tokens([EOT])
    return tokenizer


def build_tokenizer(
    kind: str, texts: Iterator[str] | None = None, vocab_size: int = 0, path: str | None = None
) -> Tokenizer:
    """The tokenizer of ``kind`` (``induction``'s is built by :func:`mtp.data.induction.induction_tokenizer`, which
    uses this module)."""
    assert kind != "induction", "mtp.data.packing builds the induction tokenizer from mtp.data.induction"
    if kind == "byte":
        return byte_tokenizer()
    if kind == "bpe":
        assert texts is not None
        return train_bpe(texts, vocab_size)
    if kind == "pretrained":
        if not path:
            raise UserError(
                "data.tokenizer.kind=pretrained needs data.tokenizer.path=/path/to/tokenizer.json (or an mtp .ckpt)."
            )
        return load_pretrained(path)
    raise UserError(f"data.tokenizer.kind={kind!r} is not one of {', '.join(TOKENIZER_KINDS)}.")


def end_token(tokenizer: Tokenizer) -> str | None:
    """The first of :data:`END_TOKENS` in the tokenizer's vocabulary."""
    return next((token for token in END_TOKENS if tokenizer.token_to_id(token) is not None), None)


def eot_id(tokenizer: Tokenizer) -> int:
    """The id that ends every document (and starts a prompt, as documents start after it in training)."""
    token = end_token(tokenizer)
    assert token is not None, "every mtp tokenizer carries an end-of-text token"
    return tokenizer.token_to_id(token)


def prompt_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """A prompt's ids, starting as documents start in training (packing encodes each with the tokenizer's own
    special tokens and ends it with end-of-text): with the tokenizer's start token where it adds one (Llama's BOS),
    else after end-of-text (mtp's tokenizers add none)."""
    ids = tokenizer.encode(text).ids
    if len(ids) > len(tokenizer.encode(text, add_special_tokens=False).ids):
        return ids
    return [eot_id(tokenizer)] + ids
