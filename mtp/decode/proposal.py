"""What a proposer is to the decoding loop: :class:`Proposer`, the interface every drafter implements
(:mod:`mtp.decode.proposers`, :mod:`mtp.decode.lookup`), and :class:`Proposal`, the drafts it hands a step."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from torch import Tensor

from mtp.decode.acceptance import RandomLayout
from mtp.decode.cache import KVCache
from mtp.decode.sampling import Draws
from mtp.decode.settings import Drafted

DEFAULT_GAMMA = 4
"""A drafter's drafts per step unless it is given its own (decode's --gamma default)."""


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
    """What :func:`~mtp.decode.generate.generate` asks of a proposer. Rows are the live rows of the batch, in order.

    ``draws(plan)``: the uniforms it needs per step, placed in the step's layout, which it is given
    (``lay_out(layout)``); ``start(prompts, max_len, config)``; then per step: ``draft_in_step`` during the target's
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
    drafts_with_a_model = True
    """Its drafts come out of a model's forward (heads, a draft model, layer skip), so their precision
    (``draft_dtype``) can change them; False: a lookup in the tokens."""
    draws_drafts = True
    """When sampling, it draws its drafts from laws it computes, so ``draft_choice`` can draw them otherwise; False:
    its drafts are chosen another way (looked up, or decoded by an inner speculative step)."""
    layout: RandomLayout | None = None
    """Where its uniforms are in a step's (:meth:`lay_out`; None: not laid out, greedy)."""
    beside_heads = False
    """Its chains can be verified beside the target's heads' chain in one step (:class:`HybridProposer`): it has
    ``draft_chains(gamma, draws)``."""

    def params(self) -> dict[str, str]:
        """The method's parameters, for the statistics line."""
        return {}

    def lay_out(self, layout: RandomLayout) -> None:
        """Where the uniforms it declared (:meth:`draws`) are among a step's, before it starts: the layout of the step
        it drafts for, made of its declaration and the acceptance rule's."""
        self.layout = layout

    def method_params(self) -> dict[str, str]:
        """What the statistics say of the method: a drafter's gamma, then its :meth:`params`."""
        return {"gamma": str(self.gamma), **self.params()}

    def draws(self, plan: Drafted) -> Draws:
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

    def start(self, prompts: list[list[int]], max_len: int, config: Drafted | None = None) -> None:
        """``config`` (None: greedy) sets how drafts are made: sampled from their proposals or top-ranked."""
        self.config = config
        self.sampled = config is not None and config.samples_drafts

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
