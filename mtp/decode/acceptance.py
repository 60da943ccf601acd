"""Acceptance rules: which of a step's drafts pass, and the token that follows them, as pure tensor functions.

A rule reads head 1's logits where the drafts are verified, the drafts (a chain, or the nodes of a tree) and, when
drafts were sampled, the distributions they were drawn from; it never runs the model. Three rules
(:func:`rule_for` picks one for a :class:`~mtp.decode.plan.Plan`):

- :class:`Greedy` (temperature 0): a draft passes while it equals head 1's argmax, so the output is token for token
  that of greedy autoregressive decoding from head 1. A tree's node passes when it is head 1's argmax after its
  parent; the deepest passing path wins (the highest-ranked among equally deep ones).
- :class:`Lossless` (sampling): chain drafts pass with probability min(1, q/p) (q: head 1's processed distribution,
  p: the proposal the draft was drawn from); after a rejection the next token is drawn from normalize(max(0, q - p)),
  after a fully accepted chain from q (Leviathan et al. 2023; Chen et al. 2023). Trees: multi-candidate speculative
  sampling (SpecInfer, Miao et al. 2023): the children of the last accepted node are tried in order, child x passes
  with probability min(1, q(x)/p(x)) under the current target q, which becomes normalize(max(0, q - p)) after each
  rejected child; where a node's children were drawn without replacement (the heads' default), child j's p is the
  proposal without its elder siblings, renormalized (:func:`without_drawn`; Sequoia, Chen et al. 2024), and a child
  drawn after the proposal ran out is not tried. The output is distributed as autoregressive sampling from head 1.
  Top-ranked drafts (``draft_choice="top"``) come with no law: each one's proposal is itself (one-hot,
  :func:`one_hot_law`), so a draft passes with probability q(x) and a rejected one is taken out of q. On CPU a chain's
  tests, and a tree's first child's at each node, are decided from bounds on q (:func:`nucleus_passes`): no nucleus is
  sorted out where the bounds decide, and mostly only the law after the accepted drafts is processed.
- :class:`SpecTr` (``acceptance="spectr"``, sampling): SpecTr's k-sequential selection (Sun et al. 2023, "SpecTr:
  Fast Speculative Decoding via Optimal Transport", Algorithm 3): a step's candidates at a depth, k i.i.d. draws from
  the proposal p, are tried in order, each passing with probability min(1, q(x) / (rho p(x))) for the smallest rho in
  [1, k] that leaves a valid residual; if none passes, the token comes from the residual
  q - min(p, q / rho) (1 - (1 - beta)^k) / beta, beta = sum min(p, q / rho). It accepts one of k drafts with
  probability 1 - (1 - beta)^k, within 1 - 1/e of the best any coupling allows. Candidates are the children of every
  node whose tokens equal the accepted prefix (SpecTr's draft sequences that agree with it), not only of one node.
- :class:`Typical` (Medusa's typical acceptance, lossy, sampling only): a draft passes when head 1 gives it
  probability above min(epsilon, delta * exp(-entropy)); the next token is sampled from head 1 after the longest
  passing path.

Sampling reads uniform numbers that the caller draws per step and row (:class:`~mtp.decode.sampling.RowUniforms`);
:class:`~mtp.decode.sampling.RandomLayout` says which number is used for what, in one place, assembled from what the
rule (:meth:`Rule.tests_per_step`) and the proposer (:meth:`~mtp.decode.plan.Proposer.draws`) each declare.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from mtp.decode.plan import Plan
from mtp.decode.sampling import Draws, RandomLayout, processed_probs, sample_from, top_tokens
from mtp.decode.settings import GenerationConfig
from mtp.decode.tree import DraftTree


# -- the distributions and tests every lossless rule is built from
def accept_drafts(uniforms: Tensor, proposal: Tensor, target: Tensor) -> Tensor:
    """Which drafts pass: each with probability min(1, target / proposal) of its token."""
    return uniforms * proposal < target


def correction_probs(target: Tensor, proposal: Tensor, rejected: Tensor) -> Tensor:
    """Law of the token that follows the accepted drafts, (B, V).

    Where a draft was rejected (``rejected`` (B,)): normalize(max(0, target - proposal)) of the rejected
    position, so that accepted and resampled tokens together are distributed as the target. Where every
    draft passed: the target itself (the bonus token).
    """
    residual = (target - proposal * rejected[:, None]).clamp_(min=0)
    # target == proposal leaves nothing to resample from; then rejection had probability 0 and the target is the law
    empty = residual.sum(dim=-1, keepdim=True) <= 0
    return torch.where(empty, target, residual)


def sibling_passes(uniform: Tensor, remaining: Tensor, token_probability: Tensor, proposal: Tensor) -> Tensor:
    """Multi-candidate speculative sampling (SpecInfer): a candidate x drawn from proposal p passes with probability
    min(1, q(x) / p(x)) under the current target q = normalize(``remaining``) (``token_probability``: remaining(x),
    ``proposal``: p(x))."""
    return uniform * proposal * remaining.sum(dim=-1) < token_probability


def residual_after_rejection(remaining: Tensor, proposal: Tensor, rejected: Tensor) -> Tensor:
    """The target after a rejected candidate, unnormalized: max(0, q - p) with q = normalize(remaining), for rows
    where ``rejected`` (B,); the same target elsewhere."""
    residual = (remaining - remaining.sum(dim=-1, keepdim=True) * proposal).clamp_(min=0)
    return torch.where(rejected[:, None], residual, remaining)


def without_drawn(proposal: Tensor, drawn: Tensor) -> Tensor:
    """The law (B, V) of a candidate drawn from ``proposal`` (B, V) without replacement after the tokens ``drawn``
    (B, j): the proposal without them, renormalized (all zeros where nothing is left: such a candidate is not tried).
    With it a tree's siblings drawn without replacement are tested as :func:`sibling_passes` tests any candidate, and
    a rejected one leaves :func:`residual_after_rejection` of this law (Sequoia's rule, lossless as SpecInfer's)."""
    rest = proposal.scatter(1, drawn, 0.0)
    left = rest.sum(dim=-1, keepdim=True)
    return rest / torch.where(left > 0, left, 1.0)


RHO_BISECTIONS = 30
"""Halvings of [1, k] when solving for SpecTr's rho: (k - 1) / 2^30 from the smallest valid rho."""


def spectr_rho(proposal: Tensor, target: Tensor, k: Tensor) -> Tensor:
    """SpecTr's rho (B,) for ``k`` (B,) i.i.d. candidates from ``proposal`` (B, V) and ``target`` (B, V): the smallest
    rho in [1, k] with sum min(rho p, q) >= 1 - (1 - beta)^k, beta = sum min(p, q / rho), the condition for the
    residual of :func:`spectr_residual` to be non-negative. The left side grows with rho and the right side falls,
    so the valid rhos form an interval [rho*, k], found by bisection; the upper end is returned (always valid)."""
    k = k.to(target.dtype).clamp(min=1)
    low, high = torch.ones_like(k), k.clone()
    for _ in range(RHO_BISECTIONS):
        middle = (low + high) / 2
        covered = torch.minimum(middle[:, None] * proposal, target).sum(dim=-1)  # rho * beta
        valid = covered >= 1 - (1 - covered / middle) ** k
        high, low = torch.where(valid, middle, high), torch.where(valid, low, middle)
    return high


def spectr_passes(uniform: Tensor, rho: Tensor, proposal: Tensor, target: Tensor) -> Tensor:
    """SpecTr's test of a candidate x: it passes with probability min(1, q(x) / (rho p(x))) (``proposal``: p(x),
    ``target``: q(x))."""
    return uniform * rho * proposal < target


def spectr_residual(proposal: Tensor, target: Tensor, rho: Tensor, k: Tensor) -> Tensor:
    """The law (B, V) of the token after k candidates that all failed SpecTr's test, unnormalized:
    q - min(p, q / rho) (1 - (1 - beta)^k) / beta, so that the accepted candidate or this token is distributed as q."""
    k = k.to(target.dtype)
    accepted = torch.minimum(proposal, target / rho[:, None])  # (B, V): the mass one candidate passes with
    beta = accepted.sum(dim=-1, keepdim=True)
    tries = torch.where(beta > 0, (1 - (1 - beta) ** k[:, None]) / beta.clamp(min=1e-30), k[:, None])
    residual = (target - accepted * tries).clamp_(min=0)
    # nothing left: the candidates could not all fail (probability 0), and the target is the law
    return torch.where(residual.sum(dim=-1, keepdim=True) <= 0, target, residual)


def typical_passes(target: Tensor, tokens: Tensor, epsilon: float, delta: float) -> Tensor:
    """Medusa's typical acceptance: head 1's probability of each token (..., after ``target`` (..., V)) exceeds
    min(epsilon, delta * exp(-entropy of target))."""
    entropy = -(target * target.clamp(min=1e-30).log()).sum(dim=-1)
    threshold = torch.clamp(delta * torch.exp(-entropy), max=epsilon)
    return target.gather(-1, tokens[..., None]).squeeze(-1) > threshold


def one_hot_law(tokens: Tensor, like: Tensor) -> Tensor:
    """The proposal (B, V) of a top-ranked draft ``tokens`` (B,): all its mass on the draft itself. Under it a draft
    passes with probability q(x) and, rejected, leaves q without x to resample from: lossless, as sampled drafts are."""
    return F.one_hot(tokens, like.size(-1)).to(like.dtype)


BOUNDED_TESTS = True
"""On CPU, a chain's drafts are tested against bounds on head 1's top-p probabilities (:func:`nucleus_passes`) rather
than its processed distributions, and only the law after the accepted drafts is processed (one per row); so is a
tree's first child at each node (the law after a node processed only once a try there fails, or the walk ends)."""


def nucleus_passes(
    logits: Tensor,
    tokens: Tensor,
    uniforms: Tensor,
    proposal: Tensor,
    present: Tensor,
    temperature: float,
    top_p: float,
) -> tuple[Tensor, Tensor]:
    """Which drafts ``tokens`` (B, D) pass :func:`accept_drafts` (``uniforms``, ``proposal``: their proposal
    probabilities, (B, D)) against q, head 1's distribution after temperature and top-p from ``logits`` (B, D, V),
    decided without finding any nucleus (which takes a sort of up to the whole vocabulary per distribution on CPU).
    With s the distribution before top-p and A(x) the mass of the tokens s makes likelier than x: x is in the nucleus
    iff A(x) < top_p (the nucleus is the likeliest tokens until their mass reaches top_p, ties kept whole), and then
    q(x) = s(x) / M with M, the nucleus' mass, between max(top_p, A(x) + s(x)) and 1. So a draft surely passes when it
    passes against s(x), and surely fails outside the nucleus or when it fails against s(x) / max(top_p, A(x) + s(x)).
    Returns the passes (B, D) and the rows (B,) where a test that decides the outcome (a verified draft after drafts
    that all surely pass) falls between the two (rare: the bounds are within a factor 1 / top_p): the caller processes
    those rows' distributions (each row's tests read only its own uniforms, so the others' outcomes stand).

    CPU tensors only, computed by NumPy: the tests are a few numbers per row, and each of PyTorch's CPU operations
    costs more than NumPy's on them."""
    sx, above = nucleus_bounds(logits, tokens, temperature)  # (B, D) each
    uniforms, proposal, present = uniforms.numpy(), proposal.float().numpy(), present.numpy()
    if top_p >= 1.0:  # q = s
        return torch.from_numpy(accept_drafts(uniforms, proposal, sx)), torch.zeros(len(sx), dtype=torch.bool)
    inside = above < top_p
    surely_passes = inside & accept_drafts(uniforms, proposal, sx)
    surely_fails = ~inside | ~accept_drafts(uniforms, proposal, sx / np.maximum(above + sx, top_p))
    undecided = ~(surely_passes | surely_fails) & present
    decisive = np.arange(sx.shape[1]) == np.cumprod(surely_passes, axis=1).sum(axis=1)[:, None]  # first not sure
    return torch.from_numpy(surely_passes), torch.from_numpy((undecided & decisive).any(axis=1))


def nucleus_bounds(logits: Tensor, tokens: Tensor, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """s(x) and A(x) (B, D) of :func:`nucleus_passes` for tokens x (B, D) and logits (B, D, V) on CPU: the probability
    of x after temperature, and the mass of the tokens likelier than x."""
    scaled = logits.detach().float().numpy() / np.float32(temperature)
    e = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
    mass = e.sum(axis=-1)
    ex = np.take_along_axis(e, tokens.numpy()[..., None], axis=-1)[..., 0]
    above = ((e > ex[..., None]) * e).sum(axis=-1)  # (NumPy's where is slower than this product)
    return ex / mass, above / mass


def accepted_prefix(passes: Tensor) -> Tensor:
    """How many leading entries of each row of ``passes`` (B, D) are true, (B,)."""
    return passes.long().cumprod(dim=1).sum(dim=1)


@dataclass(frozen=True)
class TreeVerification:
    """What a tree step gives its rule: head 1's logits (B, P, V) after the root and the nodes with children (``slot``
    (S,): each node's index among them, -1 for a leaf), ``after(nodes (B,)) -> (B, V)`` head 1's logits after any
    node, the step's inputs (B, S) (root, then nodes), and how deep each row verifies (B,)."""

    head1: Tensor
    slot: Tensor
    after: Callable[[Tensor], Tensor]
    inputs: Tensor
    tree: DraftTree
    live: Tensor


@dataclass(frozen=True)
class NodeLaws:
    """The laws a sampled tree's nodes were drawn from: ``probs`` (B, L, V) and, per node 1..N, the index of its law
    (``index`` (N,)); without an index node i's law is its depth's, ``probs[:, depth(i) - 1]`` (the heads draw every
    node of a depth from that depth's head; a draft model draws each node from its own context)."""

    probs: Tensor
    index: Tensor | None = None
    distinct: bool = False
    """Each node's children were drawn from their law without replacement (:func:`without_drawn` gives each one's)."""

    def of(self, nodes: Tensor, tree: DraftTree) -> Tensor:
        """(B, V) the law of node ``nodes[b]`` (B,) of each row (nodes >= 1)."""
        rows = torch.arange(nodes.size(0), device=nodes.device)
        return self.probs[rows, self.law_index(tree, nodes.device)[nodes]]

    def probability(self, nodes: Tensor, tokens: Tensor, tree: DraftTree) -> Tensor:
        """(B,) the probability node ``nodes[b]``'s law gives ``tokens[b]`` (nodes >= 1), without its (B, V) row."""
        rows = torch.arange(nodes.size(0), device=nodes.device)
        return self.probs[rows, self.law_index(tree, nodes.device)[nodes], tokens]

    def law_index(self, tree: DraftTree, device: torch.device) -> Tensor:
        """(N + 1,) the index in ``probs`` of each node's law (the root's: the first node's)."""
        if self.index is None:
            return tree.tensors(device)["depth_law"]
        return torch.cat([self.index[:1], self.index])


class Rule:
    """An acceptance rule. ``chain`` returns accepted draft counts (B,) and the next token (B,); ``tree`` the accepted
    depth (B,), the next token (B,) and the accepted path's node indices (B, depth + 1); ``first`` the token after a
    prompt (no drafts)."""

    name = "exact"
    samples_drafts = False
    """Drafts are drawn from their proposals (otherwise the top-ranked tokens are drafted)."""

    def __init__(self, sampling: GenerationConfig, layout: RandomLayout) -> None:
        self.sampling, self.layout = sampling, layout

    @classmethod
    def tests_per_step(cls, plan: Plan) -> int:
        """The uniforms this rule's tests read in a step of ``plan``: one per chain draft, or one per sibling a tree
        may try at each depth."""
        tree = plan.step_tree
        return plan.step_drafts if tree is None else sum(tree.max_children_at_depth())

    def target(self, logits: Tensor) -> Tensor:
        """The law autoregressive sampling draws from: head 1's distribution after temperature, top-k and top-p."""
        c = self.sampling
        return processed_probs(logits, c.temperature, c.top_k, c.top_p)

    def first(self, head1: Tensor, draws: Tensor | None) -> Tensor:
        return sample_from(self.target(head1), self.layout.next_token(draws))

    def chain(
        self, head1: Tensor, drafts: Tensor, live: Tensor, proposals: Tensor | None, draws: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def tree(
        self, step: TreeVerification, laws: NodeLaws | None, draws: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        raise NotImplementedError


def _deepest_path(passes: Tensor, step: TreeVerification) -> tuple[Tensor, Tensor]:
    """The deepest node (B,) whose path passes entirely (among equally deep ones the first, the highest-ranked) and
    its depth (B,), given which nodes pass their own test (B, S)."""
    tree, S = step.tree, step.inputs.size(1)
    t = tree.tensors(passes.device)
    depth, parent = t["depth"][:S], t["parent"][:S]
    ok = passes & (depth <= step.live[:, None])
    ok[:, 0] = True
    for d in range(1, tree.depth + 1):  # a node is accepted when it and its parent are
        nodes = slice(tree.nodes_up_to(d - 1) + 1, min(S, tree.nodes_up_to(d) + 1))
        ok[:, nodes] &= ok[:, parent[nodes]]
    score = torch.where(ok, depth * (S + 1) + (S - torch.arange(S, device=passes.device)), -1)
    best = score.argmax(dim=1)
    return best, depth[best]


def _parent_slot(step: TreeVerification) -> Tensor:
    """For each node (S,), the index in ``step.head1`` of head 1's logits after its parent."""
    parent = step.tree.tensors(step.inputs.device)["parent"][: step.inputs.size(1)]
    return step.slot[parent]


class Greedy(Rule):
    name = "greedy"  # whatever acceptance was asked: at temperature 0 no rule but head 1's argmax applies

    def first(self, head1, draws):
        return top_tokens(head1)

    def chain(self, head1, drafts, live, proposals, draws):
        choice = top_tokens(head1)  # (B, D + 1): head 1's token after the base and each draft
        present = torch.arange(drafts.size(1), device=drafts.device) < live[:, None]
        accepted = accepted_prefix((drafts == choice[:, :-1]) & present)
        return accepted, choice.gather(1, accepted[:, None]).squeeze(1)

    def tree(self, step, laws, draws):
        passes = step.inputs == top_tokens(step.head1)[:, _parent_slot(step)]
        best, depth = _deepest_path(passes, step)
        ancestors = step.tree.tensors(passes.device)["ancestors"]
        return depth, top_tokens(step.after(best)), ancestors[best]


class Typical(Rule):
    name = "typical"

    def passes(self, target: Tensor, tokens: Tensor) -> Tensor:
        return typical_passes(target, tokens, self.sampling.typical_epsilon, self.sampling.typical_delta)

    def chain(self, head1, drafts, live, proposals, draws):
        target = self.target(head1)  # (B, D + 1, V)
        present = torch.arange(drafts.size(1), device=drafts.device) < live[:, None]
        accepted = accepted_prefix(self.passes(target[:, :-1], drafts) & present)
        after = target.gather(1, accepted[:, None, None].expand(-1, 1, target.size(-1))).squeeze(1)
        return accepted, sample_from(after, self.layout.next_token(draws))

    def tree(self, step, laws, draws):
        passes = self.passes(self.target(step.head1)[:, _parent_slot(step)], step.inputs)
        best, depth = _deepest_path(passes, step)
        ancestors = step.tree.tensors(passes.device)["ancestors"]
        return depth, sample_from(self.target(step.after(best)), self.layout.next_token(draws)), ancestors[best]


class Lossless(Rule):
    samples_drafts = True

    def chain(self, head1, drafts, live, proposals, draws):
        D = drafts.size(1)
        rows = torch.arange(drafts.size(0), device=drafts.device)
        present = torch.arange(D, device=drafts.device) < live[:, None]
        if proposals is None:  # top-ranked drafts: each draft's proposal is the draft itself (one-hot)
            p = torch.ones(drafts.shape, device=drafts.device)
        else:
            p = proposals[:, :D].gather(-1, drafts[..., None]).squeeze(-1)  # (B, D) each draft's proposal probability
        uniforms, c = self.layout.acceptance(draws, 0, D), self.sampling
        passes, target = None, None
        if BOUNDED_TESTS and head1.device.type == "cpu" and not (c.top_k and c.top_k < head1.size(-1)):
            passes, unsure = nucleus_passes(head1[:, :D], drafts, uniforms, p, present, c.temperature, c.top_p)
            if unsure.any():  # those rows' distributions processed, and their drafts tested against them
                at = unsure.nonzero()[:, 0]
                q = self.target(head1[at, :D]).gather(-1, drafts[at, :, None]).squeeze(-1)
                passes[at] = accept_drafts(uniforms[at], p[at], q)
        if passes is None:  # every distribution processed, as on other devices
            target = self.target(head1)  # (B, D + 1, V)
            q = target[:, :D].gather(-1, drafts[..., None]).squeeze(-1)  # (B, D) target probability of each draft
            passes = accept_drafts(uniforms, p, q)
        accepted = accepted_prefix(passes & present)
        # head 1's law after the accepted drafts: one processed distribution per row
        after = target[rows, accepted] if target is not None else self.target(head1[rows, accepted])  # (B, V)
        first_rejected = accepted.clamp(max=D - 1)
        if proposals is None:
            p_first_rejected = one_hot_law(drafts[rows, first_rejected], after)
        else:
            p_first_rejected = proposals[rows, first_rejected]  # (B, V)
        law = correction_probs(after, p_first_rejected, accepted < live)
        return accepted, sample_from(law, self.layout.next_token(draws))

    def tree(self, step, laws, draws):
        tree, inputs, c = step.tree, step.inputs, self.sampling
        B, S = inputs.shape
        rows = torch.arange(B, device=inputs.device)
        t = tree.tensors(inputs.device)
        depth, slot = t["depth"][:S], step.slot
        in_step = (t["children"][:S] > 0) & (t["children"][:S] < S)  # (S, J): node i's j-th child is among the inputs
        children = torch.where(in_step, t["children"][:S], 0)
        verified = depth <= step.live[:, None]  # (B, S)
        # on CPU, where reading a flag costs nothing, a try no row makes is skipped, and so is a law no row reads; and a
        # first child's test is decided from bounds on head 1's law where they decide it (:func:`nucleus_passes`), so
        # that a law is processed only where a try fails or the walk ends (one per row, mostly)
        skips = inputs.device.type == "cpu"
        bounded = skips and BOUNDED_TESTS and not (c.top_k and c.top_k < step.head1.size(-1))

        def head1_after(nodes: Tensor) -> Tensor:  # (B, V) head 1's logits after each row's node (one with children)
            return step.head1[rows, slot[nodes].clamp(min=0)]

        def law_after(nodes: Tensor) -> Tensor:  # (B, V) head 1's processed law after each row's node: one per row
            return self.target(head1_after(nodes))

        def settled(remaining: Tensor | None, fresh: Tensor, node: Tensor) -> Tensor:  # fresh rows' laws processed
            law = law_after(node)
            return law if remaining is None else torch.where(fresh[:, None], law, remaining)

        node = torch.zeros(B, dtype=torch.long, device=inputs.device)
        # the target after the current node, rejected siblings removed; with bounds, processed only when read: `fresh`
        # (B,) marks the rows whose law after their node is not processed yet (None: none)
        fresh = torch.ones(B, dtype=torch.bool, device=inputs.device) if bounded else None
        remaining = None if bounded else law_after(node)
        descending = torch.ones(B, dtype=torch.bool, device=inputs.device)
        test = 0
        for tries in tree.max_children_at_depth():
            if skips and not descending.any():
                break
            moved = torch.zeros_like(descending)
            for j in range(tries):
                child = children[node, j]
                trying = descending & ~moved & in_step[node, j] & verified[rows, child]
                if skips and not trying.any():  # no row tries this sibling: nothing changes but the test's index
                    test += 1
                    continue
                token, uniform = inputs[rows, child], self.layout.acceptance(draws, test)[:, 0]
                if fresh is not None:
                    drawn = laws.probability(child, token, tree) if laws is not None else torch.ones_like(uniform)
                    if j == 0 and self._surely_pass(head1_after(node), token, uniform, drawn, trying):
                        node, moved, test = torch.where(trying, child, node), moved | trying, test + 1
                        continue  # every row that tried passes whatever its law is: the law stays unprocessed
                    remaining, fresh = settled(remaining, fresh, node), None
                # (B, V) what this child was drawn from; a top-ranked node's proposal is the node itself (one-hot)
                proposal = laws.of(child, tree) if laws is not None else one_hot_law(token, remaining)
                distinct = j > 0 and laws is not None and laws.distinct  # drawn after its elder siblings, all failed
                if distinct:
                    proposal = without_drawn(proposal, inputs[rows[:, None], children[node, :j]])
                q = remaining.gather(1, token[:, None]).squeeze(1)
                p = proposal.gather(1, token[:, None]).squeeze(1)
                if distinct:
                    trying = trying & (p > 0)  # a child drawn after its law ran out is not a candidate
                passes = sibling_passes(uniform, remaining, q, p)
                rejected = trying & ~passes
                if not skips or rejected.any():  # a row's target changes only when its try fails
                    remaining = residual_after_rejection(remaining, proposal, rejected)
                node = torch.where(trying & passes, child, node)
                moved |= trying & passes
                test += 1
            descending = moved
            # rows that moved start afresh after their new node; the others keep what is left of their target
            if bounded:
                fresh = moved if fresh is None else fresh | moved
            elif not skips or descending.any():
                remaining = torch.where(descending[:, None], law_after(node), remaining)
        # a row that ended at a leaf takes its bonus token from head 1 after that leaf
        at_leaf = slot[node] < 0
        if fresh is not None and (fresh & ~at_leaf).any():
            remaining = settled(remaining, fresh & ~at_leaf, node)
        if not skips or at_leaf.any():
            leaf_law = self.target(step.after(node))
            remaining = leaf_law if remaining is None else torch.where(at_leaf[:, None], leaf_law, remaining)
        return depth[node], sample_from(remaining, self.layout.next_token(draws)), t["ancestors"][node]

    def _surely_pass(self, logits: Tensor, token: Tensor, uniform: Tensor, p: Tensor, trying: Tensor) -> bool:
        """Whether every row ``trying`` a node's first child, ``token`` (B,) drawn with probability ``p`` (B,), passes
        its test against head 1's law after the node (``logits`` (B, V); nothing rejected there yet), decided from
        bounds on that law's top-p probabilities alone (as :func:`nucleus_passes` decides a chain's): it surely passes
        when it passes against s(x) inside the nucleus. False when a row may fail: the caller then processes the law."""
        sx, above = nucleus_bounds(logits, token, self.sampling.temperature)  # (B,) each
        passes = (above < self.sampling.top_p) & accept_drafts(uniform.numpy(), p.float().numpy(), sx)
        return bool((passes | ~trying.numpy()).all())


class SpecTr(Lossless):
    """SpecTr's k-sequential selection on a tree's candidates; a chain (one candidate per depth) is Lossless's."""

    name = "spectr"

    @classmethod
    def tests_per_step(cls, plan: Plan) -> int:
        """One per node of a tree: every node of a depth may be a candidate."""
        tree = plan.step_tree
        return plan.step_drafts if tree is None else tree.size

    def tree(self, step, laws, draws):
        tree, inputs = step.tree, step.inputs
        B, S = inputs.shape
        rows = torch.arange(B, device=inputs.device)
        t = tree.tensors(inputs.device)
        depth, parent, slot = t["depth"][:S], t["parent"][:S], step.slot
        node = torch.zeros(B, dtype=torch.long, device=inputs.device)  # the deepest accepted node
        agrees = torch.zeros(B, S, dtype=torch.bool, device=inputs.device)  # nodes whose tokens are the accepted ones
        agrees[:, 0] = True
        descending = torch.ones(B, dtype=torch.bool, device=inputs.device)
        rejected = torch.zeros_like(descending)
        law = None  # the residual of rows whose every candidate failed
        for first, last in tree.depth_nodes():
            nodes = torch.arange(first + 1, min(last, S - 1) + 1, device=inputs.device)
            if not len(nodes):
                break
            tokens = inputs[:, nodes]  # (B, n)
            # the candidates: nodes of this depth below a node that agrees with the accepted prefix, all drawn from
            # one law (the children of equal prefixes: their parent's), verified by this row
            candidates = agrees[:, parent[nodes]] & (depth[nodes] <= step.live[:, None]) & descending[:, None]
            k = candidates.sum(dim=1)
            present = k > 0
            first_candidate = nodes[candidates.long().argmax(dim=1)]
            proposal = laws.of(first_candidate, tree)  # (B, V)
            target = self.target(step.head1[rows, slot[node].clamp(min=0)])  # after the accepted node
            rho = spectr_rho(proposal, target, k)
            uniforms = self.layout.acceptance(draws, first, len(nodes))
            p, q = proposal.gather(1, tokens), target.gather(1, tokens)
            passes = candidates & spectr_passes(uniforms, rho[:, None], p, q)
            moved = passes.any(dim=1)
            chosen = nodes[passes.long().argmax(dim=1)]
            failed = present & ~moved
            if failed.any():
                residual = spectr_residual(proposal, target, rho, k)
                law = residual if law is None else torch.where(failed[:, None], residual, law)
            rejected |= failed
            token = inputs[rows, chosen]
            agrees = torch.zeros_like(agrees)
            agrees[:, nodes] = candidates & (tokens == token[:, None]) & moved[:, None]
            node = torch.where(moved, chosen, node)
            descending = moved
        # rows that stopped without a failed test (no candidate left, or past the deepest node): head 1 after the node
        after = self.target(step.after(node))
        law = after if law is None else torch.where(rejected[:, None], law, after)
        return depth[node], sample_from(law, self.layout.next_token(draws)), t["ancestors"][node]


NO_DRAWS = Draws()
"""A rule alone: no proposer's uniforms beside its own."""


def rule_for(plan: Plan, draws: Draws = NO_DRAWS) -> Rule:
    """The rule ``plan`` decodes with: greedy at temperature 0 (whatever ``acceptance`` says), else its
    ``acceptance``; its uniforms laid out beside the ``draws`` its proposer declares (none by default: a rule alone)."""
    rules = {"typical": Typical, "spectr": SpecTr, "exact": Lossless}
    sampling = plan.sampling
    rule = Greedy if sampling.greedy else rules[sampling.acceptance]
    return rule(sampling, RandomLayout.of(rule.tests_per_step(plan), draws))
