"""Decode from a checkpoint written by scripts/pretrain.py, autoregressively or self-speculatively (python
scripts/decode.py, or mtp-decode once installed: the same arguments).

    python scripts/decode.py CKPT --self-speculative --prompt "def parse("
    python scripts/decode.py CKPT --self-speculative --compare --prompt-file prompt.py
    python scripts/decode.py CKPT --self-speculative --tree auto --prompt "def f("
    python scripts/decode.py CKPT --self-speculative --tree tree.json --temperature 0.8 --top-p 0.95 --prompt "x"
    python scripts/decode.py CKPT --draft DRAFT.ckpt --gamma 4 --prompt "def f("   # a draft model, same tokenizer
    python scripts/decode.py CKPT --skip-layers auto --prompt "def f("            # layer-skip self-speculation
    python scripts/decode.py CKPT --prompt-lookup 3 --gamma 8 --prompt-file code.py  # prompt lookup
    echo "import os" | python scripts/decode.py CKPT --temperature 0.8 --top-p 0.95

Prints the completion on stdout, then one line of key=value statistics
(tokens, forwards, tokens/forward, accept per draft position, wall_s, tokens/s, ms/forward: the mean time of
a decoding step after the prompt's, prefill_ms: the prompt's step, method: who drafted, and its parameters).

--draft, --skip-layers and --prompt-lookup replace the heads' drafts (they cannot be combined with
--self-speculative): each step verifies up to --gamma drafts from a draft model, from this model with some blocks
skipped, or from the continuation of an earlier match of the last tokens.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from mtp.checkpoint_load import load_checkpoint
from mtp.cli import add_device_flag, add_dtype_flag, check_heads, generation_config, pick_device, run_script
from mtp.commands.drafter_setup import check_drafting_flags, drafting, pick_drafter
from mtp.data.tokenizer import eot_id, prompt_ids
from mtp.decode import GenerationConfig, generate
from mtp.decode.settings import ACCEPTANCE_RULES
from mtp.decode.tree import read_tree
from mtp.decode.tree_fit import fitted_tree
from mtp.errors import UserError

AUTOREGRESSIVE = {"heads": 1, "tree": None, "draft_p_min": 0.0, "adaptive_drafts": False, "gamma": 0}
"""Settings that turn a decoding configuration into the autoregressive baseline of --compare."""
TREE_NODES = 16
"""Nodes of a tree fitted with --tree auto."""
FIT_PROMPTS, FIT_PROMPT_TOKENS, FIT_NEW_TOKENS = 8, 64, 64
"""--tree auto fits on this many held-out prompts, of this many tokens, continued by this many."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="a .ckpt (file or sharded folder) written by scripts/pretrain.py")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--prompt", help="the prompt text (default: read --prompt-file or standard input)")
    source.add_argument("--prompt-file", type=Path, help="a file whose text is the prompt")
    parser.add_argument(
        "--self-speculative", action="store_true", help="draft with the extra heads, verify with head 1"
    )
    parser.add_argument("--heads", type=int, default=None, help="heads to use (default: all with --self-speculative)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    parser.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0: all)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1] (1: off)")
    parser.add_argument("--batch-size", type=int, default=1, help="decode the prompt in this many rows at once")
    parser.add_argument("--seed", type=int, default=0, help="row b samples with seed + b")
    add_device_flag(parser)
    add_dtype_flag(parser)
    parser.add_argument(
        "--tree",
        help="verify a tree of candidates per step: a JSON file from scripts/fit_tree.py, or 'auto' to fit one now "
        "on the checkpoint's held-out data with these decoding settings",
    )
    parser.add_argument("--tree-nodes", type=int, default=TREE_NODES, help="nodes of a tree fitted by --tree auto")
    parser.add_argument(
        "--acceptance",
        choices=ACCEPTANCE_RULES,
        default="exact",
        help="exact (default): greedy-exact, lossless sampling; typical: Medusa's typical acceptance (lossy, sampling)",
    )
    parser.add_argument("--typical-epsilon", type=float, default=0.09, help="typical acceptance's probability cap")
    parser.add_argument("--typical-delta", type=float, default=0.3, help="typical acceptance's entropy factor")
    parser.add_argument(
        "--draft-p-min",
        type=float,
        default=0.0,
        help="stop drafting after a draft whose head's top probability is below",
    )
    parser.add_argument(
        "--adaptive-drafts",
        action="store_true",
        help="chains and drafters: a row drafts 2 more after a step that accepted all its drafts, 1 less otherwise",
    )
    drafter = parser.add_mutually_exclusive_group()
    drafter.add_argument(
        "--draft", type=Path, help="draft with this checkpoint (same tokenizer; e.g. a tiny mtp1), verify with CKPT"
    )
    drafter.add_argument(
        "--skip-layers",
        help="draft with this model minus these blocks of head 1's path (0-based, e.g. 2,4,5; the last is head 1's "
        "own block), or auto: the set that decodes held-out prompts fastest",
    )
    drafter.add_argument(
        "--prompt-lookup",
        type=int,
        metavar="N",
        help="draft what followed the latest earlier occurrence of the last N (down to 1) tokens",
    )
    parser.add_argument("--gamma", type=int, default=4, help="drafts per step of --draft/--skip-layers/--prompt-lookup")
    parser.add_argument("--compare", action="store_true", help="also decode autoregressively and report the speed-up")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the decoding step; a short warm-up decode compiles it before the timed one",
    )
    return parser


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return args.prompt
    if args.prompt_file is not None:
        if not args.prompt_file.is_file():
            raise UserError(f"prompt file {args.prompt_file} does not exist; pass an existing file to --prompt-file.")
        return args.prompt_file.read_text(encoding="utf-8", errors="replace")
    if sys.stdin.isatty():
        raise UserError("no prompt: pass --prompt TEXT, --prompt-file FILE, or pipe the prompt into standard input.")
    return sys.stdin.read()


def check_flags(args: argparse.Namespace) -> None:
    """The flags that are not decoding settings (those are GenerationConfig's to check), before anything is loaded."""
    if args.batch_size < 1:
        raise UserError(f"--batch-size {args.batch_size} must be at least 1.")
    if args.tree_nodes < 1:
        raise UserError(f"--tree-nodes {args.tree_nodes} must be at least 1.")
    if (
        args.tree is not None and args.adaptive_drafts
    ):  # before --tree auto fits a tree; GenerationConfig refuses it too
        raise UserError("--adaptive-drafts sizes chains; cut a --tree with --draft-p-min instead.")
    check_drafting_flags(args)


def flag_settings(args: argparse.Namespace) -> GenerationConfig:
    """The decoding settings of the flags, checked before the checkpoint is loaded; heads and eos_id are set once
    it is (--self-speculative without --heads drafts with all its heads)."""
    return generation_config(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        heads=args.heads if args.heads is not None else 1,
        seed=args.seed,
        compile=args.compile,
        acceptance=args.acceptance,
        typical_epsilon=args.typical_epsilon,
        typical_delta=args.typical_delta,
        draft_p_min=args.draft_p_min,
        adaptive_drafts=args.adaptive_drafts,
        gamma=args.gamma if drafting(args) else 0,
    )


def pick_tree(args: argparse.Namespace, loaded, config: GenerationConfig):
    """The tree of --tree: read from its file, or fitted now (auto) on held-out prompts with the decoding settings."""
    if args.tree != "auto":
        return read_tree(Path(args.tree), config.heads - 1, loaded.config.vocab_size)
    settings = {**config.__dict__, "max_new_tokens": FIT_NEW_TOKENS}
    fitted = fitted_tree(loaded, GenerationConfig(**settings), args.tree_nodes, FIT_PROMPTS, FIT_PROMPT_TOKENS)
    print(
        f"note: fitted a {fitted.tree.size}-node tree on {FIT_PROMPTS} held-out prompts "
        f"(expected tokens/step there: {1 + fitted.expected_accepted:.2f})",
        file=sys.stderr,
    )
    return fitted.tree


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_flags(args)
    flags = flag_settings(args)
    device = pick_device(args.device)
    loaded = load_checkpoint(args.checkpoint, device, args.dtype)
    model, tokenizer, n_future = loaded.model, loaded.tokenizer, loaded.config.n_future

    heads = args.heads if args.heads is not None else (n_future if args.self_speculative else 1)
    check_heads(heads, loaded.config)
    if heads > 1 and not args.self_speculative:
        raise UserError(f"--heads {heads} drafts with extra heads; add --self-speculative (or use --heads 1).")

    text = read_prompt(args)
    if not text:
        raise UserError("the prompt is empty; give at least one character.")
    prompt = prompt_ids(tokenizer, text)  # as documents start in training
    config = generation_config(**{**flags.__dict__, "heads": heads, "eos_id": eot_id(tokenizer)})
    gamma = config.gamma
    context = loaded.config.max_seq_len
    if len(prompt) + args.max_new_tokens + 2 * (max(gamma, heads - 1) + 1) > context:  # generate()'s room for drafts
        raise UserError(
            f"the prompt ({len(prompt)} tokens) plus --max-new-tokens {args.max_new_tokens} does not fit the model's "
            f"context of {context} tokens; shorten the prompt or lower --max-new-tokens."
        )
    drafter = pick_drafter(args, loaded, config, device)
    needed = len(prompt) + args.max_new_tokens + 2 * (gamma + 1)  # what generate() asks of the drafter's cache
    if drafter is not None and drafter.context is not None and needed > drafter.context:
        raise UserError(
            f"the draft model's context of {drafter.context} tokens cannot hold the prompt ({len(prompt)} tokens) "
            f"plus --max-new-tokens {args.max_new_tokens}; shorten the prompt or lower --max-new-tokens."
        )
    if args.tree is not None:
        if heads == 1:
            raise UserError("--tree drafts with extra heads; add --self-speculative.")
        config = generation_config(**{**config.__dict__, "tree": pick_tree(args, loaded, config)})
    if args.compile:  # compile outside the timed decode: the prompt's step and a drafting step
        warm_up = GenerationConfig(**{**config.__dict__, "max_new_tokens": min(2, args.max_new_tokens)})
        generate(model, [prompt] * args.batch_size, warm_up, drafter)
    outputs, stats = generate(model, [prompt] * args.batch_size, config, drafter)
    for row, output in enumerate(outputs):
        if args.batch_size > 1:
            print(f"--- row {row} ---")
        print(text + tokenizer.decode(output))
    shown = f"head_type={loaded.config.head_type} heads={heads} batch={args.batch_size} device={device.type}"
    print(f"{stats.line()} {shown}")
    if args.compare:
        baseline_config = GenerationConfig(**{**config.__dict__, **AUTOREGRESSIVE})
        if args.compile:
            generate(model, [prompt] * args.batch_size, GenerationConfig(**{**warm_up.__dict__, **AUTOREGRESSIVE}))
        baseline, baseline_stats = generate(model, [prompt] * args.batch_size, baseline_config)
        same = baseline == outputs
        speedup = baseline_stats.wall_time_s / stats.wall_time_s if stats.wall_time_s else float("nan")
        print(
            f"compare: autoregressive {baseline_stats.line()} speedup={speedup:.2f}x "
            f"outputs_match={'yes' if same else 'no'}"
        )
        if config.greedy and not same:
            print("error: greedy self-speculative output differs from autoregressive output", file=sys.stderr)
            return 1
    return 0


def entry_point() -> NoReturn:
    """mtp-decode and scripts/decode.py."""
    run_script(main)


if __name__ == "__main__":
    entry_point()
