"""The tokenizer of a foreign model as a ``tokenizers`` JSON: a directory's ``tokenizer.json`` as it is, a sentencepiece
``tokenizer.model`` (Meta's releases) converted by transformers' own Llama converter, or the tokenizer a GGUF file's
metadata describes, rebuilt with ``tokenizers`` (no transformers needed)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from mtp.errors import UserError, first_line

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
        raise UserError(f"{path / 'tokenizer.model'} could not be converted ({first_line(err)}).") from err
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


# ---------------------------------------------------------------------------------------------------- GGUF

GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_NAMES = ("llama-bpe", "llama3", "llama-v3")
GGUF_PRE_TOKENIZERS = {
    # tokenizer.ggml.pre -> the splits llama.cpp applies in turn before byte-level BPE (llama-vocab.cpp)
    "gpt2": [GPT2_SPLIT],
    "gpt-2": [GPT2_SPLIT],
    "smollm": [r"\p{N}", GPT2_SPLIT],
    "starcoder": [r"\p{N}", GPT2_SPLIT],
    "refact": [r"\p{N}", GPT2_SPLIT],
    "codeshell": [r"\p{N}", GPT2_SPLIT],
    **{name: [LLAMA3_SPLIT] for name in LLAMA3_NAMES},
    "qwen2": [QWEN2_SPLIT],
}
UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4  # llama.cpp's token types


def gguf_tokenizer(meta: dict, path: Path) -> str:
    """The tokenizer a GGUF file's metadata describes, as a ``tokenizers`` JSON with llama.cpp's ids: byte-level BPE
    (``tokenizer.ggml.model`` gpt2, split as its ``tokenizer.ggml.pre`` says) or sentencepiece BPE (llama: merges
    from the scores, byte fallback); control and unknown tokens are special, user-defined ones added whole; BOS starts
    every text where ``tokenizer.ggml.add_bos_token`` says so (by default for sentencepiece and Llama 3's splits)."""
    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise UserError(f"{path} carries no tokenizer (no tokenizer.ggml.tokens); convert it with its tokenizer.")
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if kind == "gpt2":
        tokenizer = _byte_level_bpe(meta, tokens, path)
        # llama.cpp starts texts with BOS for Llama 3's splits unless the file says otherwise
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", meta.get("tokenizer.ggml.pre") in LLAMA3_NAMES))
    elif kind == "llama":
        tokenizer = _sentencepiece_bpe(meta, tokens)
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", True))
    else:
        raise UserError(
            f"{path} has a {kind} tokenizer; mtp reads GGUF tokenizers of the gpt2 (byte-level BPE) and llama "
            "(sentencepiece) kinds."
        )
    typed = list(zip(tokens, types, strict=True))
    # llama.cpp matches control and unknown tokens whole in the text (when it parses special tokens, as mtp does)
    special = [AddedToken(t, special=True, normalized=False) for t, k in typed if k in (CONTROL, UNKNOWN)]
    tokenizer.add_special_tokens(special)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t, k in typed if k == USER_DEFINED])
    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    if add_bos and bos_id is not None:
        bos = tokens[bos_id]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    if tokenizer.get_vocab_size() != len(tokens):
        raise UserError(f"{path}: its tokenizer does not rebuild to {len(tokens)} distinct tokens; is it damaged?")
    return tokenizer.to_str()


def _byte_level_bpe(meta: dict, tokens: list[str], path: Path) -> Tokenizer:
    pre = meta.get("tokenizer.ggml.pre", "gpt2")
    if pre not in GGUF_PRE_TOKENIZERS:
        raise UserError(
            f"{path} splits text as tokenizer.ggml.pre={pre!r}, which mtp does not know (it knows "
            f"{', '.join(sorted(GGUF_PRE_TOKENIZERS))}); import the model's Hugging Face directory instead."
        )
    merges = [tuple(merge.split(" ", 1)) for merge in meta.get("tokenizer.ggml.merges", [])]
    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=pre in LLAMA3_NAMES))
    splits = [pre_tokenizers.Split(Regex(pattern), behavior="isolated") for pattern in GGUF_PRE_TOKENIZERS[pre]]
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _sentencepiece_bpe(meta: dict, tokens: list[str]) -> Tokenizer:
    """Sentencepiece's BPE as Hugging Face's Llama tokenizer computes it: merges ranked by the merged piece's
    score, unknown bytes as <0xNN> tokens, a space before the text and every space as the visible space."""
    scores = meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    vocab = {token: i for i, token in enumerate(tokens)}
    merges = []
    for token, score in zip(tokens, scores, strict=True):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                merges.append((score, vocab[left], vocab[right], left, right))
    merges.sort(key=lambda m: (-m[0], m[1], m[2]))
    unk_id = meta.get("tokenizer.ggml.unknown_token_id", 0)
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=[(left, right) for *_, left, right in merges],
            unk_token=tokens[unk_id],
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    prefix = [normalizers.Prepend(SPACE)] if meta.get("tokenizer.ggml.add_space_prefix", True) else []
    tokenizer.normalizer = normalizers.Sequence([*prefix, normalizers.Replace(" ", SPACE)])
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return tokenizer
