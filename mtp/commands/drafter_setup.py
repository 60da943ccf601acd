"""Turning the scripts' drafting flags into drafters: a draft checkpoint checked against the target, a skip set read
or searched for, prompt lookup (user errors are one sentence each)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import torch

from mtp.checkpoint_load import LoadedCheckpoint, load_checkpoint
from mtp.cli import require_at_least
from mtp.data.prompts import prompts_beyond_the_benchmarks
from mtp.decode import GenerationConfig, generate
from mtp.decode.proposers import (
    LookupDrafter,
    Proposer,
    StagedDrafter,
    draft_model_drafter,
    layer_skip_drafter,
    staged_drafter,
)
from mtp.errors import UserError
from mtp.model import MTPModel

SEARCH_PROMPTS, SEARCH_PROMPT_TOKENS, SEARCH_NEW_TOKENS = 4, 64, 32
"""--skip-layers auto times decoding of this many held-out prompts, of this many tokens, continued by this many."""


def load_draft(path: Path, target: LoadedCheckpoint, device: torch.device, dtype: str) -> LoadedCheckpoint:
    """A draft checkpoint for ``target``: an mtp checkpoint with the same tokenizer and vocabulary."""
    try:
        draft = load_checkpoint(path, device, dtype)
    except UserError as err:
        raise UserError(f"--draft: {err}") from err
    if draft.tokenizer.to_str() != target.tokenizer.to_str():
        raise UserError(
            f"--draft {path} has a different tokenizer from the target's; train the draft on the target's tokenizer "
            "(data/tokenizer=pretrained data.tokenizer.path=TARGET.ckpt)."
        )
    if draft.config.vocab_size != target.config.vocab_size:
        raise UserError(
            f"--draft {path} has model.vocab_size={draft.config.vocab_size} but the target has "
            f"{target.config.vocab_size}; train the draft with model.vocab_size={target.config.vocab_size}."
        )
    return draft


def staged_draft(path: Path, draft: LoadedCheckpoint, inner: str, compile: bool = False) -> StagedDrafter:
    """The staged drafter of --draft ``path`` --staged ``inner``: the draft model's own drafts from prompt lookup or
    from its heads, which it must have."""
    if inner == "heads" and draft.config.n_future < 2:
        raise UserError(
            f"--staged heads drafts with the draft model's own heads, and --draft {path} has one; train the draft with "
            "model=mtp2 (or mtp4), or use --staged lookup."
        )
    return staged_drafter(draft.model, inner, compile)


def parse_skip_layers(text: str, model: MTPModel) -> frozenset[int]:
    """Block indices of head 1's path (0..len(model.layers) - 1), comma-separated; some but not all of them."""
    blocks = len(model.layers)
    try:
        skip = frozenset(int(part) for part in text.split(","))
    except ValueError:
        raise UserError(f"--skip-layers {text!r} must be block indices such as 2,4,5, or auto.") from None
    if not skip < set(range(blocks)):
        raise UserError(
            f"--skip-layers {text} must name some but not all of the {blocks} blocks of head 1's path "
            f"(0..{blocks - 1}: the trunk, then head 1's own block)."
        )
    return skip


def search_skip_layers(
    model: MTPModel, prompts: list[list[int]], config: GenerationConfig, log=print
) -> tuple[frozenset[int], float]:
    """The blocks to skip, chosen as Draft & Verify chooses them: by the time per token of layer-skip decoding of
    held-out prompts (``config``: its sampling settings and gamma), here by greedy forward selection instead of
    Bayesian optimization: each round skips one more block, the one whose skip set decodes fastest, while that beats
    the previous round. Returns the set and its time per token (seconds)."""
    blocks = len(model.layers)
    if blocks < 2:
        raise UserError("--skip-layers needs a model with at least 2 blocks in head 1's path; this one has 1.")
    search = replace(config, eos_id=None, compile=False, max_new_tokens=SEARCH_NEW_TOKENS)

    def time_per_token(skip: frozenset[int]) -> float:
        drafter = layer_skip_drafter(model, skip)
        seconds = tokens = 0
        for prompt in prompts:
            _, stats = generate(model, [prompt], search, drafter)
            seconds, tokens = seconds + stats.wall_time_s, tokens + stats.tokens
        return seconds / tokens

    time_per_token(frozenset({0}))  # warm-up: packing, allocator, caches
    chosen, best = frozenset(), float("inf")
    while len(chosen) < blocks - 1:
        trials = {chosen | {b}: time_per_token(chosen | {b}) for b in range(blocks) if b not in chosen}
        skip, seconds = min(trials.items(), key=lambda trial: trial[1])
        log(f"note: skip-layers search: skipping {sorted(skip)} decodes at {1000 * seconds:.2f} ms/token")
        if seconds >= best:
            break
        chosen, best = skip, seconds
    return chosen, best


def skip_layers_drafter(spec: str, loaded: LoadedCheckpoint, config: GenerationConfig, compile: bool = False):
    """The layer-skip drafter of --skip-layers ``spec``: a list of blocks, or auto (searched for with ``config``'s
    settings on held-out prompts of the checkpoint's validation split, the search's rounds on stderr)."""
    if spec != "auto":
        return layer_skip_drafter(loaded.model, parse_skip_layers(spec, loaded.model), compile)
    prompts = prompts_beyond_the_benchmarks(loaded, SEARCH_PROMPTS, SEARCH_PROMPT_TOKENS)
    skip, _ = search_skip_layers(loaded.model, prompts, config, log=lambda line: print(line, file=sys.stderr))
    return layer_skip_drafter(loaded.model, skip, compile)


def pick_drafter(args, loaded: LoadedCheckpoint, config: GenerationConfig, device: torch.device) -> Proposer | None:
    """The drafter of --draft, --skip-layers or --prompt-lookup (None: the heads draft, or nothing does); --skip-layers
    auto searches on held-out prompts of the checkpoint's validation split."""
    if args.draft is not None:
        draft = load_draft(args.draft, loaded, device, args.dtype)
        if args.staged is not None:
            return staged_draft(args.draft, draft, args.staged, args.compile)
        return draft_model_drafter(draft.model, args.compile)
    if args.skip_layers is not None:
        return skip_layers_drafter(args.skip_layers, loaded, config, args.compile)
    if args.prompt_lookup is not None:
        return LookupDrafter(args.prompt_lookup, loaded.config.vocab_size, device)
    return None


def check_staged_flag(args) -> None:
    """--staged names where a --draft model's own drafts come from: it needs one."""
    if args.staged is not None and args.draft is None:
        raise UserError("--staged decodes a draft model speculatively; give it with --draft DRAFT.ckpt.")


def drafting(args) -> bool:
    """Whether a drafter replaces the heads' drafts: --draft, --skip-layers or --prompt-lookup."""
    return args.draft is not None or args.skip_layers is not None or args.prompt_lookup is not None


def check_drafting_flags(args) -> None:
    """The drafting flags' ranges and combinations, before anything is loaded (GenerationConfig checks --gamma against
    the decoding settings of the heads' drafts, --heads and --draft-p-min; it knows no drafters, so --gamma's floor of
    1 with one is checked here)."""
    if not drafting(args):
        return
    require_at_least(args, 1, "gamma", "prompt_lookup")
    if args.tree is not None:
        raise UserError(
            "--draft, --skip-layers and --prompt-lookup draft chains, not a --tree of the heads; drop --tree."
        )
    if args.self_speculative and args.prompt_lookup is not None:
        raise UserError(
            "--prompt-lookup drafts one continuation, which does not combine with the heads' drafts; drop "
            "--self-speculative (a hybrid step takes --draft or --skip-layers)."
        )
