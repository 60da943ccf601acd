"""Turning the scripts' drafting flags into drafters: a draft checkpoint checked against the target, a skip set of
blocks or sublayers read or searched for, prompt lookup (user errors are one sentence each)."""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from mtp.checkpoint_load import LoadedCheckpoint, load_checkpoint
from mtp.cli import require_at_least
from mtp.data.prompts import prompts_beyond_the_benchmarks
from mtp.decode import GenerationConfig
from mtp.decode.inference import ATTENTION, FEED_FORWARD, Sublayer, sublayers_of
from mtp.decode.proposers import (
    LookupDrafter,
    ModelDrafter,
    Proposer,
    StagedDrafter,
    draft_model_drafter,
    layer_skip_drafter,
    staged_drafter,
)
from mtp.decode.skip_search import SearchResult, Trials, measure_costs, search_blocks, search_sublayers
from mtp.errors import UserError
from mtp.model import MTPModel

SEARCH_PROMPTS, SEARCH_PROMPT_TOKENS, SEARCH_NEW_TOKENS = 4, 64, 32
"""--skip-layers auto decodes this many held-out prompts, of this many tokens, continued by this many."""
SEARCH_TRIALS, SEARCH_SECONDS = 30, 600.0
"""--skip-sublayers' trials (each decodes the search's prompts with one set, as each of the block search's up to
n (n + 1) / 2 sets does), and the time after which neither search starts another trial or round."""
SKIP_PART = re.compile(rf"(\d+)([{ATTENTION}{FEED_FORWARD}]?)")
"""One item of a --skip-layers set: a block (7), its attention (3a) or its MLP (5m)."""


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


def add_skip_search_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of --skip-layers auto's search (decode and bench_decode)."""
    search = parser.add_argument_group("--skip-layers auto: the skip set's search")
    search.add_argument(
        "--skip-sublayers",
        action="store_true",
        help="search attention and MLP sublayers (3a, 5m) by Bayesian optimization (Optuna's TPE, seeded with --seed) "
        "instead of whole blocks by greedy forward selection; needs the search extra",
    )
    search.add_argument(
        "--search-trials", type=int, default=SEARCH_TRIALS, help="the sublayer search's trials (sets decoded)"
    )
    search.add_argument(
        "--search-seconds",
        type=float,
        default=SEARCH_SECONDS,
        help="no trial (sublayer search) or round (block search) starts after this many seconds",
    )


def check_skip_search_flags(args: argparse.Namespace, skip_layers: list[str | None]) -> None:
    """--skip-sublayers and its budget, before anything is loaded: it needs auto among ``skip_layers`` (the
    --skip-layers values given) and the search extra."""
    require_at_least(args, 1, "search_trials")
    if args.search_seconds <= 0:
        raise UserError(f"--search-seconds {args.search_seconds:g} must be above 0.")
    if not args.skip_sublayers:
        return
    if "auto" not in skip_layers:
        raise UserError(
            "--skip-sublayers chooses how --skip-layers auto searches; add --skip-layers auto (a set such as 3a,5m "
            "names sublayers itself)."
        )
    if importlib.util.find_spec("optuna") is None:
        raise UserError(
            "--skip-sublayers searches with Optuna, which is not installed; install the search extra: "
            "pip install -e '.[search]'."
        )


def parse_skip_layers(text: str, model: MTPModel) -> frozenset[Sublayer]:
    """The sublayers of --skip-layers ``text``: comma-separated blocks of head 1's path (0..len(model.layers) - 1), each
    whole (7) or one sublayer (3a: attention, 5m: MLP); some but not all of them."""
    blocks = len(model.layers)
    parts = [SKIP_PART.fullmatch(part.strip()) for part in text.split(",")]
    if not all(parts):
        raise UserError(
            f"--skip-layers {text!r} must be blocks such as 2,4,5, sublayers such as 3a,5m (a: attention, m: MLP), "
            "or auto."
        )
    skip = sublayers_of(int(p[1]) if not p[2] else (int(p[1]), p[2]) for p in parts)
    every = {(block, half) for block in range(blocks) for half in (ATTENTION, FEED_FORWARD)}
    if not skip < every:
        raise UserError(
            f"--skip-layers {text} must name some but not all of the {blocks} blocks of head 1's path "
            f"(0..{blocks - 1}: the trunk, then head 1's own block) or of their sublayers (3a, 5m)."
        )
    return skip


def search_skip_layers(
    model: MTPModel,
    prompts: list[list[int]],
    config: GenerationConfig,
    sublayers: bool = False,
    trials: int = SEARCH_TRIALS,
    seconds: float = SEARCH_SECONDS,
    log: Callable[[str], None] = print,
) -> SearchResult:
    """The set to skip, chosen as Draft & Verify chooses it: by the time per token of layer-skip decoding of held-out
    ``prompts`` with ``config``'s sampling settings, gamma and seed (:mod:`mtp.decode.skip_search`: the counts of
    every set decoded, the costs measured once, so that two runs choose the same set): over whole blocks by greedy
    forward selection, or over sublayers by Bayesian optimization seeded with ``config.seed``."""
    blocks = len(model.layers)
    if blocks < 2 and not sublayers:
        raise UserError(
            "--skip-layers auto needs a model with at least 2 blocks in head 1's path (this one has 1), or "
            "--skip-sublayers."
        )
    search = replace(config, max_new_tokens=SEARCH_NEW_TOKENS)
    costs = measure_costs(model, prompts[0], config.gamma)
    head, attention, feed_forward = costs.measured
    log(
        f"note: skip-layers search: a target step takes {costs.step_ms:.3f} ms; of it, a draft forward's head "
        f"{head:.4f} (rounded {costs.head:.2f}), one block's attention {attention:.4f} ({costs.attention:.2f}), one "
        f"block's MLP {feed_forward:.4f} ({costs.feed_forward:.2f})"
    )
    measured = Trials(model, prompts, search, costs)
    if sublayers:
        found = search_sublayers(measured, trials, seconds, config.seed, log)
    else:
        found = search_blocks(measured, seconds, log)
    if found.stopped_early:
        log(f"note: skip-layers search: stopped at the time limit (--search-seconds {seconds:g}); another run may stop "
            "elsewhere")  # fmt: skip
    return found


def skip_layers_drafter(
    spec: str,
    loaded: LoadedCheckpoint,
    config: GenerationConfig,
    compile: bool = False,
    sublayers: bool = False,
    trials: int = SEARCH_TRIALS,
    seconds: float = SEARCH_SECONDS,
) -> ModelDrafter:
    """The layer-skip drafter of --skip-layers ``spec``: a set of blocks and sublayers, or auto (searched for with
    ``config``'s settings on held-out prompts of the checkpoint's validation split, over sublayers with
    ``sublayers``; the search's progress on stderr)."""
    if spec != "auto":
        return layer_skip_drafter(loaded.model, parse_skip_layers(spec, loaded.model), compile)
    prompts = prompts_beyond_the_benchmarks(loaded, SEARCH_PROMPTS, SEARCH_PROMPT_TOKENS)
    found = search_skip_layers(
        loaded.model, prompts, config, sublayers, trials, seconds, log=lambda line: print(line, file=sys.stderr)
    )
    search = "sublayers" if sublayers else "blocks"
    print(
        f"note: skip-layers search ({search}, {found.evaluated} sets decoded): skipping {found.label}, acceptance "
        f"{found.trial.acceptance:.2f}, {found.ms_per_token:.3f} ms/token",
        file=sys.stderr,
    )
    return layer_skip_drafter(loaded.model, found.skip, compile, {"search": search})


def pick_drafter(args, loaded: LoadedCheckpoint, config: GenerationConfig, device: torch.device) -> Proposer | None:
    """The drafter of --draft, --skip-layers or --prompt-lookup (None: the heads draft, or nothing does); --skip-layers
    auto searches on held-out prompts of the checkpoint's validation split."""
    if args.draft is not None:
        draft = load_draft(args.draft, loaded, device, args.dtype)
        if args.staged is not None:
            return staged_draft(args.draft, draft, args.staged, args.compile)
        return draft_model_drafter(draft.model, args.compile)
    if args.skip_layers is not None:
        return skip_layers_drafter(
            args.skip_layers, loaded, config, args.compile, args.skip_sublayers, args.search_trials, args.search_seconds
        )
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
    check_skip_search_flags(args, [args.skip_layers])
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
