"""Layer skip (Draft & Verify, Zhang et al. 2023): the target drafts with some blocks of head 1's path, or some of
their attention and MLP sublayers, skipped (:func:`layer_skip_drafter`: a :class:`~mtp.decode.methods.draft_model.
ModelDrafter` on the target's own form without them, head 1 drafting on a cache of its own; with
``draft_dtype="int8"``, int8 copies of the blocks it runs and of its unembedding); the set is given, or searched for
on held-out prompts (auto).

Searching for a layer-skip draft's skip set (Draft & Verify, Zhang et al. 2023): which blocks of head 1's path, or
which of their attention and MLP sublayers, to skip so that layer-skip decoding of held-out prompts takes the least
time per token.

Two searches over the same objective: :func:`search_blocks`, greedy forward selection over whole blocks (each round
skips one more block, the best, while that beats the previous round), and :func:`search_sublayers`, Bayesian
optimization over sublayers (Optuna's TPE sampler, seeded, a bounded number of trials), as the paper searches.

Why a search finds the same set in two runs. A set's time per token is modelled as (target steps x a target step's
time + draft forwards x a draft forward's time) / tokens (:meth:`Trial.time_per_token`). The counts come from decoding
the prompts with the set, which is deterministic: greedy acceptance, or sampling from seeded uniforms. Only times
are noisy, and on a shared CPU a set's wall time can move between runs by more than good sets differ by. So the times
are measured once, before the search (:func:`measure_costs`): a target step, and a draft forward's parts (the head,
one block's attention, one block's MLP: every block of the path has the same shapes), each as the median of many
interleaved timings of its share of a target step, in CPU time on one thread (which other processes do not inflate),
rounded to :data:`COST_RESOLUTION`. A set's time per token is then a deterministic function of the set and the costs;
the block search is deterministic given them and the sublayer search's sampler is seeded, so two runs whose costs round
alike decode the same sets in the same order and choose the same one. A share near the middle between two multiples
can round apart (the log shows the shares before rounding); the choice then still holds unless the shift reorders sets
whose times are nearly tied. The decoding loop's own per-step work (acceptance, the host transfer) is left out of the
costs: it is the same for every set.
"""

from __future__ import annotations

import importlib.util
import re
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mtp.data.prompts import prompts_beyond_the_benchmarks
from mtp.decode.inference import ATTENTION, FEED_FORWARD, InferenceModel, Sublayer, skip_label, sublayers_of
from mtp.decode.loop import generate
from mtp.decode.methods.base import DecodingMethod, Target, register
from mtp.decode.methods.draft_model import ModelDrafter
from mtp.decode.plan import DEFAULT_GAMMA, Plan, Proposer
from mtp.decode.stats import DecodeStats
from mtp.errors import SettingError
from mtp.model import MTPModel

SEARCH_PROMPTS, SEARCH_PROMPT_TOKENS, SEARCH_NEW_TOKENS = 4, 64, 32
"""A search (``skip_layers="auto"``) decodes this many held-out prompts, of this many tokens, continued by this many."""
SEARCH_TRIALS, SEARCH_SECONDS = 30, 600.0
"""The sublayer search's trials (each decodes the search's prompts with one set, as each of the block search's up to
n (n + 1) / 2 sets does), and the time after which neither search starts another trial or round."""
SKIP_PART = re.compile(rf"(\d+)([{ATTENTION}{FEED_FORWARD}]?)")
"""One item of a skip set: a block (7), its attention (3a) or its MLP (5m)."""

COST_RESOLUTION = 0.01
"""Costs are rounded to this fraction of a target step: coarse enough that most timing noise rounds away (a share
near the middle between two multiples can still round either way), fine enough for the choice (one block's attention
costs 0.04 of a step of the default model's shapes, 0.085 of the tiny preset's)."""
COST_ROUNDS = 60
"""Timings each cost is the median of."""
TIMED_CALLS = 5
"""Calls per timing."""


@dataclass(frozen=True)
class DraftCosts:
    """What layer-skip decoding's forwards cost, in units of a target step (a forward over gamma + 1 positions)."""

    step_ms: float
    """A target step, in milliseconds (of one thread's CPU time on CPU; not rounded: it only scales the result)."""
    head: float
    """A draft forward with no sublayer: the embedding, head 1's norm and unembedding, choosing the draft."""
    attention: float
    """One block's attention sublayer in a draft forward."""
    feed_forward: float
    """One block's MLP sublayer in a draft forward."""
    measured: tuple[float, float, float] | None = None
    """(head, attention, feed_forward) before rounding, for the record."""

    def draft_forward(self, skip: frozenset[Sublayer], blocks: int) -> float:
        """A draft forward of the path of ``blocks`` blocks without the sublayers ``skip``."""
        attention = blocks - sum(half == ATTENTION for _, half in skip)
        feed_forward = blocks - sum(half == FEED_FORWARD for _, half in skip)
        return self.head + attention * self.attention + feed_forward * self.feed_forward


@dataclass(frozen=True)
class Trial:
    """What layer-skip decoding of the search's prompts with one skip set counted."""

    skip: frozenset[Sublayer]
    steps: int
    """Target steps after the prompts'."""
    draft_forwards: int
    tokens: int
    accepted: int
    drafted: int

    @classmethod
    def of(cls, skip: frozenset[Sublayer], stats: DecodeStats) -> Trial:
        return cls(
            skip, stats.forwards - stats.prefills, stats.draft_forwards, stats.tokens, sum(stats.accepted),
            sum(stats.drafted),
        )  # fmt: skip

    @property
    def acceptance(self) -> float:
        """Accepted drafts over verified drafts, all positions pooled."""
        return self.accepted / self.drafted if self.drafted else 0.0

    def time_per_token(self, costs: DraftCosts, blocks: int) -> float:
        """Time per token in target steps, from the counts and ``costs`` (the prompts' steps left out: they cost the
        same whatever is skipped)."""
        return (self.steps + self.draft_forwards * costs.draft_forward(self.skip, blocks)) / self.tokens


@dataclass(frozen=True)
class SearchResult:
    skip: frozenset[Sublayer]
    trial: Trial
    """The chosen set's counts (its acceptance)."""
    ms_per_token: float
    """Its time per token, from the counts and the costs measured once (:class:`DraftCosts`)."""
    evaluated: int
    """Distinct sets decoded."""
    stopped_early: bool = False
    """The time budget ran out before the trial budget (then a second run may stop elsewhere)."""

    @property
    def label(self) -> str:
        return skip_label(self.skip)


PlanWith = Callable[[Proposer], Plan]
"""The plan of a run with a drafter (:meth:`mtp.decode.methods.base.Target.plan`, or ``drafting``)."""


def decode_with(model: MTPModel, prompts: list[list[int]], plan_with: PlanWith, gamma: int, skip: frozenset[Sublayer]):
    """The statistics of decoding each prompt alone with ``skip``'s layer-skip draft of ``gamma`` drafts a step (any
    set, the empty one too: the target drafting for itself) in the plan ``plan_with`` makes with it."""
    drafter = ModelDrafter(InferenceModel.of(model, 1).skipping(skip), "layerskip", gamma=gamma)
    plan = plan_with(drafter)
    runs = [generate(model, [prompt], plan)[1] for prompt in prompts]
    return sum(runs, DecodeStats.empty(runs[0]))


@torch.inference_mode()
def measure_costs(model: MTPModel, prompt: list[int], gamma: int, rounds: int = COST_ROUNDS) -> DraftCosts:
    """The costs of :class:`DraftCosts`, each the median over ``rounds`` rounds of its time over the target step's in
    the same round (a slow spell of a shared machine, which moves both, moves the ratio less): a target step (a forward
    over gamma + 1 positions after ``prompt``, head 1's choices read on the host, as the decoding loop reads them), and
    a draft forward over one position (its choice kept on the device, as a drafter keeps it) with no block (the head),
    with no MLP (the head and every attention) and with no attention (the head and every MLP).

    On CPU the time is the CPU time of this thread with torch on one thread, which other processes on the machine take
    no share of (they do take wall time, which makes a share timed on a busy machine vary far more); on CUDA, wall
    time."""
    target = InferenceModel.of(model, 1)
    blocks = len(model.layers)
    drafts = {
        "no MLP": target.skipping((b, FEED_FORWARD) for b in range(blocks)),
        "no attention": target.skipping((b, ATTENTION) for b in range(blocks)),
    }
    device = target.embeddings.device
    tokens = torch.tensor([prompt], device=device)
    caches = {}
    for name, form in (("target", target), *drafts.items()):  # each form's cache holds the prompt
        caches[name] = form.new_cache(1, len(prompt) + gamma + 1)
        caches[name].begin(len(prompt))
        form.verify(tokens, caches[name], torch.tensor([[len(prompt) - 1]], device=device))
        caches[name].commit(len(prompt))
    step, one = tokens[:, -gamma - 1 :], tokens[:, -1:]

    def target_step() -> None:
        caches["target"].begin(gamma + 1)  # never committed: every call starts from the prompt
        target.verify(step, caches["target"])[0].argmax(dim=-1).tolist()

    def head() -> None:
        target.head1_logits(F.embedding(one, target.embeddings)).argmax(dim=-1)

    def draft_forward(name: str) -> Callable[[], None]:
        def forward() -> None:
            caches[name].begin(1)
            drafts[name].verify(one, caches[name])[0].argmax(dim=-1)

        return forward

    timed = {"head": head, **{name: draft_forward(name) for name in drafts}}
    cuda = device.type == "cuda"
    clock = time.perf_counter if cuda else time.thread_time
    threads = torch.get_num_threads()
    ratios = {name: [] for name in timed}  # each over the target step of the same round
    step_s = []

    def seconds(run: Callable[[], None]) -> float:
        started = clock()
        for _ in range(TIMED_CALLS):
            run()
        if cuda:
            torch.cuda.synchronize()
        return (clock() - started) / TIMED_CALLS

    try:
        if not cuda:
            torch.set_num_threads(1)  # all of the work on this thread, which thread_time counts
        for _ in range(rounds + 1):  # the first round warms up
            step_s.append(seconds(target_step))
            for name, run in timed.items():
                ratios[name].append(seconds(run) / step_s[-1])
    finally:
        torch.set_num_threads(threads)
    median = {name: statistics.median(values[1:]) for name, values in ratios.items()}
    attention = max(0.0, median["no MLP"] - median["head"]) / blocks
    feed_forward = max(0.0, median["no attention"] - median["head"]) / blocks

    def rounded(steps: float) -> float:
        return round(steps / COST_RESOLUTION) * COST_RESOLUTION

    measured = (median["head"], attention, feed_forward)
    return DraftCosts(1000 * statistics.median(step_s[1:]), *map(rounded, measured), measured=measured)


class Trials:
    """The search's objective: a skip set's time per token, from decoding the prompts with it once (the counts are
    deterministic, so a set seen before is not decoded again)."""

    def __init__(
        self, model: MTPModel, prompts: list[list[int]], plan_with: PlanWith, gamma: int, costs: DraftCosts
    ) -> None:
        self.model, self.prompts, self.plan_with, self.gamma, self.costs = model, prompts, plan_with, gamma, costs
        self.blocks = len(model.layers)
        self.seen: dict[frozenset[Sublayer], Trial] = {}

    def __call__(self, skip: Iterable[int | Sublayer]) -> Trial:
        skip = sublayers_of(skip)
        if skip not in self.seen:
            self.seen[skip] = Trial.of(skip, decode_with(self.model, self.prompts, self.plan_with, self.gamma, skip))
        return self.seen[skip]

    def time_per_token(self, trial: Trial) -> float:
        """In target steps."""
        return trial.time_per_token(self.costs, self.blocks)

    def result(self, trial: Trial, stopped_early: bool = False) -> SearchResult:
        ms = self.time_per_token(trial) * self.costs.step_ms
        return SearchResult(trial.skip, trial, ms, len(self.seen), stopped_early)


def search_blocks(trials: Trials, seconds: float, log: Callable[[str], None] = print) -> SearchResult:
    """Greedy forward selection over whole blocks: each round skips one more block, the one whose set decodes in the
    least time per token (ties to the lowest block), while that beats the previous round; no round starts after
    ``seconds`` (the first always runs)."""
    blocks, started = trials.blocks, time.perf_counter()
    chosen, best, stopped_early = None, float("inf"), False
    skipped: frozenset[int] = frozenset()
    while len(skipped) < blocks - 1:
        if chosen is not None and time.perf_counter() - started > seconds:
            stopped_early = True
            break
        round_ = [(trials.time_per_token(trials(skipped | {b})), b) for b in range(blocks) if b not in skipped]
        cost, block = min(round_)
        trial = trials(skipped | {block})
        log(
            f"note: skip-layers search: skipping {skip_label(trial.skip)} decodes at "
            f"{cost * trials.costs.step_ms:.3f} ms/token (acceptance {trial.acceptance:.2f})"
        )
        if cost >= best:
            break
        chosen, best, skipped = trial, cost, skipped | {block}
    return trials.result(chosen, stopped_early)


def search_sublayers(
    trials: Trials, budget: int, seconds: float, seed: int, log: Callable[[str], None] = print
) -> SearchResult:
    """Bayesian optimization over the path's sublayers (each skipped or not): Optuna's TPE sampler seeded with
    ``seed``, at most ``budget`` trials (a set suggested again counts, but is not decoded again) and about
    ``seconds`` (the trial under way finishes). The first trials skip one whole block each; sets that skip nothing
    or everything are pruned."""
    import optuna  # optional: the search extra

    blocks = trials.blocks
    names = [(f"{b}{half}", (b, half)) for b in range(blocks) for half in (ATTENTION, FEED_FORWARD)]
    best = [float("inf")]

    def objective(trial: optuna.Trial) -> float:
        skip = frozenset(sublayer for name, sublayer in names if trial.suggest_categorical(name, (False, True)))
        if not skip or len(skip) == len(names):
            raise optuna.TrialPruned()
        found = trials(skip)
        cost = trials.time_per_token(found)
        if cost < best[0]:
            best[0] = cost
            log(
                f"note: sublayer search, trial {trial.number + 1}/{budget}: skipping {skip_label(skip)} decodes at "
                f"{cost * trials.costs.step_ms:.3f} ms/token (acceptance {found.acceptance:.2f})"
            )
        return cost

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # a line per trial otherwise; the new bests are logged here
    try:
        # the block search's first round (each block skipped whole) stands in for random start-up trials, which
        # mostly skip half of everything and accept little: the sampler starts from the sets that draft well
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(1, min(blocks, budget)))
        study = optuna.create_study(direction="minimize", sampler=sampler)
        for block in range(blocks):
            study.enqueue_trial({name: b == block for name, (b, _) in names})
        study.optimize(objective, n_trials=budget, timeout=seconds)
    finally:
        optuna.logging.set_verbosity(verbosity)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        raise ValueError(f"no trial of the sublayer search skipped some but not all sublayers in {budget} trials")
    chosen = frozenset(sublayer for name, sublayer in names if study.best_trial.params[name])
    return trials.result(trials(chosen), stopped_early=len(study.trials) < budget)


def layer_skip_drafter(
    model: MTPModel,
    skip: Iterable[int | Sublayer],
    compile: bool = False,
    params: dict[str, str] | None = None,
    gamma: int = DEFAULT_GAMMA,
) -> ModelDrafter:
    """The target with ``skip`` of head 1's path skipped, drafting with head 1: whole blocks by index (0..
    len(model.layers) - 1: the trunk, then head 1's own block), or sublayers, (block, ATTENTION or FEED_FORWARD).
    ``params``: more for the statistics line (how the set was found)."""
    sublayers, blocks = sublayers_of(skip), len(model.layers)
    every = {(block, half) for block in range(blocks) for half in (ATTENTION, FEED_FORWARD)}
    if not sublayers or not sublayers < every:
        raise ValueError(
            f"skip={sorted(sublayers)} must name some but not all of head 1's {blocks} blocks (0..{blocks - 1}) "
            "or of their sublayers"
        )
    form = InferenceModel.of(model, 1, compile).skipping(sublayers)
    return ModelDrafter(form, "layerskip", {"skip": skip_label(sublayers), **(params or {})}, gamma)


def parse_skip_layers(text: str, model: MTPModel) -> frozenset[Sublayer]:
    """The sublayers of a skip set ``text`` (the setting ``skip_layers``): comma-separated blocks of head 1's path
    (0..len(model.layers) - 1), each whole (7) or one sublayer (3a: attention, 5m: MLP); some but not all of them."""
    blocks = len(model.layers)
    parts = [SKIP_PART.fullmatch(part.strip()) for part in text.split(",")]
    if not all(parts):
        raise SettingError(
            "{skip_layers} must be blocks such as 2,4,5, sublayers such as 3a,5m (a: attention, m: MLP), or auto.",
            skip_layers=repr(text),
        )
    skip = sublayers_of(int(p[1]) if not p[2] else (int(p[1]), p[2]) for p in parts)
    every = {(block, half) for block in range(blocks) for half in (ATTENTION, FEED_FORWARD)}
    if not skip < every:
        raise SettingError(
            f"{{skip_layers}} must name some but not all of the {blocks} blocks of head 1's path "
            f"(0..{blocks - 1}: the trunk, then head 1's own block) or of their sublayers (3a, 5m).",
            skip_layers=text,
        )
    return skip


def search_skip_layers(
    model: MTPModel,
    prompts: list[list[int]],
    plan_with: PlanWith,
    gamma: int = DEFAULT_GAMMA,
    seed: int = 0,
    sublayers: bool = False,
    trials: int = SEARCH_TRIALS,
    seconds: float = SEARCH_SECONDS,
    log: Callable[[str], None] = print,
) -> SearchResult:
    """The set to skip, chosen as Draft & Verify chooses it: by the time per token of layer-skip decoding of held-out
    ``prompts``, ``gamma`` drafts a step, in the plans ``plan_with`` makes (their sampling settings and seed; the
    counts of every set decoded, the costs measured once, so that two runs choose the same set: see the module's
    docstring): over whole blocks by greedy forward selection, or over sublayers by Bayesian optimization seeded with
    ``seed``."""
    blocks = len(model.layers)
    if blocks < 2 and not sublayers:
        raise SettingError(
            "{skip_layers} needs a model with at least 2 blocks in head 1's path (this one has 1), or "
            "{skip_sublayers:name}.",
            skip_layers="auto",
            skip_sublayers=True,
        )

    def search(drafter: Proposer) -> Plan:  # no EOS (every prompt gives its full count), uncompiled (a compile a set)
        return plan_with(drafter).changed(max_new_tokens=SEARCH_NEW_TOKENS, eos_id=None, compile=False)

    costs = measure_costs(model, prompts[0], gamma)
    head, attention, feed_forward = costs.measured
    log(
        f"note: skip-layers search: a target step takes {costs.step_ms:.3f} ms; of it, a draft forward's head "
        f"{head:.4f} (rounded {costs.head:.2f}), one block's attention {attention:.4f} ({costs.attention:.2f}), one "
        f"block's MLP {feed_forward:.4f} ({costs.feed_forward:.2f})"
    )
    measured = Trials(model, prompts, search, gamma, costs)
    if sublayers:
        found = search_sublayers(measured, trials, seconds, seed, log)
    else:
        found = search_blocks(measured, seconds, log)
    if found.stopped_early:
        log(f"note: skip-layers search: stopped at the time limit ({seconds:g} s); another run may stop elsewhere")
    return found


def skip_layers_drafter(
    spec: str,
    target: Target,
    plan_with: PlanWith,
    sublayers: bool = False,
    trials: int = SEARCH_TRIALS,
    seconds: float = SEARCH_SECONDS,
) -> ModelDrafter:
    """The layer-skip drafter of the skip set ``spec`` for ``target``, drafting ``target.gamma`` a step: a set of
    blocks and sublayers, or auto (searched for on held-out prompts of the checkpoint's validation split, decoded in
    the plans ``plan_with`` makes, over sublayers with ``sublayers``; the search's progress and choice to
    ``target.log``)."""
    loaded, gamma, log = target.loaded, target.gamma, target.log
    if spec != "auto":
        return layer_skip_drafter(loaded.model, parse_skip_layers(spec, loaded.model), target.compile, gamma=gamma)
    prompts = prompts_beyond_the_benchmarks(loaded, SEARCH_PROMPTS, SEARCH_PROMPT_TOKENS)
    seed = target.sampling.seed
    found = search_skip_layers(loaded.model, prompts, plan_with, gamma, seed, sublayers, trials, seconds, log)
    search = "sublayers" if sublayers else "blocks"
    log(
        f"note: skip-layers search ({search}, {found.evaluated} sets decoded): skipping {found.label}, acceptance "
        f"{found.trial.acceptance:.2f}, {found.ms_per_token:.3f} ms/token"
    )
    return layer_skip_drafter(loaded.model, found.skip, target.compile, {"search": search}, gamma)


@dataclass
class LayerSkipSettings:
    skip_layers: str | None = None
    """Draft with this model minus these blocks of head 1's path (0-based, e.g. 2,4,5; the last is head 1's own
    block) or sublayers (3a: block 3's attention, 5m: block 5's MLP), or auto: the set that decodes held-out prompts
    fastest."""
    skip_sublayers: bool = False
    """Search attention and MLP sublayers (3a, 5m) by Bayesian optimization (Optuna's TPE, seeded with the run's seed)
    instead of whole blocks by greedy forward selection; needs the search extra."""
    search_trials: int = SEARCH_TRIALS
    """The sublayer search's trials (sets decoded)."""
    search_seconds: float = SEARCH_SECONDS
    """No trial (sublayer search) or round (block search) starts after this many seconds."""

    def __post_init__(self) -> None:
        """The search's budget, and ``skip_sublayers`` only with a search (auto) and the search extra."""
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

    def proposer_class(self) -> type[Proposer]:
        return ModelDrafter

    def proposer(self, target: Target) -> Proposer:
        options = self.options
        return skip_layers_drafter(
            options.skip_layers, target, target.plan, options.skip_sublayers, options.search_trials,
            options.search_seconds,
        )  # fmt: skip
