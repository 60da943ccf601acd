"""The target's own heads as the proposer of a step (self-speculative decoding), alone or beside a drafter: the
heads' method's proposers (the method: :mod:`mtp.decode.methods.heads`). Their drafts come out of the step's own
forward (verify and predict merged, as in blockwise parallel decoding, Stern et al. 2018): the loop gives them the
inference form it packs for the step through the hook it calls on every proposer
(:meth:`~mtp.decode.plan.Proposer.join`). Their method builds them as every method builds its own
(:meth:`mtp.decode.methods.heads.Heads.proposer`); for a plan, the loop asks :func:`proposer_for` who drafts its
steps: the heads, the plan's drafter, or both.

- :class:`HeadsProposer` (``method="heads"``): heads 2..k; every head's outputs after each row's last accepted input
  become the next drafts, a chain (causal heads draft one depth after another,
  :class:`mtp.decode.inference.CausalChain`) or a tree's nodes. Sampling with lossless acceptance, a draft is drawn
  from the head's processed distribution p (temperature and top-k as the target, top-p too with
  ``draft_choice="sampled"``; not with ``tempered``, auto's on CPU) and p is returned with it; otherwise (greedy,
  typical acceptance, ``draft_choice="top"``) the top-ranked tokens are drafted and no distribution is returned.
  With ``draft_dtype="int8"`` the heads compute their logits with int8 matrices (:mod:`mtp.decode.int8`), and p is
  the distribution of those logits.
- :class:`HybridProposer` (``method="hybrid"``): a drafter's chains and the heads' chain, verified as one tree.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from mtp.decode.inference import InferenceModel
from mtp.decode.plan import Plan, Proposal, Proposer
from mtp.decode.sampling import (
    Draws,
    RandomLayout,
    processed_probs,
    sample_distinct,
    sample_from,
    sample_many,
    top_tokens,
)


class HeadsProposer(Proposer):
    """Heads 2..k of the target: a chain of ``heads - 1`` drafts, or the nodes of the plan's tree (the nodes at depth d
    are head d + 1's top-ranked tokens, or drawn from its proposal when sampling: each node's children without
    replacement (``sibling_draws="distinct"``) or every node independently). ``draft_p_min`` cuts a row's chain (tree)
    before the first draft (depth) whose head's top probability is below it."""

    method = "heads"

    def __init__(self, plan: Plan, beside: bool = False) -> None:
        # beside a drafter (a hybrid step) the heads draft their own chain of heads - 1, one branch of the step's tree
        self.beside = beside
        self.drafts = plan.heads.heads - 1 if beside else plan.step_drafts

    def join(self, form: InferenceModel) -> None:
        self.inference = form  # whose heads draft, out of the step's forward

    def draws(self, plan: Plan) -> Draws:
        """One per draft head (their chain's), and one per node of the tree they draft (none beside a drafter)."""
        tree = None if self.beside else plan.step_tree
        return Draws(heads_chain=plan.heads.heads - 1, heads_tree=tree.size if tree is not None else 0)

    def method_params(self) -> dict[str, str]:
        return {}

    def start(self, prompts: list[list[int]], max_len: int, plan: Plan | None = None) -> None:
        super().start(prompts, max_len, plan)
        self.pending: Proposal | None = None

    def draft_in_step(self, hidden, cache, last, inputs, next_token, draws):
        plan, B = self.plan, inputs.size(0)
        tree = None if self.beside else plan.step_tree  # in a hybrid step the heads draft one chain of the tree
        draft_p_min, distinct = plan.heads.draft_p_min, plan.distinct_siblings
        if plan.heads.heads == 1:
            live = torch.zeros(B, dtype=torch.long, device=inputs.device)
            self.pending = Proposal(inputs.new_empty(B, 0), None, live)
            return live
        logits, proposals = [], []

        def top_drafts(head_logits: Tensor, first: int) -> Tensor:  # (h, B, V) -> (h, B), keeping the logits
            logits.append(head_logits)
            return top_tokens(head_logits)

        def sample_drafts(head_logits: Tensor, first: int) -> Tensor:  # (h, B, V) -> (h, B), keeping the proposals
            probs = self.processed(head_logits).transpose(0, 1)  # (B, h, V)
            proposals.append(probs)
            return sample_from(probs, self.layout.drafts(draws, first, probs.size(1))).T

        choose: Callable[[Tensor, int], Tensor] = sample_drafts if self.sampled else top_drafts
        drafts = self.inference.draft(hidden, cache, last, inputs, next_token, choose)
        draft_probs = torch.cat(proposals, dim=1) if self.sampled else None
        heads_logits = None if self.sampled else torch.cat(logits)  # (heads - 1, B, V)
        if draft_p_min > 0:
            if self.sampled:
                confidence = draft_probs.amax(dim=-1)  # (B, heads - 1)
            else:
                drafting = heads_logits[: self.drafts]
                probs = drafting.float().softmax(-1) if plan.sampling.greedy else self.processed(drafting)
                confidence = probs.amax(dim=-1).T
            live = (confidence[:, : self.drafts] >= draft_p_min).long().cumprod(dim=1).sum(dim=1)
        else:
            live = torch.full((B,), self.drafts, dtype=torch.long, device=inputs.device)
        if tree is not None and distinct:  # each node's children drawn without replacement
            uniforms = self.layout.nodes(draws, 0, tree.size)[:, tree.tensors(draws.device)["draw_uniforms"]]
            drafts = tree.sibling_tokens(sample_distinct(draft_probs[:, : tree.depth], uniforms))  # (B, depth, W)
        elif tree is not None and self.sampled:  # every node drawn from its depth's proposal, independently
            drafts = torch.cat(
                [
                    sample_many(draft_probs[:, d - 1], self.layout.nodes(draws, first, last))
                    for d, (first, last) in enumerate(tree.depth_nodes(), start=1)
                ],
                dim=1,
            )
        elif tree is not None:  # greedy and typical: each depth's top-ranked tokens
            candidates = [
                heads_logits[d].topk(k, dim=-1).indices if k > 1 else heads_logits[d].argmax(dim=-1, keepdim=True)
                for d, k in enumerate(tree.ranks_at_depth)
            ]
            drafts = tree.node_tokens(candidates)
        self.pending = Proposal(drafts, draft_probs, live, distinct=tree is not None and distinct)
        return live

    def processed(self, logits: Tensor) -> Tensor:
        """The law a head's draft is sampled from: its distribution after the target's temperature and top-k, and its
        top-p unless the drafts are tempered (:meth:`Plan.proposal_top_p`)."""
        plan, sampling = self.plan, self.plan.sampling
        return processed_probs(logits, sampling.temperature, sampling.top_k, plan.proposal_top_p(logits.device))

    def keep_rows(self, rows: list[int], index: Tensor) -> None:
        self.pending = self.pending.rows(index, rows)

    def propose(self, gamma: int, draws: Tensor | None) -> Proposal:
        return self.pending


class HybridProposer(Proposer):
    """A drafter's chains and the target's own heads' chain, verified as one tree (the plan's ``step_tree``: the
    drafter's ``drafts_per_step`` chains of gamma, then the heads' chain of heads - 1 as one more branch from the
    root). The heads cost nothing to draft (they come out of the step's own forward), so where the drafter's first
    token is wrong the heads' may still be right, and the other way round. The drafter is a model (a draft model,
    layer skip) or prompt lookup (where the text repeats itself it drafts further than heads can, elsewhere the heads
    draft): any drafter with ``beside_heads`` and ``draft_chains``."""

    method = "hybrid"

    def __init__(self, drafter: Proposer, heads: HeadsProposer) -> None:
        if not drafter.beside_heads:
            method = drafter.method
            raise ValueError(f"a {method} drafter does not draft beside the heads (only a model or prompt lookup)")
        assert heads.beside, "the heads beside a drafter draft their own chain: HeadsProposer(..., beside=True)"
        self.drafter, self.heads = drafter, heads
        self.context = drafter.context

    @property
    def gamma(self) -> int:  # type: ignore[override]
        return self.drafter.gamma

    def params(self) -> dict[str, str]:
        return {"drafter": self.drafter.method, **self.drafter.params()}

    def draws(self, plan: Plan) -> Draws:
        return self.drafter.draws(plan) + self.heads.draws(plan)

    def lay_out(self, layout: RandomLayout) -> None:
        super().lay_out(layout)
        self.drafter.lay_out(layout)
        self.heads.lay_out(layout)

    def join(self, form: InferenceModel) -> None:
        self.drafter.join(form)
        self.heads.join(form)

    @property
    def forwards(self) -> int:  # type: ignore[override]
        return self.drafter.forwards

    def start(self, prompts: list[list[int]], max_len: int, plan: Plan | None = None) -> None:
        assert plan is not None and plan.hybrid, "a hybrid proposer drafts with a drafter and the heads"
        super().start(prompts, max_len, plan)
        self.drafter.start(prompts, max_len, plan)
        self.heads.start(prompts, max_len, plan)
        self.order = torch.tensor(plan.step_tree.branch_order(), device=self.drafter.device)

    def draft_in_step(self, hidden, cache, last, inputs, next_token, draws):
        self.heads.draft_in_step(hidden, cache, last, inputs, next_token, draws)
        return torch.full((inputs.size(0),), self.plan.step_drafts, dtype=torch.long, device=inputs.device)

    def advance(self, accepted: list[int], emitted: list[list[int]]) -> None:
        self.drafter.advance(accepted, emitted)

    def keep_rows(self, rows: list[int], index: Tensor) -> None:
        self.drafter.keep_rows(rows, index)
        self.heads.keep_rows(rows, index)

    def propose(self, gamma: int, draws: Tensor | None) -> Proposal:
        tokens, probs = self.drafter.draft_chains(self.drafter.gamma, draws)
        heads = self.heads.pending  # its chain of heads - 1 drafts (B, heads - 1) and their laws
        tokens = torch.cat([tokens, heads.tokens], dim=1)[:, self.order]
        if probs is not None:
            probs = torch.cat([probs, heads.probs], dim=1)
        counts = [self.plan.step_drafts] * tokens.size(0)
        return Proposal(tokens, probs, counts=counts, law_index=self.order if probs is not None else None)


def proposer_for(plan: Plan) -> Proposer:
    """Who drafts a step of ``plan`` (a built plan): its heads (one head: nobody), its drafter, or both in a hybrid
    step (a drafter with heads above 1). The loop gives it the target's form it drafts beside (``join``)."""
    if plan.drafter is None:
        return HeadsProposer(plan)
    if not plan.hybrid:
        return plan.drafter
    return HybridProposer(plan.drafter, HeadsProposer(plan, beside=True))
