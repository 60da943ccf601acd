"""The plan of one :func:`~mtp.decode.generate` call (:class:`Plan`), made of its parts, and the interface of the part
that drafts (:class:`Proposer`, with :class:`Proposal`, the drafts it hands a step).

The parts are the settings of :mod:`mtp.decode.settings`, each checking its own fields where it is made: how to
sample and accept (:class:`~mtp.decode.settings.GenerationConfig`), how the target's heads draft
(:class:`~mtp.decode.settings.HeadsSettings`), how drafts from a model are drawn
(:class:`~mtp.decode.settings.DraftSettings`) and how a step runs (:class:`~mtp.decode.settings.StepSettings`); and
the drafter: what drafts besides the heads, a decoding method (:mod:`mtp.decode.methods`) of its settings and its
drafts per step (:class:`Drafting`, a plan's spec: nothing built), or the :class:`Proposer` it built (a built plan). The
plan checks what crosses them, and derives the step they make: the tree or chain it verifies, its drafts, what the
target's inference form packs. A plan with no proposer (one head, no drafter) is autoregressive decoding.

A plan's life: made (its parts' rules and the method's own refusals, :meth:`Plan.__post_init__`), checked against a
model and prompts (:meth:`Plan.check`: the heads it has, its context), then built (:meth:`Plan.build`: a draft model
loaded, a skip set searched), so that nothing is loaded or searched for a plan a model cannot run.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
from torch import Tensor

from mtp.decode.cache import KVCache
from mtp.decode.inference import InferenceModel
from mtp.decode.sampling import Draws, RandomLayout
from mtp.decode.settings import (
    PARTS,
    DraftDtype,
    DraftSettings,
    GenerationConfig,
    HeadsSettings,
    StepSettings,
    owner_of,
)
from mtp.decode.tree import DraftTree
from mtp.errors import SettingError
from mtp.model.config import ModelConfig

DEFAULT_GAMMA = 4
"""A drafter's drafts per step unless it is given its own (the default of its settings' ``gamma``)."""


@dataclass
class Proposal:
    """A step's drafts. Row b's first ``counts[b]`` (``live[b]``) drafts, or tree depths, are meant; the rest pad."""

    tokens: Tensor
    """(B, N): a chain's drafts, or a draft tree's nodes (parents first)."""
    probs: Tensor | None
    """(B, D, V): the law each chain draft (each tree depth's nodes) was drawn from; None: top-ranked drafts."""
    live: Tensor | None = None
    """(B,) on the device: drafts (chain) or depths (tree) each row has, before a draft too unlikely to verify."""
    counts: list[int] | None = None
    """The same on the host, from proposers that know it there (the drafters)."""
    law_index: Tensor | None = None
    """(N,) for a tree whose nodes were not drawn one law per depth: the index in ``probs`` of each node's law."""
    distinct: bool = False
    """A tree whose every node's children were drawn from their law without replacement (else independently)."""

    def rows(self, index: Tensor, rows: list[int]) -> Proposal:
        """This proposal for the rows ``index`` (``rows`` on the host) only."""
        return Proposal(
            self.tokens[index],
            None if self.probs is None else self.probs[index],
            None if self.live is None else self.live[index],
            None if self.counts is None else [self.counts[r] for r in rows],
            self.law_index,
            self.distinct,
        )


class Proposer:
    """What :func:`~mtp.decode.generate` asks of a proposer. Rows are the live rows of the batch, in order.

    ``check_plan(plan)``: its own refusals of a plan it drafts in, where the plan is made (a static method: its method
    asks its class before building one, :meth:`DrafterMethod.check_plan`); ``draws(plan)``: the uniforms
    it needs per step, placed in the step's layout, which it is given (``lay_out(layout)``); the target's form it drafts
    beside (``join(form)``); ``start(prompts, max_len, plan)``; then per step: ``draft_in_step`` during the target's
    forward (for drafts that come out of it), ``keep_rows`` when rows finish, ``advance(accepted, emitted)`` (what the
    target accepted of the last proposal, and the tokens each row emitted: the accepted drafts and the token after
    them), and ``propose``.
    """

    method: str
    """How the drafts are made, for the statistics: ``heads`` (the target's), ``draft`` (a draft model), ``layerskip``
    (the target with blocks skipped), ``lookup`` (prompt lookup)."""
    forwards = 0
    """Forwards the proposer's own model ran (0 without one)."""
    context: int | None = None
    """The most positions its model holds (None: no model of its own, no limit)."""
    gamma = 0
    """Drafts it makes per step, at most (a drafter's, at least 1; 0 for the heads, whose drafts the settings count).
    :meth:`with_gamma` gives the same drafter with another count."""
    layout: RandomLayout | None = None
    """Where its uniforms are in a step's (:meth:`lay_out`; None: not laid out, greedy)."""
    beside_heads = False
    """Its chains can be verified beside the target's heads' chain in one step (:class:`HybridProposer`): it has
    ``draft_chains(gamma, draws)``."""

    def params(self) -> dict[str, str]:
        """The method's parameters, for the statistics line."""
        return {}

    def join(self, form: InferenceModel) -> None:
        """The target's inference form, packed for the step it drafts in, which the loop gives every proposer before
        it starts: the heads draft out of its forward; a drafter drafts with a model of its own or none (nothing to
        take here)."""

    def lay_out(self, layout: RandomLayout) -> None:
        """Where the uniforms it declared (:meth:`draws`) are among a step's, before it starts: the layout of the step
        it drafts for, made of its declaration and the acceptance rule's."""
        self.layout = layout

    def method_params(self) -> dict[str, str]:
        """What the statistics say of the method: a drafter's gamma, then its :meth:`params`."""
        return {"gamma": str(self.gamma), **self.params()}

    def draws(self, plan: Plan) -> Draws:
        """The uniforms it draws per step when sampling (:class:`~mtp.decode.acceptance.RandomLayout` places them):
        a drafter's, one per draft of its chain, or one per node of the tree ``plan``'s step verifies (its chains, and
        in a hybrid the heads' too), whether it reads them or not (prompt lookup does not), so that a seed's outputs
        do not depend on it."""
        tree = plan.step_tree
        return Draws(drafter=tree.size if tree is not None else self.gamma)

    def with_gamma(self, gamma: int) -> Proposer:
        """This drafter (before it starts: nothing of a run is in it yet) drafting ``gamma`` tokens per step."""
        drafter = copy.copy(self)
        drafter.gamma = gamma
        return drafter

    @staticmethod
    def check_plan(plan: Plan) -> None:
        """A :class:`~mtp.errors.SettingError` where ``plan``'s other parts ask what proposers of this class cannot do
        (prompt lookup: several drafts per step); :class:`Plan` asks when it is made, of the class a spec's method
        builds (:meth:`DrafterMethod.check_plan`) or of a built proposer."""

    def check_weights(self, plan: Plan) -> None:
        """A :class:`~mtp.errors.SettingError` where the model it drafts with cannot take ``plan``'s ``quantize``
        (:meth:`~mtp.decode.settings.StepSettings.check_model`), asked before any weight is converted; nothing
        without a model of its own."""

    def start(self, prompts: list[list[int]], max_len: int, plan: Plan | None = None) -> None:
        """``plan`` (None: greedy) sets how drafts are made: sampled from their proposals or top-ranked."""
        self.plan = plan
        self.sampled = plan is not None and plan.samples_drafts

    def draft_in_step(
        self, hidden: Tensor, cache: KVCache, last: Tensor, inputs: Tensor, next_token: Tensor, draws: Tensor | None
    ) -> Tensor | None:
        """Drafts made from the target's step (before its cache is committed): :meth:`InferenceModel.draft`'s
        arguments; returns how many each row has (B,) on the device. None: this proposer drafts in :meth:`propose`."""
        return None

    def advance(self, accepted: list[int], emitted: list[list[int]]) -> None:
        pass

    def keep_rows(self, rows: list[int], index: Tensor) -> None:
        raise NotImplementedError

    def propose(self, gamma: int, draws: Tensor | None) -> Proposal:
        """At most ``gamma`` drafts per row; when sampling, draft j is drawn with ``draws[:, j]``."""
        raise NotImplementedError


class DrafterMethod(Protocol):
    """What a plan asks of the decoding method that drafts in it (a :class:`~mtp.decode.methods.DecodingMethod` of its
    settings)."""

    def check_plan(self, plan: Plan) -> None:
        """Its refusals of ``plan`` (those of the proposer class it builds: :meth:`Proposer.check_plan`), asked before
        anything is built."""

    def drafter(self, target: Any) -> Proposer:
        """Its proposer for ``target`` (a :class:`~mtp.decode.methods.Target`), drafting ``target.gamma`` tokens a
        step: where a draft model is loaded, a skip set searched."""


@dataclass(frozen=True)
class Drafting:
    """What drafts besides the heads in a plan not built yet: a decoding method of its settings, and the drafts per step
    asked of it. :meth:`Plan.build` builds its proposer."""

    method: DrafterMethod
    gamma: int = DEFAULT_GAMMA
    """Drafts per step (the drafter settings' ``gamma``)."""

    def check_plan(self, plan: Plan) -> None:
        self.method.check_plan(plan)

    def build(self, target: Any) -> Proposer:
        """The proposer of its method for ``target`` (a :class:`~mtp.decode.methods.Target`), drafting :attr:`gamma`
        tokens a step."""
        return self.method.drafter(replace(target, gamma=self.gamma))


PART_NAMES: dict[type, str] = {
    GenerationConfig: "sampling",
    HeadsSettings: "heads",
    DraftSettings: "drafts",
    StepSettings: "step",
}
"""The plan's attribute of each settings part (:data:`~mtp.decode.settings.PARTS`)."""


@dataclass
class Plan:
    """What one :func:`~mtp.decode.generate` call does: its parts, the checks where they meet, and the step they make.
    Each part checked its own fields when it was made; a plan of parts that do not go together is a
    :class:`~mtp.errors.SettingError` naming the fields of both."""

    sampling: GenerationConfig = field(default_factory=GenerationConfig)
    """How to sample and accept, and how long to go on: what every method shares."""
    heads: HeadsSettings = field(default_factory=HeadsSettings)
    """How the target's own heads draft (one head: they do not)."""
    drafter: Drafting | Proposer | None = None
    """Who drafts besides the heads, with its own drafts per step (:attr:`gamma`): a method of its settings, to be built
    (:class:`Drafting`: :meth:`build`), or the proposer it built; beside heads that draft too, a hybrid step. None: the
    heads alone, or nobody (autoregressive decoding)."""
    drafts: DraftSettings = field(default_factory=DraftSettings)
    """How drafts from a model are drawn: their dtype, their choice when sampling, several sequences, adaptive
    chains."""
    step: StepSettings = field(default_factory=StepSettings)
    """How a step runs: compiled, captured."""
    step_tree: DraftTree | None = field(default=None, init=False, repr=False, compare=False)
    """The tree a step verifies, of the heads' tree or of several chains (:meth:`draft_tree`); None: a chain."""

    def __post_init__(self) -> None:
        heads, drafts, sampling, gamma = self.heads, self.drafts, self.sampling, self.gamma
        if self.drafter is not None and gamma < 1:
            raise SettingError("{gamma} must be at least 1 with a drafter.", gamma=gamma)
        if drafts.adaptive_drafts and heads.tree is not None:
            raise SettingError(
                "{adaptive_drafts:name} sizes chains; cut a {tree:name} with {draft_p_min:name} instead.",
                adaptive_drafts=True,
                tree=heads.tree,
                draft_p_min=heads.draft_p_min,
            )
        if drafts.drafts_per_step > 1 and heads.tree is not None:
            raise SettingError(
                "{drafts_per_step} verifies a tree of independent chains; it does not combine with a {tree:name}.",
                drafts_per_step=drafts.drafts_per_step,
                tree=heads.tree,
            )
        if sampling.acceptance == "spectr" and drafts.draft_choice == "top":
            raise SettingError(
                "{acceptance} selects among drafts sampled independently from one law, and {draft_choice} drafts the "
                "top-ranked tokens; use {draft_choice:auto} with it.",
                acceptance=sampling.acceptance,
                draft_choice=drafts.draft_choice,
            )
        if drafts.draft_dtype != "auto" and heads.heads == 1 and self.drafter is None:
            raise SettingError(
                "{draft_dtype} quantizes the drafts, but {heads} without a drafter drafts nothing; draft with more "
                "heads or a drafter, or leave {draft_dtype:auto}.",
                draft_dtype=drafts.draft_dtype,
                heads=heads.heads,
            )
        if drafts.draft_dtype != "auto" and self.step.quantize != "none":
            raise SettingError(
                "{quantize} quantizes every matrix, the drafts' included, and {draft_dtype} quantizes the drafts "
                "alone; leave {draft_dtype:auto} with it.",
                quantize=self.step.quantize,
                draft_dtype=drafts.draft_dtype,
            )
        if self.drafter is not None and (heads.tree is not None or heads.draft_p_min > 0):
            raise SettingError(
                "{gamma} drafts come from a drafter, which drafts chains, not a {tree:name} of the heads' candidates; "
                "use no {tree:name} and no {draft_p_min:name} with it.",
                gamma=gamma,
                tree=heads.tree,
                draft_p_min=heads.draft_p_min,
            )
        if drafts.drafts_per_step > 1 and self.step_drafts == 0:
            raise SettingError(
                "{drafts_per_step} needs drafts: use {heads:name} above 1 or a drafter.",
                drafts_per_step=drafts.drafts_per_step,
                heads=heads.heads,
            )
        if sampling.acceptance == "spectr" and self.hybrid:
            raise SettingError(
                "{acceptance} selects among independent drafts of one proposer, and a hybrid step ({gamma} drafts "
                "beside {heads}) mixes two; use {acceptance:exact} with it.",
                acceptance=sampling.acceptance,
                gamma=gamma,
                heads=heads.heads,
            )
        if self.drafter is not None:
            self.drafter.check_plan(self)
        self.step_tree = self.draft_tree()

    def changed(self, **settings: Any) -> Plan:
        """This plan with ``settings`` changed, each in the part that owns it (``heads=4`` the heads', ``seed=1`` the
        sampling's: :func:`~mtp.decode.settings.owner_of`), checked again; the drafter (spec or built) stays."""
        parts = {name: getattr(self, name) for name in PART_NAMES.values()}
        for part in PARTS:
            own = {name: value for name, value in settings.items() if owner_of(name) is part}
            if own:
                parts[PART_NAMES[part]] = replace(parts[PART_NAMES[part]], **own)
        return Plan(drafter=self.drafter, **parts)

    def autoregressive(self) -> Plan:
        """The plan of autoregressive decoding with this plan's sampling and steps: no proposer (:attr:`proposes`)."""
        return Plan(self.sampling, step=self.step)

    @property
    def built(self) -> bool:
        """Whether its drafter, if any, is built (:meth:`build`): what :func:`~mtp.decode.generate` decodes."""
        return not isinstance(self.drafter, Drafting)

    def build(self, target: Any) -> Plan:
        """This plan with its drafter built for ``target`` (a :class:`~mtp.decode.methods.Target`: the loaded model
        and where it runs): a draft model loaded, a skip set searched. Ask :meth:`check` first: nothing here checks the
        model or the prompts. A built plan is itself."""
        if self.built:
            return self
        return Plan(self.sampling, self.heads, self.drafter.build(target), self.drafts, self.step)

    @property
    def proposes(self) -> bool:
        """Whether anybody drafts: heads beyond the first, or a drafter."""
        return self.heads.heads > 1 or self.drafter is not None

    @property
    def gamma(self) -> int:
        """A drafter's drafts per step (the drafter owns its count); 0: no drafter."""
        return self.drafter.gamma if self.drafter is not None else 0

    @property
    def hybrid(self) -> bool:
        """A drafter's chains and the heads' chain verified together as one tree."""
        return self.drafter is not None and self.heads.heads > 1

    @property
    def samples_drafts(self) -> bool:
        """Drafts drawn from proposals (sampling, exact acceptance, sampled drafts); otherwise top-ranked (greedy,
        typical, ``draft_choice="top"``)."""
        return not self.sampling.greedy and not self.sampling.typical and self.drafts.draft_choice != "top"

    @property
    def distinct_siblings(self) -> bool:
        """The heads' sampled tree draws each node's children without replacement (``sibling_draws``)."""
        heads = self.heads
        return (
            heads.tree is not None
            and self.samples_drafts
            and self.sampling.acceptance == "exact"
            and heads.sibling_draws == "distinct"
        )

    def proposal_top_p(self, device: torch.device, heads: bool = True) -> float:
        """The top-p of the law sampled drafts are drawn from on ``device``: the target's (``draft_choice="sampled"``),
        or none (tempered). auto: tempered for the heads' drafts on CPU, where finding a nucleus (a sort of up to the
        whole vocabulary) costs a large share of a head's drafting, sampled elsewhere and for a drafter's (``heads``
        False), whose own forward costs more."""
        choice = self.drafts.draft_choice
        auto_tempered = choice == "auto" and heads and device.type == "cpu"
        return 1.0 if choice == "tempered" or auto_tempered else self.sampling.top_p

    def check_device(self, device: torch.device) -> None:
        """Whether this plan runs on ``device`` (:meth:`StepSettings.check_device`,
        :meth:`DraftSettings.check_device`)."""
        self.step.check_device(device)
        self.drafts.check_device(device)

    def check_weights(self, model: ModelConfig, device: torch.device, dtype: torch.dtype) -> None:
        """Whether the step's ``quantize`` runs on the target (``model`` in ``dtype`` on ``device``) and on the
        drafter's model, if it has one: a SettingError naming what is supported if not, before any weight is
        converted (:meth:`StepSettings.check_model`)."""
        self.step.check_model(model, device, dtype)
        if isinstance(self.drafter, Proposer):
            self.drafter.check_weights(self)

    def draft_tree(self) -> DraftTree | None:
        """The tree a step verifies: the heads' ``tree``; else, with ``drafts_per_step`` k > 1, k chains of the
        drafter's gamma drafts or of the heads' k - 1; with a drafter and heads (a hybrid), the drafter's chains and
        the heads' chain as one more branch; None: one chain."""
        if self.heads.tree is not None:
            return self.heads.tree
        heads, gamma, k = self.heads.heads - 1, self.gamma, self.drafts.drafts_per_step
        if gamma and heads:
            return DraftTree.branches([gamma] * k + [heads])
        length = gamma or heads
        return DraftTree.branches([length] * k) if k > 1 else None

    @property
    def step_drafts(self) -> int:
        """Draft positions (chain) or depths (tree) a step can verify."""
        if self.heads.tree is not None:
            return self.heads.tree.depth
        return max(self.gamma, self.heads.heads - 1)

    @property
    def heads_packed(self) -> int:
        """Heads the target's inference form packs: a tree's depth + 1 where the heads draft its tree (no drafter),
        else the heads'."""
        heads_tree = self.step_tree is not None and self.drafter is None
        return self.step_tree.depth + 1 if heads_tree else self.heads.heads

    @property
    def heads_dtype(self) -> DraftDtype:
        """The precision of the heads' drafts: ``draft_dtype`` where the heads draft (alone or in a hybrid), the
        model's where a drafter alone drafts (the dtype is its own)."""
        return self.drafts.draft_dtype if self.drafter is None or self.hybrid else "auto"

    def check(self, model: ModelConfig, prompts: list[list[int]]) -> None:
        """Whether ``model`` can decode ``prompts`` with this plan, asked of a spec before it is built (by the
        layers above) and of a built plan by :func:`~mtp.decode.generate`; the rules of its parts and of its drafter's
        method ran when it was made. A SettingError for more heads than the model has (beyond a shared causal depth)
        or prompts and new tokens beyond its context, a ValueError for an empty prompt. Nothing is built or loaded."""
        self.heads.check_for(model)
        check_context(model, prompts, self.sampling.max_new_tokens, self.step_drafts)

    def cache_length(self, longest_prompt: int) -> int:
        """The KV cache's length: :func:`positions_needed`, and a tree step writes every node before keeping a path."""
        needed = positions_needed(longest_prompt, self.sampling.max_new_tokens, self.step_drafts)
        return needed + (self.step_tree.size if self.step_tree is not None else 0)


def positions_needed(longest_prompt: int, max_new_tokens: int, drafts: int) -> int:
    """Positions a row may occupy: the prompt, the new tokens, and room for a step's ``drafts`` past the budget and for
    causal depths' windows (the step's width + k - 2)."""
    return longest_prompt + max_new_tokens + 2 * (drafts + 1)


def check_context(model: ModelConfig, prompts: list[list[int]], max_new_tokens: int, drafts: int) -> None:
    """Whether ``prompts`` and ``max_new_tokens`` new tokens fit ``model``'s context with room for steps of ``drafts``
    drafts (:func:`positions_needed`): a SettingError naming ``max_new_tokens`` if not, a ValueError for an empty
    prompt."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    longest = max(map(len, prompts))
    needed = positions_needed(longest, max_new_tokens, drafts)
    if needed > model.max_seq_len:
        fits = model.max_seq_len - (needed - max_new_tokens)
        fix = f"lower {{max_new_tokens:name}} to {fits} or shorten the prompt" if fits > 0 else "shorten the prompt"
        raise SettingError(
            f"the longest prompt ({longest} tokens) plus {{max_new_tokens}} does not fit the model's context of "
            f"{model.max_seq_len} tokens (with room for a step's drafts); {fix}.",
            max_new_tokens=max_new_tokens,
        )
