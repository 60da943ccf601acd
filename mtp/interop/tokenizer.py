"""The tokenizer of a foreign directory as a ``tokenizers`` JSON: ``tokenizer.json`` as it is, or a sentencepiece
``tokenizer.model`` (Meta's releases) converted by transformers' own Llama converter."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, normalizers, processors

from mtp.errors import UserError

BOS = "<s>"
SPACE = "\u2581"  # sentencepiece's visible space


def directory_tokenizer(path: Path) -> str:
    if (path / "tokenizer.json").is_file():
        text = (path / "tokenizer.json").read_text(encoding="utf-8")
        try:
            Tokenizer.from_str(text)
        except Exception as err:  # tokenizers raises a bare Exception on malformed JSON
            raise UserError(f"{path / 'tokenizer.json'} is not a valid tokenizer.json ({err}).") from err
        return text
    if (path / "tokenizer.model").is_file():
        return converted_sentencepiece(path).to_str()
    raise UserError(f"{path} has no tokenizer.json or tokenizer.model; add the model's tokenizer to the directory.")


def converted_sentencepiece(path: Path) -> Tokenizer:
    """``path/tokenizer.model`` as a ``tokenizers`` tokenizer that starts every text with BOS, as Llama's does."""
    try:
        import google.protobuf  # noqa: F401  (transformers' converter needs both; fail here with the fix)
        import sentencepiece  # noqa: F401
        from transformers import LlamaTokenizerFast
    except ImportError as err:
        raise UserError(
            f"converting {path / 'tokenizer.model'} (sentencepiece) needs transformers, sentencepiece and protobuf; "
            "install them with pip install -e '.[hf]'."
        ) from err
    try:
        tokenizer = LlamaTokenizerFast.from_pretrained(str(path)).backend_tokenizer
    except Exception as err:  # sentencepiece and the converter raise many types for a damaged model
        raise UserError(f"{path / 'tokenizer.model'} could not be converted ({str(err).splitlines()[0]}).") from err
    if tokenizer.get_vocab_size() <= 3:
        raise UserError(f"{path / 'tokenizer.model'} converted to an empty vocabulary; is it a sentencepiece model?")
    # sentencepiece prefixes every text with one space and keeps every space: converters that use Metaspace's
    # "first" scheme drop that prefix when the text starts with a space (indented code loses one); this does not
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)])
    tokenizer.pre_tokenizer = None
    bos = tokenizer.token_to_id(BOS)
    if bos is not None and tokenizer.encode("a").ids[:1] != [bos]:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos)]
        )
    return tokenizer
