"""Exporting an mtp model as a Hugging Face Llama directory, and checking an export against the model it came from
(the directory's layout: :mod:`mtp.interop.hf`, which reads it back); and its draft heads in the layouts serving
engines load beside the target model (:func:`export_draft`: EAGLE-3 for vLLM, SGLang and llama.cpp, Medusa for vLLM;
the layouts: :mod:`mtp.interop.engines`).

Above the loader (:mod:`mtp.checkpoint.load`): it reads any checkpoint mtp reads, and decodes to compare. Every
export is written into a temporary directory beside its destination and renamed into place at the end, so a failure
leaves nothing half-written.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from mtp.checkpoint.load import load_checkpoint, model_chat
from mtp.data.prompts import held_out_prompts
from mtp.data.tokenizer import eot_id
from mtp.decode import GenerationConfig, Plan, generate
from mtp.errors import SettingError, UserError, literal
from mtp.interop.engines import check_carries, eagle3_layout, medusa_layout
from mtp.interop.hf import INSTALL_HINT, MTP_CONFIG, MTP_FORMAT, MTP_HEADS, read_hf
from mtp.interop.llama import head_path_names, llama_config
from mtp.interop.mimo import mimo_layout
from mtp.model.config import ModelConfig

EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class Exported:
    directory: Path
    files: dict[str, int]
    """Every file written and its size in bytes."""
    note: str = ""
    """What a user of the export should know (said once by the command); empty when nothing."""


def export_hf(
    checkpoint: str | os.PathLike,
    out_dir: str | os.PathLike,
    head: int = 1,
    force: bool = False,
    max_shard_size: str = "5GB",
    dtype: str = "float32",
) -> Exported:
    """Write ``checkpoint``'s head path as a Hugging Face Llama directory (see the module docstring).

    Everything is written into a temporary directory beside ``out_dir`` and renamed into place at the end, so
    a failure leaves nothing half-written; an existing non-empty ``out_dir`` is replaced only with ``force``.
    """
    out_dir = Path(out_dir)
    cast, shard_bytes, (safetensors_torch, transformers), loaded = _start_export(
        checkpoint, out_dir, force, dtype, max_shard_size, "exporting to Hugging Face"
    )
    config, model = loaded.config, loaded.model
    names = head_path_names(config, head)  # refuses heads that are not a Llama
    weights = model.state_dict()
    path_tensors = {hf: weights[ours].to(cast).contiguous() for hf, ours in names.items()}

    def write(partial: Path) -> None:
        _write_weights(partial, path_tensors, shard_bytes, safetensors_torch)
        eot = _write_tokenizer(partial, loaded.tokenizer, config, transformers, model_chat(checkpoint).template)
        hf_config = transformers.LlamaConfig(
            **llama_config(config), bos_token_id=eot, eos_token_id=eot, architectures=["LlamaForCausalLM"]
        )
        hf_config.dtype = dtype  # what from_pretrained loads the weights as, unless told otherwise
        hf_config.save_pretrained(partial)
        # no pad_token_id: prompts start with end-of-text, and generate() would mask a pad id it finds in them
        transformers.GenerationConfig(bos_token_id=eot, eos_token_id=eot).save_pretrained(partial)
        if head == 1:
            on_path = set(names.values())
            rest = {name: t.to(cast).contiguous() for name, t in weights.items() if name not in on_path}
            if rest:
                safetensors_torch.save_file(rest, partial / MTP_HEADS, metadata={"format": "pt"})
            meta = {
                "format": MTP_FORMAT,
                "model_config": config.to_dict(),
                "head_path": 1,
                "heads_file": MTP_HEADS if rest else None,
                "note": "model.safetensors holds head 1's path under Llama names; mtp_heads.safetensors every "
                "other tensor under mtp's names (mtp.model.MTPModel). Read back with mtp's init_from= or decode.py.",
            }
            (partial / MTP_CONFIG).write_text(json.dumps(meta, indent=2) + "\n")

    return Exported(out_dir, _write_into_place(out_dir, write))


DRAFT_LAYOUTS = {"eagle3": eagle3_layout, "medusa": medusa_layout}
"""The engines' draft layouts (:mod:`mtp.interop.engines`): each gives a model's heads' tensors and config.json."""


def export_draft(
    checkpoint: str | os.PathLike, out_dir: str | os.PathLike, layout: str, force: bool = False, dtype: str = "float32"
) -> Exported:
    """Write ``checkpoint``'s draft heads in an engine's ``layout`` (eagle3, medusa): config.json and
    model.safetensors, which vLLM, SGLang or llama.cpp's converter read beside the target model (its own export:
    :func:`export_hf`). A head type the layout cannot carry is refused in one sentence naming those it can."""
    out_dir = Path(out_dir)
    check_output_dir(out_dir, force)
    cast = export_dtype(dtype)
    safetensors_torch, _ = _interop_packages(f"exporting to the {layout} layout")
    loaded = load_checkpoint(checkpoint, "cpu", "float32")
    check_carries(loaded.config, layout)
    tensors, settings = DRAFT_LAYOUTS[layout](loaded.model)
    tensors = {
        name: (t.to(cast) if t.is_floating_point() else t).detach().contiguous().clone() for name, t in tensors.items()
    }
    settings = {**settings, "torch_dtype": dtype}

    def write(partial: Path) -> None:
        safetensors_torch.save_file(tensors, partial / "model.safetensors", metadata={"format": "pt"})
        (partial / "config.json").write_text(json.dumps(settings, indent=2) + "\n")

    return Exported(out_dir, _write_into_place(out_dir, write))


MIMO_README = """# {name}: an mtp model in MiMo's layout

Written by mtp's export (`mtp export`, format mimo) from a model with {heads} causal heads. vLLM runs it with
its own MTP layer drafting:

```python
from vllm import LLM
llm = LLM("{name}", speculative_config={{"method": "mtp", "num_speculative_tokens": 1}})
```

- The trunk is a Qwen2 model (`MiMoForCausalLM`, `model_type` qwen2) whose q/k/v biases are zero; head 1 is its
  next-token head.
- `model.mtp_layers.0` is the model's depth 2 (the head that predicts the token after next). {beyond}
- vLLM zeroes the token the MTP layer reads at position 0. {first_token}
- `init_from=` and `scripts/decode.py` read this folder back into mtp as a causal-head model of two heads.
"""


def export_mimo(
    checkpoint: str | os.PathLike,
    out_dir: str | os.PathLike,
    force: bool = False,
    max_shard_size: str = "5GB",
    dtype: str = "float32",
) -> Exported:
    """Write ``checkpoint`` (causal heads) as a MiMo folder (:mod:`mtp.interop.mimo`): config.json, the trunk and
    depth 2 in safetensors, the tokenizer, generation_config.json and a README. A model of another head type, of one
    head or of a reduced draft vocabulary is refused in one sentence; nothing is left half-written."""
    out_dir = Path(out_dir)
    cast, shard_bytes, (safetensors_torch, transformers), loaded = _start_export(
        checkpoint, out_dir, force, dtype, max_shard_size, "exporting to the mimo layout"
    )
    config = loaded.config
    tensors, settings = mimo_layout(loaded.model)  # refuses what the layout cannot carry
    tensors = {name: t.to(cast).detach().contiguous().clone() for name, t in tensors.items()}
    beyond = (
        f"Depths 3..{config.n_future} are not written: vLLM reads one MTP layer and reuses it for further drafts."
        if config.n_future > 2
        else ""
    )
    zero = config.causal_first_token == "zero"
    first_token = (
        "The model was trained so (model.causal_first_token=zero): vLLM's drafts are mtp's."
        if zero
        else "The model was trained reading the token there (model.causal_first_token=keep), so a draft from position "
        "0 may differ from mtp's; the output does not, since the target verifies every draft."
    )
    readme = MIMO_README.format(name=out_dir.name, heads=config.n_future, beyond=beyond, first_token=first_token)

    def write(partial: Path) -> None:
        _write_weights(partial, tensors, shard_bytes, safetensors_torch)
        eot = _write_tokenizer(partial, loaded.tokenizer, config, transformers, model_chat(checkpoint).template)
        hf_config = {**settings, "bos_token_id": eot, "eos_token_id": eot, "torch_dtype": dtype}
        (partial / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
        transformers.GenerationConfig(bos_token_id=eot, eos_token_id=eot).save_pretrained(partial)
        (partial / "README.md").write_text(readme)

    note = "" if zero else (
        "note: the model reads the token at position 0 (model.causal_first_token=keep) where vLLM zeroes it, so "
        "vLLM's drafts from there may differ from mtp's; train with model.causal_first_token=zero for the same drafts."
    )  # fmt: skip
    return Exported(out_dir, _write_into_place(out_dir, write), note)


def _start_export(checkpoint, out_dir: Path, force: bool, dtype: str, max_shard_size: str, task: str):
    """What a Hugging Face folder's export starts from, every setting checked before the checkpoint is read: the
    dtype to write, the shard size in bytes, the interop packages (safetensors.torch, transformers) and the loaded
    checkpoint (float32, on the CPU)."""
    check_output_dir(out_dir, force)
    cast, shard_bytes = export_dtype(dtype), parse_size(max_shard_size)
    packages = _interop_packages(task)
    return cast, shard_bytes, packages, load_checkpoint(checkpoint, "cpu", "float32")


def _write_into_place(out_dir: Path, write) -> dict[str, int]:
    """``write(folder)`` into a temporary folder beside ``out_dir``, renamed to it once whole (every file given the
    usual mode); the files and their sizes. A failure leaves nothing there."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    partial = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        write(partial)
        mode = 0o666 & ~_umask()  # safetensors creates its files private (0600); give every file the usual mode
        for file in partial.iterdir():
            file.chmod(mode)
        files = {p.name: p.stat().st_size for p in sorted(partial.iterdir())}
        _move_into_place(partial, out_dir)
    except OSError as err:
        raise UserError(f"writing {out_dir} failed ({err.strerror or err}); nothing was left there.") from err
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return files


@dataclass
class Verified:
    round_trip_exact: bool
    max_logit_diff: float
    tokens_equal: int
    tokens: int
    rows_equal: int
    rows: int

    def line(self) -> str:
        return (
            f"round_trip_exact={self.round_trip_exact} max_abs_logit_diff={self.max_logit_diff:.3g} "
            f"greedy_tokens_equal={self.tokens_equal}/{self.tokens} greedy_rows_equal={self.rows_equal}/{self.rows}"
        )


VERIFY_TOKENS = 256
"""The length of the held-out rows an export's verification compares logits on (the first 65 prompt its decoding)."""


def verify_export(checkpoint: str | os.PathLike, out_dir: Path, prompts: int = 8, new_tokens: int = 128) -> Verified:
    """Read the export back with mtp (every tensor equal?) and with transformers (head 1's logits and greedy
    ``generate`` against mtp's on held-out prompts of the checkpoint's own data)."""
    _, transformers = _interop_packages("verifying an export")
    original = load_checkpoint(checkpoint, "cpu", "float32")
    ours = original.model.state_dict()
    exact = False
    if (out_dir / MTP_CONFIG).is_file():
        back = read_hf(out_dir).weights
        exact = back.keys() == ours.keys() and all(torch.equal(back[k].float(), ours[k]) for k in ours)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out_dir).float().eval()
    try:
        rows = held_out_prompts(original.data, original.tokenizer, prompts, VERIFY_TOKENS)
    except SettingError:  # no setting of verify's chose the length: the sentence names what the data lacks
        raise UserError(
            f"verifying compares outputs on validation documents of at least {VERIFY_TOKENS} tokens, and the "
            "checkpoint's data has none; the export is written: leave out the verification, or verify a checkpoint "
            "trained on longer documents."
        ) from None
    greedy = GenerationConfig(max_new_tokens=new_tokens, temperature=0.0)
    diff, equal, total, same_rows = 0.0, 0, 0, 0
    with torch.no_grad():
        for row in rows:
            tokens = torch.tensor([row])
            diff = max(diff, (original.model.next_token_logits(tokens) - theirs(tokens).logits).abs().max().item())
            prompt = row[:65]
            expected = generate(original.model, [prompt], Plan(greedy))[0][0]
            got = theirs.generate(torch.tensor([prompt]), max_new_tokens=len(expected), do_sample=False)
            got = got[0, len(prompt) :].tolist()
            equal += sum(a == b for a, b in zip(expected, got, strict=False))  # generate may stop at eos
            total, same_rows = total + len(expected), same_rows + (expected == got)
    return Verified(exact, diff, equal, total, same_rows, len(rows))


def export_dtype(dtype: str) -> torch.dtype:
    """The torch dtype named ``dtype``; a :class:`SettingError` naming ``dtype`` for a name it is not."""
    if dtype not in EXPORT_DTYPES:
        raise SettingError(f"{{dtype}} is not one of {', '.join(EXPORT_DTYPES)}.", dtype=dtype)
    return EXPORT_DTYPES[dtype]


def check_output_dir(out_dir: Path, force: bool) -> None:
    """A directory to export into: a :class:`SettingError` naming ``force`` for one that holds files, unless asked to
    replace them."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir} is a file; give a directory to export into.")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise SettingError(
            f"{literal(out_dir)} exists and is not empty; choose a new directory or pass {{force:name}} to replace it.",
            force=force,
        )


def parse_size(size: str) -> int:
    """Bytes in a size like 5GB, 500MB or 2000000 (a :class:`SettingError` naming ``max_shard_size`` otherwise)."""
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    text = str(size).strip().upper()
    unit = next((u for u in sorted(units, key=len, reverse=True) if text.endswith(u)), "")
    try:
        value = float(text[: len(text) - len(unit)]) * units.get(unit, 1)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise SettingError("{max_shard_size} is not a size like 5GB, 500MB or 2000000 (bytes).", max_shard_size=size)
    return int(value)


def _interop_packages(task: str):
    try:
        import safetensors.torch as safetensors_torch  # optional: the hf extra
        import transformers
    except ImportError as err:
        raise UserError(f"{task} needs transformers and safetensors; {INSTALL_HINT}.") from err
    return safetensors_torch, transformers


def _write_weights(directory: Path, tensors: dict[str, Tensor], shard_bytes: int, safetensors_torch) -> None:
    """``model.safetensors``, or shards of at most ``shard_bytes`` (a larger tensor gets a shard of its own) and
    the index transformers reads."""
    shards: list[dict[str, Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    if len(shards) == 1:
        safetensors_torch.save_file(shards[0], directory / "model.safetensors", metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        safetensors_torch.save_file(shard, directory / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _write_tokenizer(directory: Path, tokenizer, config: ModelConfig, transformers, chat_template: str | None) -> int:
    """tokenizer.json and tokenizer_config.json (end-of-text as eos, bos and pad; the chat template the checkpoint
    carries, if any); returns end-of-text's id."""
    eot = eot_id(tokenizer)
    token = tokenizer.id_to_token(eot)
    wrapped = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=token,
        bos_token=token,
        pad_token=token,
        model_max_length=config.max_seq_len,
        clean_up_tokenization_spaces=False,
    )
    wrapped.save_pretrained(directory)
    (directory / "tokenizer.json").write_text(tokenizer.to_str())  # mtp's own JSON, byte for byte
    settings = json.loads((directory / "tokenizer_config.json").read_text())
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"  # the name every transformers version knows
    if chat_template:
        settings["chat_template"] = chat_template
    (directory / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    return eot


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _move_into_place(partial: Path, out_dir: Path) -> None:
    """Rename ``partial`` to ``out_dir``; an existing ``out_dir`` is moved aside first and removed after."""
    old = None
    if out_dir.exists():
        old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
        os.replace(out_dir, old)
    os.replace(partial, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
