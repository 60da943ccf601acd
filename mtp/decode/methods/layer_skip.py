"""Layer skip (Draft & Verify, Zhang et al. 2023): the target drafts with some blocks of head 1's path, or some of
their attention and MLP sublayers, skipped; the set is given, or searched for on held-out prompts (auto)."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from mtp.checkpoint.load import LoadedCheckpoint
from mtp.data.prompts import prompts_beyond_the_benchmarks
from mtp.decode.inference import ATTENTION, FEED_FORWARD, Sublayer, sublayers_of
from mtp.decode.methods.base import BenchRow, DecodingMethod, Sweep, Target, register, to_stderr
from mtp.decode.proposal import Proposer
from mtp.decode.proposers import ModelDrafter, layer_skip_drafter
from mtp.decode.settings import Drafted
from mtp.decode.skip_search import SearchResult, Trials, measure_costs, search_blocks, search_sublayers
from mtp.errors import SettingError, UserError
from mtp.model import MTPModel

SEARCH_PROMPTS, SEARCH_PROMPT_TOKENS, SEARCH_NEW_TOKENS = 4, 64, 32
"""--skip-layers auto decodes this many held-out prompts, of this many tokens, continued by this many."""
SEARCH_TRIALS, SEARCH_SECONDS = 30, 600.0
"""--skip-sublayers' trials (each decodes the search's prompts with one set, as each of the block search's up to
n (n + 1) / 2 sets does), and the time after which neither search starts another trial or round."""
SKIP_PART = re.compile(rf"(\d+)([{ATTENTION}{FEED_FORWARD}]?)")
"""One item of a --skip-layers set: a block (7), its attention (3a) or its MLP (5m)."""


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
    config: Drafted,
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
    config: Drafted,
    compile: bool = False,
    sublayers: bool = False,
    trials: int = SEARCH_TRIALS,
    seconds: float = SEARCH_SECONDS,
    log: Callable[[str], None] = to_stderr,
) -> ModelDrafter:
    """The layer-skip drafter of --skip-layers ``spec``, drafting ``config.gamma`` a step: a set of blocks and
    sublayers, or auto (searched for with ``config``'s settings on held-out prompts of the checkpoint's validation
    split, over sublayers with ``sublayers``; the search's progress and choice to ``log``)."""
    if spec != "auto":
        return layer_skip_drafter(loaded.model, parse_skip_layers(spec, loaded.model), compile, gamma=config.gamma)
    prompts = prompts_beyond_the_benchmarks(loaded, SEARCH_PROMPTS, SEARCH_PROMPT_TOKENS)
    found = search_skip_layers(loaded.model, prompts, config, sublayers, trials, seconds, log)
    search = "sublayers" if sublayers else "blocks"
    log(
        f"note: skip-layers search ({search}, {found.evaluated} sets decoded): skipping {found.label}, acceptance "
        f"{found.trial.acceptance:.2f}, {found.ms_per_token:.3f} ms/token"
    )
    return layer_skip_drafter(loaded.model, found.skip, compile, {"search": search}, config.gamma)


@dataclass
class LayerSkipSettings:
    skip_layers: str | None = None
    """Draft with this model minus these blocks of head 1's path (0-based, e.g. 2,4,5; the last is head 1's own
    block) or sublayers (3a: block 3's attention, 5m: block 5's MLP), or auto: the set that decodes held-out prompts
    fastest."""
    skip_sublayers: bool = False
    """Search attention and MLP sublayers (3a, 5m) by Bayesian optimization (Optuna's TPE, seeded with --seed) instead
    of whole blocks by greedy forward selection; needs the search extra."""
    search_trials: int = SEARCH_TRIALS
    """The sublayer search's trials (sets decoded)."""
    search_seconds: float = SEARCH_SECONDS
    """No trial (sublayer search) or round (block search) starts after this many seconds."""

    def __post_init__(self) -> None:
        """The search's budget, and --skip-sublayers only with a search (auto) and the search extra."""
        if self.search_trials < 1:
            raise SettingError("{search_trials} must be at least 1.", search_trials=self.search_trials)
        if self.search_seconds <= 0:
            raise SettingError("{search_seconds} must be above 0.", search_seconds=self.search_seconds)
        if not self.skip_sublayers:
            return
        if self.skip_layers != "auto":
            raise SettingError(
                "{skip_sublayers:name} chooses how {skip_layers:auto} searches; add {skip_layers:auto} (a set such as "
                "3a,5m names sublayers itself).",
                skip_sublayers=True,
                skip_layers=self.skip_layers,
            )
        if importlib.util.find_spec("optuna") is None:
            raise SettingError(
                "{skip_sublayers:name} searches with Optuna, which is not installed; install the search extra: "
                "pip install -e '.[search]'.",
                skip_sublayers=True,
            )


@register
class LayerSkip(DecodingMethod):
    """The target itself drafts with some blocks or sublayers of head 1's path skipped (Draft & Verify)."""

    name = "layerskip"
    settings = LayerSkipSettings
    selected_by = "skip_layers"
    beside_heads = True

    def proposer(self, target: Target) -> Proposer:
        options = self.options
        return skip_layers_drafter(
            options.skip_layers, target.loaded, target.config, target.compile, options.skip_sublayers,
            options.search_trials, options.search_seconds, target.log,
        )  # fmt: skip

    def rows(self, target: Target, mode: str, labels: list[str], sweep: Sweep) -> list[BenchRow]:
        """A row per set of the sweep's; an auto set searched over blocks, and with skip_sublayers over sublayers too
        (a row each)."""
        options, config, rows = self.options, target.drafting(target.config.gamma), []
        for spec in sweep.skip_layers:
            for sublayers in (False, True) if spec == "auto" and options.skip_sublayers else (False,):
                drafter = skip_layers_drafter(
                    spec, target.loaded, config, target.compile, sublayers, options.search_trials,
                    options.search_seconds, target.log,
                )  # fmt: skip
                rows.append(BenchRow(self.name, config, drafter))
        return rows
