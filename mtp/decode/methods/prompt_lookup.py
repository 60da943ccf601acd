"""Prompt lookup decoding (Saxena 2023): the drafts are what followed the latest earlier occurrence of the last
tokens, in the prompt or the output so far; no model drafts (:class:`LookupDrafter`: the n-gram from ``ngram`` down to
1; a continuation that reaches the end of the sequence goes on as an overlapping copy does, the sequence repeating
with the match's period, so repetitive text drafts gamma tokens, not one; its proposal is the drafted token itself,
one-hot, so sampling stays lossless). Beside the heads its chain and theirs are verified together in one step (a
hybrid: lookup drafts where the text repeats itself, the heads elsewhere)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from mtp.decode.methods.base import DecodingMethod, Target, register
from mtp.decode.plan import DEFAULT_GAMMA, Plan, Proposal, Proposer
from mtp.errors import SettingError


class LookupDrafter(Proposer):
    """Prompt lookup: the continuation of the latest earlier occurrence of the last ``ngram`` (down to 1) tokens."""

    method = "lookup"
    beside_heads = True

    def __init__(self, ngram: int, vocab_size: int, device: torch.device | str, gamma: int = DEFAULT_GAMMA) -> None:
        if ngram < 1:
            raise ValueError(f"ngram={ngram} must be at least 1")
        self.ngram, self.vocab_size, self.device, self.gamma = ngram, vocab_size, torch.device(device), gamma

    def params(self) -> dict[str, str]:
        return {"ngram": str(self.ngram)}

    @staticmethod
    def check_plan(plan: Plan) -> None:
        if plan.drafts.drafts_per_step > 1:
            raise SettingError(
                "prompt lookup drafts one continuation per row, which no tree of several is made of; use "
                "{drafts_per_step:1} with it.",
                drafts_per_step=plan.drafts.drafts_per_step,
            )
        if plan.drafts.draft_dtype != "auto" and not plan.hybrid:  # a hybrid's heads take it
            raise SettingError(
                "{draft_dtype} quantizes a model's drafts, and prompt lookup drafts without a model; leave "
                "{draft_dtype:auto} with it.",
                draft_dtype=plan.drafts.draft_dtype,
            )

    def start(self, prompts: list[list[int]], max_len: int, plan: Plan | None = None) -> None:
        super().start(prompts, max_len, plan)
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

    def draft_chains(self, gamma: int, draws: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Its chain beside the heads' (:class:`~mtp.decode.heads_proposer.HybridProposer`): (B, gamma) drafts, a row
        without a match padded (the step verifies the padding and rejects what is wrong of it, as any draft), and
        their one-hot laws when sampling."""
        proposal = self.propose(gamma, draws)
        return proposal.tokens, proposal.probs

    def propose(self, gamma: int, draws: Tensor | None) -> Proposal:
        found = [self.continuation(row, gamma) for row in range(len(self.tokens))]
        drafts = torch.tensor([f + [0] * (gamma - len(f)) for f in found], device=self.device).view(len(found), gamma)
        probs = F.one_hot(drafts, self.vocab_size).float() if self.sampled else None
        return Proposal(drafts, probs, counts=[len(f) for f in found])


@dataclass
class PromptLookupSettings:
    prompt_lookup: int | None = None
    """Draft what followed the latest earlier occurrence of the last N (down to 1) tokens."""

    def __post_init__(self) -> None:
        if self.prompt_lookup is not None and self.prompt_lookup < 1:
            raise SettingError("{prompt_lookup} must be at least 1.", prompt_lookup=self.prompt_lookup)


@register
class PromptLookup(DecodingMethod):
    """Prompt lookup drafts the continuation of an earlier match of the last tokens."""

    name = "lookup"
    settings = PromptLookupSettings
    selected_by = "prompt_lookup"
    beside_heads = True

    def proposer_class(self) -> type[Proposer]:
        return LookupDrafter

    def proposer(self, target: Target) -> Proposer:
        return LookupDrafter(self.options.prompt_lookup, target.loaded.config.vocab_size, target.device)
