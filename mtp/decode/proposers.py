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
  cache; it shares the target's packed weights.
- :class:`LookupDrafter` (``method="lookup"``): prompt lookup decoding (Saxena 2023): the tokens that followed
  the latest earlier occurrence of the sequence's last n-gram (n from ``ngram`` down to 1), in the prompt or the
  output so far; a continuation that reaches the end of the sequence goes on as an overlapping copy does (the
  sequence repeats with the match's period), so repetitive text drafts gamma tokens, not one. No model; its
  proposal is the drafted token itself (one-hot), so sampling stays lossless.

Sampling with lossless acceptance: a draft is drawn from the proposer's processed distribution p (temperature, top-k,
top-p as the target) and p is returned with it; otherwise (greedy, typical acceptance) the top-ranked tokens are
drafted and no distribution is returned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from mtp.decode.acceptance import RandomLayout
from mtp.decode.cache import KVCache
from mtp.decode.inference import ATTENTION, FEED_FORWARD, InferenceModel, Sublayer, skip_label, sublayers_of
from mtp.decode.sampling import processed_probs, sample_from, sample_many
from mtp.decode.settings import GenerationConfig, SettingError
from mtp.model import MTPModel


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

    def rows(self, index: Tensor, rows: list[int]) -> Proposal:
        """This proposal for the rows ``index`` (``rows`` on the host) only."""
        return Proposal(
            self.tokens[index],
            None if self.probs is None else self.probs[index],
            None if self.live is None else self.live[index],
            None if self.counts is None else [self.counts[r] for r in rows],
        )


class Proposer:
    """What :func:`~mtp.decode.generate.generate` asks of a proposer. Rows are the live rows of the batch, in order.

    ``start(prompts, max_len, config)``; then per step: ``draft_in_step`` during the target's forward (for drafts that
    come out of it), ``keep_rows`` when rows finish, ``advance(accepted, emitted)`` (what the target accepted of the
    last proposal, and the tokens each row emitted: the accepted drafts and the token after them), and ``propose``.
    """

    method: str
    """How the drafts are made, for the statistics: ``heads`` (the target's), ``draft`` (a draft model), ``layerskip``
    (the target with blocks skipped), ``lookup`` (prompt lookup)."""
    forwards = 0
    """Forwards the proposer's own model ran (0 without one)."""
    context: int | None = None
    """The most positions its model holds (None: no model of its own, no limit)."""

    def params(self) -> dict[str, str]:
        """The method's parameters, for the statistics line."""
        return {}

    def start(self, prompts: list[list[int]], max_len: int, config: GenerationConfig | None = None) -> None:
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


class HeadsProposer(Proposer):
    """Heads 2..k of the target: a chain of ``heads - 1`` drafts, or ``config.tree``'s nodes (the nodes at depth d are
    head d + 1's top-ranked tokens, or drawn from its proposal independently when sampling). ``draft_p_min`` cuts a
    row's chain (tree) before the first draft (depth) whose head's top probability is below it."""

    method = "heads"

    def __init__(self, inference: InferenceModel, config: GenerationConfig) -> None:
        self.inference, self.layout, self.drafts = inference, RandomLayout.of(config), config.drafts

    def start(self, prompts: list[list[int]], max_len: int, config: GenerationConfig | None = None) -> None:
        super().start(prompts, max_len, config)
        self.pending: Proposal | None = None

    def draft_in_step(self, hidden, cache, last, inputs, next_token, draws):
        config, tree, B = self.config, self.config.tree, inputs.size(0)
        if config.heads == 1:
            live = torch.zeros(B, dtype=torch.long, device=inputs.device)
            self.pending = Proposal(inputs.new_empty(B, 0), None, live)
            return live
        logits, proposals = [], []

        def top_tokens(head_logits: Tensor, first: int) -> Tensor:  # (h, B, V) -> (h, B), keeping the logits
            logits.append(head_logits)
            return head_logits.argmax(dim=-1)

        def sample_drafts(head_logits: Tensor, first: int) -> Tensor:  # (h, B, V) -> (h, B), keeping the proposals
            probs = self.processed(head_logits).transpose(0, 1)  # (B, h, V)
            proposals.append(probs)
            return sample_from(probs, self.layout.drafts(draws, first, probs.size(1))).T

        choose: Callable[[Tensor, int], Tensor] = sample_drafts if self.sampled else top_tokens
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
        if tree is not None and self.sampled:  # every node drawn from its depth's proposal, independently
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
        self.pending = Proposal(drafts, draft_probs, live)
        return live

    def processed(self, logits: Tensor) -> Tensor:
        """The law a head's draft is sampled from: its distribution, processed exactly as the target is."""
        config = self.config
        return processed_probs(logits, config.temperature, config.top_k, config.top_p)

    def keep_rows(self, rows: list[int], index: Tensor) -> None:
        self.pending = self.pending.rows(index, rows)

    def propose(self, gamma: int, draws: Tensor | None) -> Proposal:
        return self.pending


class ModelDrafter(Proposer):
    """Autoregressive drafting with head 1 of an inference form (a draft model's, or the target's with blocks
    skipped) on a KV cache of its own."""

    def __init__(self, form: InferenceModel, method: str = "draft", params: dict[str, str] | None = None) -> None:
        self.form, self.method, self._params = form, method, params or {}
        self.device = form.embeddings.device
        self.context = form.config.max_seq_len

    def params(self) -> dict[str, str]:
        return self._params

    def start(self, prompts: list[list[int]], max_len: int, config: GenerationConfig | None = None) -> None:
        super().start(prompts, max_len, config)
        if max_len > self.context:
            raise SettingError(
                f"the draft model's context ({self.context} tokens) is below the {max_len} decoding needs; shorten "
                "the prompt or lower {max_new_tokens:name}.",
                max_new_tokens=config.max_new_tokens if config is not None else None,
            )
        self.cache = self.form.new_cache(len(prompts), max_len)
        self.unread = [list(p) for p in prompts]  # tokens of each row not in the cache yet
        self.held = [0] * len(prompts)  # cache positions that hold accepted tokens
        self.read_drafts = 0  # drafts the last proposal read into the cache (all but its last)
        self.forwards = 0

    def advance(self, accepted: list[int], emitted: list[list[int]]) -> None:
        kept = [min(n, self.read_drafts) for n in accepted]  # the drafts read that the target accepted stay
        self.held = [h + n for h, n in zip(self.held, kept, strict=True)]
        self.unread = [unread + tokens[n:] for unread, tokens, n in zip(self.unread, emitted, kept, strict=True)]
        self.cache.rollback(self.held)

    def keep_rows(self, rows: list[int], index: Tensor) -> None:
        self.cache.keep_rows(rows)
        self.unread = [self.unread[r] for r in rows]
        self.held = [self.held[r] for r in rows]

    def propose(self, gamma: int, draws: Tensor | None) -> Proposal:
        form, cache, config = self.form, self.cache, self.config
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
        drafts, proposals = [], []
        for j in range(gamma):
            if j:
                cache.begin(1)
                logits = form.verify(drafts[-1][:, None], cache)[0][:, 0]
                cache.commit(1)
            if self.sampled:
                proposals.append(processed_probs(logits, config.temperature, config.top_k, config.top_p))
                drafts.append(sample_from(proposals[-1], draws[:, j]))
            else:
                drafts.append(logits.argmax(dim=-1))
        self.forwards += gamma
        self.read_drafts = gamma - 1
        probs = torch.stack(proposals, dim=1) if self.sampled else None
        return Proposal(torch.stack(drafts, dim=1), probs, counts=[gamma] * len(widths))


def draft_model_drafter(draft: MTPModel, compile: bool = False) -> ModelDrafter:
    """Speculative sampling with ``draft`` (head 1 of any mtp model on the target's tokenizer)."""
    return ModelDrafter(InferenceModel.of(draft, 1, compile), "draft")


def layer_skip_drafter(
    model: MTPModel, skip: Iterable[int | Sublayer], compile: bool = False, params: dict[str, str] | None = None
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
    return ModelDrafter(form, "layerskip", {"skip": skip_label(sublayers), **(params or {})})


class LookupDrafter(Proposer):
    """Prompt lookup: the continuation of the latest earlier occurrence of the last ``ngram`` (down to 1) tokens."""

    method = "lookup"

    def __init__(self, ngram: int, vocab_size: int, device: torch.device | str) -> None:
        if ngram < 1:
            raise ValueError(f"ngram={ngram} must be at least 1")
        self.ngram, self.vocab_size, self.device = ngram, vocab_size, torch.device(device)

    def params(self) -> dict[str, str]:
        return {"ngram": str(self.ngram)}

    def start(self, prompts: list[list[int]], max_len: int, config: GenerationConfig | None = None) -> None:
        super().start(prompts, max_len, config)
        self.tokens = [list(p) for p in prompts]
        self.follows = [{} for _ in prompts]  # n-gram -> where the tokens after its latest occurrence start
        self.indexed = [0] * len(prompts)  # n-grams ending before this index are in `follows`

    def advance(self, accepted: list[int], emitted: list[list[int]]) -> None:
        for tokens, new in zip(self.tokens, emitted, strict=True):
            tokens.extend(new)

    def keep_rows(self, rows: list[int], index: Tensor) -> None:
        self.tokens = [self.tokens[r] for r in rows]
        self.follows = [self.follows[r] for r in rows]
        self.indexed = [self.indexed[r] for r in rows]

    def continuation(self, row: int, gamma: int) -> list[int]:
        """``gamma`` tokens that followed the latest earlier occurrence of the row's last n-gram (none without one),
        copied with overlap: past the end of the sequence, the match's period repeats."""
        tokens, follows = self.tokens[row], self.follows[row]
        for end in range(self.indexed[row], len(tokens) - 1):  # index every n-gram that has a token after it
            for n in range(1, min(self.ngram, end + 1) + 1):
                follows[tuple(tokens[end - n + 1 : end + 1])] = end + 1
        self.indexed[row] = max(self.indexed[row], len(tokens) - 1)
        for n in range(min(self.ngram, len(tokens)), 0, -1):
            start = follows.get(tuple(tokens[-n:]))
            if start is not None:
                period = len(tokens) - start
                return [tokens[start + i % period] for i in range(gamma)]
        return []

    def propose(self, gamma: int, draws: Tensor | None) -> Proposal:
        found = [self.continuation(row, gamma) for row in range(len(self.tokens))]
        drafts = torch.tensor([f + [0] * (gamma - len(f)) for f in found], device=self.device).view(len(found), gamma)
        probs = F.one_hot(drafts, self.vocab_size).float() if self.sampled else None
        return Proposal(drafts, probs, counts=[len(f) for f in found])
