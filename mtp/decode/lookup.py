"""Prompt lookup decoding (Saxena 2023): drafts copied from the sequence itself, no model (:class:`LookupDrafter`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from mtp.decode.proposal import DEFAULT_GAMMA, Proposal, Proposer
from mtp.decode.settings import Drafted
from mtp.errors import SettingError


def lookup_continuation(tokens: list[int], ngram: int, gamma: int) -> list[int]:
    """Up to ``gamma`` tokens that followed the latest earlier occurrence of the last n tokens (n from ``ngram`` down
    to 1), copied with overlap past the end (:class:`LookupDrafter`'s drafts, without its index)."""
    for n in range(min(ngram, len(tokens) - 1), 0, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == tail:
                period = len(tokens) - (start + n)
                return [tokens[start + n + i % period] for i in range(gamma)]
    return []


class LookupDrafter(Proposer):
    """Prompt lookup: the continuation of the latest earlier occurrence of the last ``ngram`` (down to 1) tokens."""

    method = "lookup"
    drafts_with_a_model = draws_drafts = False
    beside_heads = True

    def __init__(self, ngram: int, vocab_size: int, device: torch.device | str, gamma: int = DEFAULT_GAMMA) -> None:
        if ngram < 1:
            raise ValueError(f"ngram={ngram} must be at least 1")
        self.ngram, self.vocab_size, self.device, self.gamma = ngram, vocab_size, torch.device(device), gamma

    def params(self) -> dict[str, str]:
        return {"ngram": str(self.ngram)}

    def start(self, prompts: list[list[int]], max_len: int, config: Drafted | None = None) -> None:
        if config is not None and config.drafts_per_step > 1:
            raise SettingError(
                "prompt lookup drafts one continuation per row, which no tree of several is made of; use "
                "{drafts_per_step:1} with it.",
                drafts_per_step=config.drafts_per_step,
            )
        if config is not None and config.draft_dtype != "auto" and not config.hybrid:  # a hybrid's heads take it
            raise SettingError(
                "{draft_dtype} quantizes a model's drafts, and prompt lookup drafts without a model; leave "
                "{draft_dtype:auto} with it.",
                draft_dtype=config.draft_dtype,
            )
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

    def draft_chains(self, gamma: int, draws: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Its chain beside the heads' (:class:`~mtp.decode.proposers.HybridProposer`): (B, gamma) drafts, a row
        without a match padded (the step verifies the padding and rejects what is wrong of it, as any draft), and
        their one-hot laws when sampling."""
        proposal = self.propose(gamma, draws)
        return proposal.tokens, proposal.probs

    def propose(self, gamma: int, draws: Tensor | None) -> Proposal:
        found = [self.continuation(row, gamma) for row in range(len(self.tokens))]
        drafts = torch.tensor([f + [0] * (gamma - len(f)) for f in found], device=self.device).view(len(found), gamma)
        probs = F.one_hot(drafts, self.vocab_size).float() if self.sampled else None
        return Proposal(drafts, probs, counts=[len(f) for f in found])
