"""Proposers: who drafts the tokens a decoding step verifies, behind one interface (:class:`Proposer`).

- :class:`HeadsProposer` (``method="heads"``): the target's own heads 2..k (self-speculative decoding). Their drafts
  come out of the step's own forward (verify and predict merged, as in blockwise parallel decoding, Stern et al.
  2018): every head's outputs after each row's last accepted input become the next drafts, a chain (causal heads
  draft one depth after another, :class:`mtp.decode.inference.CausalChain`) or a tree's nodes.
- :class:`ModelDrafter` (``method="draft"``): speculative sampling with a separate, smaller model on the same
  tokenizer (Leviathan et al. 2023; Chen et al. 2023). It drafts gamma tokens autoregressively on its own KV cache,
  which follows the accepted tokens: after a step it keeps the drafts it had read that the target accepted, and
  reads what it has not seen (the token after them) at the start of its next proposal.
- :func:`layer_skip_drafter` (``method="layerskip"``): the target itself with some blocks of head 1's path, or some of
  their attention and MLP sublayers, skipped (Draft & Verify, Zhang et al. 2023), drafting with head 1 on its own
  cache; it shares the target's packed weights (with ``draft_dtype="int8"``, int8 copies of the blocks it runs and of
  its unembedding).
- :class:`LookupDrafter` (``method="lookup"``): prompt lookup decoding (Saxena 2023): the tokens that followed
  the latest earlier occurrence of the sequence's last n-gram (n from ``ngram`` down to 1), in the prompt or the
  output so far; a continuation that reaches the end of the sequence goes on as an overlapping copy does (the
  sequence repeats with the match's period), so repetitive text drafts gamma tokens, not one. No model; its
  proposal is the drafted token itself (one-hot), so sampling stays lossless.

Sampling with lossless acceptance: a draft is drawn from the proposer's processed distribution p (temperature and
top-k as the target, top-p too with ``draft_choice="sampled"``; not with ``tempered``, auto's for heads on CPU) and p is
returned with it; otherwise (greedy, typical acceptance, ``draft_choice="top"``) the top-ranked tokens are drafted and
no distribution is returned. With ``draft_dtype="int8"`` the heads and the model drafters compute their
logits with int8 matrices (:mod:`mtp.decode.int8`), and p is the distribution of those logits, the one the drafts are
drawn from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor

from mtp.decode.acceptance import Greedy, Lossless, RandomLayout
from mtp.decode.inference import (
    ATTENTION,
    FEED_FORWARD,
    InferenceModel,
    SkippingForm,
    Sublayer,
    skip_label,
    sublayers_of,
)
from mtp.decode.lookup import LookupDrafter, lookup_continuation
from mtp.decode.proposal import DEFAULT_GAMMA, Proposal, Proposer
from mtp.decode.sampling import (
    Draws,
    RowUniforms,
    processed_probs,
    sample_distinct,
    sample_from,
    sample_many,
    top_tokens,
)
from mtp.decode.settings import Drafted, GenerationConfig
from mtp.errors import SettingError
from mtp.model import MTPModel


class HeadsProposer(Proposer):
    """Heads 2..k of the target: a chain of ``heads - 1`` drafts, or ``config.tree``'s nodes (the nodes at depth d are
    head d + 1's top-ranked tokens, or drawn from its proposal when sampling: each node's children without replacement
    (``sibling_draws="distinct"``) or every node independently). ``draft_p_min`` cuts a row's chain (tree) before the
    first draft (depth) whose head's top probability is below it."""

    method = "heads"

    def __init__(self, inference: InferenceModel, config: Drafted, beside: bool = False) -> None:
        # beside a drafter (a hybrid step) the heads draft their own chain of heads - 1, one branch of the step's tree
        self.inference, self.beside = inference, beside
        self.drafts = config.heads - 1 if beside else config.drafts

    def draws(self, plan: Drafted) -> Draws:
        """One per draft head (their chain's), and one per node of the tree they draft (none beside a drafter)."""
        tree = None if self.beside else plan.step_tree
        return Draws(heads_chain=plan.heads - 1, heads_tree=tree.size if tree is not None else 0)

    def method_params(self) -> dict[str, str]:
        return {}

    def start(self, prompts: list[list[int]], max_len: int, config: Drafted | None = None) -> None:
        super().start(prompts, max_len, config)
        self.pending: Proposal | None = None

    def draft_in_step(self, hidden, cache, last, inputs, next_token, draws):
        config, B = self.config, inputs.size(0)
        tree = None if self.beside else config.step_tree  # in a hybrid step the heads draft one chain of the tree
        if config.heads == 1:
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
        if config.draft_p_min > 0:
            if self.sampled:
                confidence = draft_probs.amax(dim=-1)  # (B, heads - 1)
            else:
                drafting = heads_logits[: self.drafts]
                probs = drafting.float().softmax(-1) if config.greedy else self.processed(drafting)
                confidence = probs.amax(dim=-1).T
            live = (confidence[:, : self.drafts] >= config.draft_p_min).long().cumprod(dim=1).sum(dim=1)
        else:
            live = torch.full((B,), self.drafts, dtype=torch.long, device=inputs.device)
        if tree is not None and config.distinct_siblings:  # each node's children drawn without replacement
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
        self.pending = Proposal(drafts, draft_probs, live, distinct=tree is not None and config.distinct_siblings)
        return live

    def processed(self, logits: Tensor) -> Tensor:
        """The law a head's draft is sampled from: its distribution after the target's temperature and top-k, and its
        top-p unless the drafts are tempered (:meth:`Drafted.proposal_top_p`)."""
        config = self.config
        return processed_probs(logits, config.temperature, config.top_k, config.proposal_top_p(logits.device))

    def keep_rows(self, rows: list[int], index: Tensor) -> None:
        self.pending = self.pending.rows(index, rows)

    def propose(self, gamma: int, draws: Tensor | None) -> Proposal:
        return self.pending


class ModelDrafter(Proposer):
    """Autoregressive drafting with head 1 of an inference form (a draft model's, or the target's with blocks
    skipped) on a KV cache of its own; ``config.draft_dtype`` picks the form's precision at each ``start`` (its int8
    copy is built once). With ``drafts_per_step`` k > 1 it drafts k independent sequences (SpecTr's draft sequences:
    k samples, or greedily the k likeliest first tokens each continued greedily), on k copies of each row's cache made
    for the proposal, and the step verifies them as the tree of k chains."""

    beside_heads = True

    def __init__(
        self,
        form: InferenceModel | SkippingForm,
        method: str = "draft",
        params: dict[str, str] | None = None,
        gamma: int = DEFAULT_GAMMA,
    ) -> None:
        self.form, self.method, self._params, self.gamma = form, method, params or {}, gamma
        self.device = form.embeddings.device
        self.context = form.config.max_seq_len

    def params(self) -> dict[str, str]:
        return self._params

    def start(self, prompts: list[list[int]], max_len: int, config: Drafted | None = None) -> None:
        super().start(prompts, max_len, config)
        if max_len > self.context:
            raise SettingError(
                f"the draft model's context ({self.context} tokens) is below the {max_len} decoding needs; shorten "
                "the prompt or lower {max_new_tokens:name}.",
                max_new_tokens=config.max_new_tokens if config is not None else None,
            )
        int8 = config is not None and config.draft_dtype == "int8"
        self.drafting = self.form.int8_drafter() if int8 else self.form
        self.cache = self.drafting.new_cache(len(prompts), max_len)
        self.unread = [list(p) for p in prompts]  # tokens of each row not in the cache yet
        self.held = [0] * len(prompts)  # cache positions that hold accepted tokens
        self.read_drafts = [0] * len(prompts)  # drafts the last proposal read into each row's cache
        self.forwards = 0
        self.branches = config.drafts_per_step if config is not None else 1
        # a step that verifies a tree (k chains, or a hybrid's) keeps none of the drafts read: which chain the accepted
        # tokens came from is not known here
        self.tree = config.step_tree if config is not None else None

    def advance(self, accepted: list[int], emitted: list[list[int]]) -> None:
        # the drafts read that the target accepted stay
        kept = [min(n, read) for n, read in zip(accepted, self.read_drafts, strict=True)]
        self.held = [h + n for h, n in zip(self.held, kept, strict=True)]
        self.unread = [unread + tokens[n:] for unread, tokens, n in zip(self.unread, emitted, kept, strict=True)]
        self.cache.rollback(self.held)

    def keep_rows(self, rows: list[int], index: Tensor) -> None:
        self.cache.keep_rows(rows)
        self.unread = [self.unread[r] for r in rows]
        self.held = [self.held[r] for r in rows]
        self.read_drafts = [self.read_drafts[r] for r in rows]

    def propose(self, gamma: int, draws: Tensor | None) -> Proposal:
        tokens, probs = self.draft_chains(gamma if self.tree is None else self.gamma, draws)
        counts = [gamma] * tokens.size(0)
        if self.tree is None:
            return Proposal(tokens, probs, counts=counts)
        order = torch.tensor(self.tree.branch_order(), device=self.device)
        return Proposal(tokens[:, order], probs, counts=counts, law_index=order)

    def draft_chains(self, gamma: int, draws: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """``drafts_per_step`` chains of ``gamma`` drafts per row, chain after chain (B, k gamma), and the law each
        draft was drawn from (B, k gamma, V) when sampling (chain i's draft j with ``draws[:, i gamma + j]``)."""
        form, cache, config, k = self.drafting, self.cache, self.config, self.branches
        widths = [len(tokens) for tokens in self.unread]
        width = max(widths)
        inputs = torch.tensor([t + [0] * (width - len(t)) for t in self.unread], device=self.device)
        last = torch.tensor(widths, device=self.device)[:, None] - 1
        cache.begin(width)
        logits = form.verify(inputs, cache, last)[0][:, 0]  # (B, V) after each row's last unread token
        cache.commit(width)
        self.held = [h + w for h, w in zip(self.held, widths, strict=True)]
        cache.rollback(self.held)  # drop the padding
        self.unread = [[] for _ in widths]
        B = len(widths)
        branches = cache.repeated(k) if k > 1 else cache  # (B k) rows: row b's chain i at b k + i
        if k > 1:
            logits = logits.repeat_interleave(k, dim=0)
            if self.sampled:  # chain i's draft j: draws[:, i gamma + j]
                draws = draws[:, : k * gamma].reshape(B, k, gamma).reshape(B * k, gamma)
        drafts, proposals = [], []
        for j in range(gamma):
            if j:
                branches.begin(1)
                logits = form.verify(drafts[-1][:, None], branches)[0][:, 0]
                branches.commit(1)
            if self.sampled:
                top_p = config.proposal_top_p(logits.device, heads=False)
                proposals.append(processed_probs(logits, config.temperature, config.top_k, top_p))
                drafts.append(sample_from(proposals[-1], draws[:, j]))
            elif j == 0 and k > 1:  # greedy chains start from the k likeliest tokens
                drafts.append(logits.view(B, k, -1)[:, 0].topk(k, dim=-1).indices.reshape(B * k))
            else:
                drafts.append(top_tokens(logits))
        self.forwards += gamma
        self.read_drafts = [gamma - 1 if self.tree is None else 0] * B
        if self.tree is not None and k == 1:
            cache.rollback(self.held)  # the drafts read are not kept (see start)
        tokens = torch.stack(drafts, dim=1).view(B, k * gamma)
        probs = torch.stack(proposals, dim=1).view(B, k * gamma, -1) if self.sampled else None
        return tokens, probs


STAGED_SEED_OFFSET = 1_000_003
"""A staged drafter's own uniforms come from generators seeded seed + this + row: apart from the step's."""


class StagedDrafter(ModelDrafter):
    """Staged speculative decoding (Spector & Re 2023): a draft model whose own gamma drafts are decoded
    speculatively, from prompt lookup over the row's tokens (``inner="lookup"``) or from the draft model's own heads
    (``inner="heads"``, a draft trained as mtp2 or mtp4), verified by the draft's head 1 with the exact rules (greedy,
    or lossless sampling). The drafts are then exactly the draft model's autoregressive ones (greedy), or distributed
    as them (sampling), in fewer draft forwards, and the law of each is the draft's head-1 distribution after the ones
    before it: what the target's step verifies them against."""

    method = "staged"
    draws_drafts = False  # the inner step's exact rules draw them

    def __init__(self, form: InferenceModel, inner: str, ngram: int = 3, gamma: int = DEFAULT_GAMMA) -> None:
        if inner not in ("lookup", "heads"):
            raise ValueError(f"inner={inner!r} must be lookup or heads")
        if inner == "heads" and form.heads < 2:
            raise ValueError("a staged draft that drafts with its heads needs a draft model with more than one head")
        super().__init__(form, "staged", {"inner": inner}, gamma)
        self.inner, self.ngram = inner, ngram

    def start(self, prompts: list[list[int]], max_len: int, config: Drafted | None = None) -> None:
        config = config or Drafted.of(GenerationConfig(), gamma=self.gamma)
        if config.drafts_per_step > 1:
            raise SettingError(
                "a staged draft decodes one sequence of its own; use {drafts_per_step:1} with it.",
                drafts_per_step=config.drafts_per_step,
            )
        if not config.greedy and config.draft_choice in ("top", "tempered"):
            raise SettingError(
                "a staged draft samples its drafts as the draft model would, and {draft_choice} asks for other ones; "
                "use {draft_choice:auto} with it.",
                draft_choice=config.draft_choice,
            )
        super().start(prompts, max_len, config)
        self.sequence = [list(p) for p in prompts]  # each row's accepted tokens: what lookup searches
        heads = self.form.heads if self.inner == "heads" else 1
        inner = replace(
            config, heads=heads, gamma=0, tree=None, acceptance="exact", draft_p_min=0.0, adaptive_drafts=False
        )
        width = heads - 1 if self.inner == "heads" else self.gamma  # drafts an inner step verifies at most
        self.heads = HeadsProposer(self.drafting, inner) if self.inner == "heads" else None
        layout = RandomLayout.of(width, self.heads.draws(inner) if self.heads is not None else Draws())
        self.rule = Greedy(inner, layout) if inner.greedy else Lossless(inner, layout)
        if self.heads is not None:
            self.heads.lay_out(layout)
            self.heads.start(prompts, max_len, inner)
        steps = (config.max_new_tokens + 1) * (self.gamma + 1)  # inner steps: each emits a token at least
        self.uniforms = None
        if self.sampled:
            seed = config.seed + STAGED_SEED_OFFSET
            self.uniforms = RowUniforms(seed, len(prompts), steps, layout.per_step, self.device)

    def advance(self, accepted: list[int], emitted: list[list[int]]) -> None:
        super().advance(accepted, emitted)
        for sequence, tokens in zip(self.sequence, emitted, strict=True):
            sequence.extend(tokens)

    def keep_rows(self, rows: list[int], index: Tensor) -> None:
        super().keep_rows(rows, index)
        self.sequence = [self.sequence[r] for r in rows]
        if self.uniforms is not None:
            self.uniforms.keep_rows(index)

    def draft_chains(self, gamma: int, draws: Tensor | None) -> tuple[Tensor, Tensor | None]:
        form, cache, rule, B = self.drafting, self.cache, self.rule, len(self.unread)
        out: list[list[int]] = [[] for _ in range(B)]
        laws: list[list[Tensor]] = [[] for _ in range(B)]
        pending: list[list[int]] = [[] for _ in range(B)]  # inner drafts each row verifies next
        pending_laws: Tensor | None = None  # (B, drafts, V) their proposals, when sampled
        first_held = [h + len(u) for h, u in zip(self.held, self.unread, strict=True)]  # once the unread are read
        while min(map(len, out)) < gamma:
            widths = [len(u) + len(d) for u, d in zip(self.unread, pending, strict=True)]
            width, most = max(widths), max(map(len, pending))
            inputs = torch.tensor(
                [u + d + [0] * (width - len(u) - len(d)) for u, d in zip(self.unread, pending, strict=True)],
                device=self.device,
            )
            base = torch.tensor([len(u) - 1 for u in self.unread], device=self.device)  # each row's last read token
            read = base[:, None] + torch.arange(most + 1, device=self.device)  # after it and each inner draft
            cache.begin(width)
            head1, hidden = form.verify(inputs, cache, read.clamp(max=width - 1))  # (B, most + 1, V)
            inner_draws = self.uniforms.next(rule.layout.per_step) if self.uniforms is not None else None
            if most:
                positions = base[:, None] + 1 + torch.arange(most, device=self.device)
                drafts = inputs.gather(1, positions.clamp(max=width - 1))
                live = torch.tensor([len(d) for d in pending], device=self.device)
                accepted, token = rule.chain(head1, drafts, live, pending_laws, inner_draws)
            else:
                accepted, token = torch.zeros_like(base), rule.first(head1[:, 0], inner_draws)
            target = rule.target(head1) if self.sampled else None  # the draft's law after each read position
            if self.heads is not None:
                self.heads.draft_in_step(hidden, cache, base + accepted, inputs, token, inner_draws)
            cache.commit(width)
            self.forwards += 1
            host = torch.stack([accepted, token], dim=1).tolist()
            next_drafts = self.heads.pending.tokens.tolist() if self.heads is not None else None
            for b, (a, t) in enumerate(host):
                if len(out[b]) >= gamma:  # a row with its drafts waits for the others: nothing of this step stays
                    pending[b] = []
                    continue
                emitted = pending[b][:a] + [t]
                out[b] += emitted
                if target is not None:
                    laws[b] += list(target[b, : a + 1])
                self.held[b] += len(self.unread[b]) + a  # the read tokens and the accepted inner drafts
                self.unread[b] = [t]
                if next_drafts is not None:
                    pending[b] = next_drafts[b]
                else:
                    pending[b] = lookup_continuation(self.sequence[b] + out[b], self.ngram, gamma)
            cache.rollback(self.held)
            if self.heads is not None:
                pending_laws = self.heads.pending.probs
            elif self.sampled:
                most = max(map(len, pending))
                padded = [d + [0] * (most - len(d)) for d in pending]  # long even when every row found nothing
                padded = torch.tensor(padded, dtype=torch.long, device=self.device)
                pending_laws = F.one_hot(padded.view(B, most), form.vocab_size).float()  # a lookup draft: itself
        # keep in the cache what the step may accept of the drafts (the first gamma - 1), as a chain drafter does
        self.read_drafts = [min(len(o) - 1, gamma - 1) for o in out]
        self.held = first_held  # as a chain drafter leaves it: the drafts read are counted once accepted (advance)
        cache.rollback([h + r for h, r in zip(first_held, self.read_drafts, strict=True)])
        self.unread = [[] for _ in range(B)]
        tokens = torch.tensor([o[:gamma] for o in out], device=self.device)
        probs = torch.stack([torch.stack(row[:gamma]) for row in laws]) if self.sampled else None
        return tokens, probs


class HybridProposer(Proposer):
    """A drafter's chains and the target's own heads' chain, verified as one tree (``config.step_tree``: the drafter's
    ``drafts_per_step`` chains of gamma, then the heads' chain of heads - 1 as one more branch from the root). The heads
    cost nothing to draft (they come out of the step's own forward), so where the drafter's first token is wrong the
    heads' may still be right, and the other way round. The drafter is a model (:class:`ModelDrafter`) or prompt
    lookup (:class:`LookupDrafter`: where the text repeats itself it drafts further than heads can, elsewhere the
    heads draft)."""

    method = "hybrid"

    def __init__(self, drafter: ModelDrafter | LookupDrafter, heads: HeadsProposer) -> None:
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

    def draws(self, plan: Drafted) -> Draws:
        return self.drafter.draws(plan) + self.heads.draws(plan)

    def lay_out(self, layout: RandomLayout) -> None:
        super().lay_out(layout)
        self.drafter.lay_out(layout)
        self.heads.lay_out(layout)

    @property
    def forwards(self) -> int:  # type: ignore[override]
        return self.drafter.forwards

    def start(self, prompts: list[list[int]], max_len: int, config: Drafted | None = None) -> None:
        assert config is not None and config.hybrid, "a hybrid proposer drafts with a drafter and the heads"
        super().start(prompts, max_len, config)
        self.drafter.start(prompts, max_len, config)
        self.heads.start(prompts, max_len, config)
        self.order = torch.tensor(config.step_tree.branch_order(), device=self.drafter.device)

    def draft_in_step(self, hidden, cache, last, inputs, next_token, draws):
        self.heads.draft_in_step(hidden, cache, last, inputs, next_token, draws)
        return torch.full((inputs.size(0),), self.config.drafts, dtype=torch.long, device=inputs.device)

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
        counts = [self.config.drafts] * tokens.size(0)
        return Proposal(tokens, probs, counts=counts, law_index=self.order if probs is not None else None)


def proposer_for(drafter: Proposer | None, inference: InferenceModel, config: Drafted) -> Proposer:
    """Who drafts a step of ``config`` on the target's ``inference`` form: its heads, ``drafter``, or both in a hybrid
    step (a drafter with ``heads`` above 1)."""
    if drafter is None:
        return HeadsProposer(inference, config)
    if not config.hybrid:
        return drafter
    return HybridProposer(drafter, HeadsProposer(inference, config, beside=True))


def draft_model_drafter(draft: MTPModel, compile: bool = False, gamma: int = DEFAULT_GAMMA) -> ModelDrafter:
    """Speculative sampling with ``draft`` (head 1 of any mtp model on the target's tokenizer), ``gamma`` drafts a
    step."""
    return ModelDrafter(InferenceModel.of(draft, 1, compile), "draft", gamma=gamma)


def staged_drafter(draft: MTPModel, inner: str, compile: bool = False, gamma: int = DEFAULT_GAMMA) -> StagedDrafter:
    """Staged speculative decoding with ``draft``, its own drafts from prompt lookup (``inner="lookup"``) or from its
    heads (``inner="heads"``: all of them), ``gamma`` drafts a step."""
    heads = draft.config.n_future if inner == "heads" else 1
    return StagedDrafter(InferenceModel.of(draft, heads, compile), inner, gamma=gamma)


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
