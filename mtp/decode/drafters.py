"""Drafters other than the target's own heads: a separate draft model, the target with blocks skipped, prompt lookup.

A drafter proposes up to gamma tokens per row before the target's step, which verifies them all in one forward
(:func:`mtp.decode.generation.generate`, the same chain verification as the heads' drafts):

- :class:`ModelDrafter` (``method="draft"``): speculative sampling with a separate, smaller model on the same
  tokenizer (Leviathan et al. 2023; Chen et al. 2023). It drafts gamma tokens autoregressively on its own KV cache,
  which follows the accepted tokens: after a step it keeps the drafts it had read that the target accepted, and
  reads what it has not seen (the token after them) at the start of its next proposal.
- :func:`layer_skip_drafter` (``method="layerskip"``): the target itself with some blocks of head 1's path skipped
  (Draft & Verify, Zhang et al. 2023), drafting with head 1 on its own cache; it shares the target's packed weights.
- :class:`LookupDrafter` (``method="lookup"``): prompt lookup decoding (Saxena 2023): the tokens that followed
  the latest earlier occurrence of the sequence's last n-gram (n from ``ngram`` down to 1), in the prompt or the
  output so far; a continuation that reaches the end of the sequence goes on as an overlapping copy does (the
  sequence repeats with the match's period), so repetitive text drafts gamma tokens, not one. No model; its
  proposal is the drafted token itself (one-hot), so sampling stays lossless.

Sampling: a draft is drawn from the drafter's processed distribution p (temperature, top-k, top-p as the target);
greedy: the drafter's argmax (and typical acceptance verifies the drafter's top-ranked tokens too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from mtp.decode.inference import InferenceModel
from mtp.decode.sampling import processed_probs, sample_from
from mtp.model import MTPModel

if TYPE_CHECKING:
    from mtp.decode.generation import GenerationConfig

METHODS = ("heads", "draft", "layerskip", "lookup")
"""How a step's drafts are made: the target's heads, a draft model, the target with blocks skipped, prompt lookup."""


class Drafter:
    """What :func:`~mtp.decode.generation.generate` asks of a drafter. Rows are the live rows of the batch, in order.

    ``start(prompts, max_len)``; then per step ``advance(accepted, emitted)`` (what the target accepted of the last
    proposal, and the tokens each row emitted: the accepted drafts and the token after them), ``keep_rows`` when rows
    finish, and ``propose`` for the next step.
    """

    method = "heads"
    forwards = 0
    """Forwards the drafter ran (0 without a model)."""
    context: int | None = None
    """The most positions its model holds (None: no model, no limit)."""

    def params(self) -> dict[str, str]:
        """The method's parameters, for the statistics line."""
        return {}

    def start(self, prompts: list[list[int]], max_len: int) -> None:
        raise NotImplementedError

    def advance(self, accepted: list[int], emitted: list[list[int]]) -> None:
        raise NotImplementedError

    def keep_rows(self, rows: list[int]) -> None:
        raise NotImplementedError

    def propose(
        self, gamma: int, sampled: bool, config: GenerationConfig, draws: Tensor | None
    ) -> tuple[Tensor, Tensor | None, list[int]]:
        """Drafts (B, gamma), their proposals (B, gamma, V) when ``sampled`` (draft j drawn with ``draws[:, j]``),
        and how many drafts each row has (a row's later columns are padding)."""
        raise NotImplementedError


class ModelDrafter(Drafter):
    """Autoregressive drafting with head 1 of an inference form (a draft model's, or the target's with blocks
    skipped) on a KV cache of its own."""

    def __init__(self, form: InferenceModel, method: str = "draft", params: dict[str, str] | None = None) -> None:
        self.form, self.method, self._params = form, method, params or {}
        self.device = form.embeddings.device
        self.context = form.config.max_seq_len

    def params(self) -> dict[str, str]:
        return self._params

    def start(self, prompts: list[list[int]], max_len: int) -> None:
        if max_len > self.context:
            raise ValueError(f"the draft model's context ({self.context} tokens) is below the {max_len} decoding needs")
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

    def keep_rows(self, rows: list[int]) -> None:
        self.cache.keep_rows(rows)
        self.unread = [self.unread[r] for r in rows]
        self.held = [self.held[r] for r in rows]

    def propose(self, gamma, sampled, config, draws):
        form, cache = self.form, self.cache
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
            if sampled:
                proposals.append(processed_probs(logits, config.temperature, config.top_k, config.top_p))
                drafts.append(sample_from(proposals[-1], draws[:, j]))
            else:
                drafts.append(logits.argmax(dim=-1))
        self.forwards += gamma
        self.read_drafts = gamma - 1
        probs = torch.stack(proposals, dim=1) if sampled else None
        return torch.stack(drafts, dim=1), probs, [gamma] * len(widths)


def draft_model_drafter(draft: MTPModel, compile: bool = False) -> ModelDrafter:
    """Speculative sampling with ``draft`` (head 1 of any mtp model on the target's tokenizer)."""
    return ModelDrafter(InferenceModel.of(draft, 1, compile), "draft")


def layer_skip_drafter(model: MTPModel, skip: frozenset[int], compile: bool = False) -> ModelDrafter:
    """The target with the blocks ``skip`` of head 1's path (indices 0..len(model.layers) - 1: the trunk, then head
    1's own block) skipped, drafting with head 1."""
    blocks = len(model.layers)
    if not skip or not skip < set(range(blocks)):
        raise ValueError(
            f"skip={sorted(skip)} must name some but not all of head 1's {blocks} blocks (0..{blocks - 1})"
        )
    form = InferenceModel.of(model, 1, compile).skipping(skip)
    return ModelDrafter(form, "layerskip", {"skip": ",".join(map(str, sorted(skip)))})


class LookupDrafter(Drafter):
    """Prompt lookup: the continuation of the latest earlier occurrence of the last ``ngram`` (down to 1) tokens."""

    method = "lookup"

    def __init__(self, ngram: int, vocab_size: int, device: torch.device | str) -> None:
        if ngram < 1:
            raise ValueError(f"ngram={ngram} must be at least 1")
        self.ngram, self.vocab_size, self.device = ngram, vocab_size, torch.device(device)

    def params(self) -> dict[str, str]:
        return {"ngram": str(self.ngram)}

    def start(self, prompts: list[list[int]], max_len: int) -> None:
        self.tokens = [list(p) for p in prompts]
        self.follows = [{} for _ in prompts]  # n-gram -> where the tokens after its latest occurrence start
        self.indexed = [0] * len(prompts)  # n-grams ending before this index are in `follows`

    def advance(self, accepted: list[int], emitted: list[list[int]]) -> None:
        for tokens, new in zip(self.tokens, emitted, strict=True):
            tokens.extend(new)

    def keep_rows(self, rows: list[int]) -> None:
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

    def propose(self, gamma, sampled, config, draws):
        found = [self.continuation(row, gamma) for row in range(len(self.tokens))]
        drafts = torch.tensor([f + [0] * (gamma - len(f)) for f in found], device=self.device).view(len(found), gamma)
        probs = F.one_hot(drafts, self.vocab_size).float() if sampled else None
        return drafts, probs, [len(f) for f in found]
