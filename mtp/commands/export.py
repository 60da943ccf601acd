"""Export an mtp checkpoint as a Hugging Face Llama directory (safetensors) that transformers loads with no mtp code,
or its draft heads as the draft a serving engine loads beside that model.

    python scripts/export.py CKPT OUT_DIR --format hf            # head 1's path + the other heads beside it
    python scripts/export.py CKPT DRAFT_DIR --format eagle3      # eagle3 heads: vLLM, SGLang, llama.cpp's converter
    python scripts/export.py CKPT DRAFT_DIR --format medusa      # medusa heads: vLLM
    python scripts/export.py CKPT OUT_DIR --format mimo          # causal heads: one folder vLLM drafts from itself
    python scripts/export.py CKPT OUT_DIR --format hf --head 2   # head 2's path as its own Llama (analysis)
    python scripts/export.py CKPT OUT_DIR --format hf --max-shard-size 2GB --dtype bfloat16
    python scripts/export.py CKPT OUT_DIR --format hf --verify   # then compare transformers' outputs with mtp's

OUT_DIR gets config.json, generation_config.json, model.safetensors (sharded with an index above
--max-shard-size), tokenizer.json and tokenizer_config.json: AutoModelForCausalLM / AutoTokenizer.from_pretrained
(OUT_DIR) read it. With head 1 it also gets mtp_heads.safetensors and mtp_config.json, so that init_from=OUT_DIR
and scripts/decode.py OUT_DIR read back the whole MTP model. CKPT may also be a Hugging Face or Meta directory.

--format eagle3 / medusa write DRAFT_DIR with config.json and model.safetensors under the engine's names
(mtp/interop/engines.py): the draft alone, which the engine runs beside the target model (the --format hf export of
the same checkpoint, or the model the heads were trained on). eagle3 carries eagle3 heads, medusa medusa heads; other
head types are refused in one sentence.

--format mimo writes OUT_DIR as a MiMoForCausalLM folder (mtp/interop/mimo.py): the trunk as a Qwen2 model, depth 2 of
the causal heads as its MTP layer, the tokenizer; vLLM serves it with speculative_config={"method": "mtp"}, and
init_from=OUT_DIR reads it back. An OUT_DIR that exists and is not empty is replaced only with --force; nothing is left
half-written.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import NoReturn

from mtp.commands.cli import run_script, settings_named_by_flags
from mtp.errors import UserError
from mtp.pretrained.export import DRAFT_LAYOUTS, EXPORT_DTYPES, export_draft, export_hf, export_mimo, verify_export


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="a .ckpt (file or sharded folder) written by scripts/pretrain.py")
    parser.add_argument("out_dir", type=Path, help="the directory to write (new, empty, or replaced with --force)")
    parser.add_argument(
        "--format",
        choices=["hf", *DRAFT_LAYOUTS, "mimo"],
        default="hf",
        help="hf: a Hugging Face LlamaForCausalLM directory; eagle3, medusa: the draft heads as engines load them; "
        "mimo: the model and its causal depth 2 as a MiMoForCausalLM folder (vLLM's method mtp)",
    )
    parser.add_argument("--head", type=int, default=1, help="which head's path becomes the Llama (default 1)")
    parser.add_argument("--force", action="store_true", help="replace a non-empty OUT_DIR")
    parser.add_argument("--max-shard-size", default="5GB", help="largest model-*.safetensors file (default 5GB)")
    parser.add_argument("--dtype", choices=list(EXPORT_DTYPES), default="float32", help="weights' dtype in the files")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="then read the export back with mtp and transformers: tensors, head-1 logits and greedy generate "
        "compared on 8 held-out prompts",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    if args.format != "hf" and (args.verify or args.head != 1):
        raise UserError(f"--format {args.format} writes its own layout; --head and --verify apply to --format hf.")
    with settings_named_by_flags():  # the library names its settings (format, dtype, force); the user typed flags
        if args.format == "hf":
            exported = export_hf(args.checkpoint, args.out_dir, args.head, args.force, args.max_shard_size, args.dtype)
        elif args.format == "mimo":
            exported = export_mimo(args.checkpoint, args.out_dir, args.force, args.max_shard_size, args.dtype)
        else:
            exported = export_draft(args.checkpoint, args.out_dir, args.format, args.force, args.dtype)
    total = sum(exported.files.values())
    for name, size in exported.files.items():
        print(f"{size / 1e6:10.2f} MB  {name}")
    print(f"wrote {exported.directory} ({total / 1e6:.2f} MB) in {time.perf_counter() - start:.1f} s")
    if exported.note:
        print(exported.note, file=sys.stderr)
    if args.verify:
        print(verify_export(args.checkpoint, exported.directory).line())
    return 0


def entry_point() -> NoReturn:
    """mtp-export and scripts/export.py."""
    run_script(main)


if __name__ == "__main__":
    entry_point()
