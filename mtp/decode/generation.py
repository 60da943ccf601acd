"""Autoregressive and self-speculative generation with one code path.

Each step is ONE forward over [last accepted token, pending drafts] per row. Head 1's outputs verify
the drafts; every head's outputs at the last accepted position become the next drafts (verify and
predict merged, as in blockwise parallel decoding, Stern et al. 2018); causal heads draft there as a
chain, each depth fed the draft before it (mtp.decode.inference.CausalChain). The cache is rolled back to the
accepted length. With ``heads=1`` there are no drafts: plain autoregressive decoding on the same cache
and kernels, the baseline speed-ups are measured against.

- greedy (temperature 0): a draft is accepted while it equals head 1's argmax, so the output is token
  for token that of greedy autoregressive decoding from head 1.
- sampling: head j's processed distribution p is the proposal for its draft, head 1's processed
  distribution q the target. Accept with probability min(1, q/p); on rejection sample from
  normalize(max(0, q - p)); when every draft passes, sample the bonus token from q. The output is
  distributed as autoregressive sampling from head 1 (Leviathan et al. 2023; Chen et al. 2023).

The first step is the prompt itself (right-padded to the longest), so prefill also drafts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import Tensor

from mtp.decode.inference import InferenceModel
from mtp.decode.sampling import RowUniforms, processed_probs, sample_from
from mtp.model import MTPModel


@dataclass
class GenerationConfig:
    max_new_tokens: int = 128
    temperature: float = 0.0
    """0 is greedy."""
    top_k: int = 0
    """Keep only the k most likely tokens (0: all)."""
    top_p: float = 1.0
    """Keep the smallest set of most likely tokens whose probability reaches top_p (1: all)."""
    heads: int = 1
    """Heads used: 1 decodes autoregressively, k > 1 drafts k - 1 tokens per step with heads 2..k."""
    eos_id: int | None = None
    """Stop a row after this token (it is not included in the output)."""
    seed: int = 0
    """Row b samples from a generator seeded seed + b."""
    compile: bool = False
    """torch.compile the step (the first call compiles; outputs equal eager ones)."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be at least 1")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be 0 (greedy) or positive")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be 0 (off) or positive")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must lie in (0, 1]")
        if self.heads < 1:
            raise ValueError(f"heads={self.heads} must be at least 1")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class DecodeStats:
    rows: int
    forwards: int = 0
    """Model forwards (steps), prefill included."""
    row_forwards: int = 0
    """Forwards summed over the rows that took part in each: the denominator of tokens/forward."""
    tokens: int = 0
    """Generated tokens, over all rows."""
    drafted: list[int] = field(default_factory=list)
    """Drafts verified at draft position j (token j + 1 of a step), over all rows and steps."""
    accepted: list[int] = field(default_factory=list)
    wall_time_s: float = 0.0
    prefill_s: float = 0.0
    """Wall time of the first forward (the prompts, plus the first drafts), up to its host transfer."""
    prefills: int = 1
    """Forwards that read prompts (1 per generate call; more when statistics of several calls are summed)."""

    @property
    def ms_per_forward(self) -> float:
        """Mean wall time of a decoding step (every forward after the prompts'), in milliseconds."""
        steps = self.forwards - self.prefills
        return 1000 * (self.wall_time_s - self.prefill_s) / steps if steps > 0 else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / max(1, self.row_forwards)

    @property
    def acceptance(self) -> list[float]:
        """Acceptance rate of the draft at each position (heads 2..k)."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted, self.drafted, strict=True)]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    def line(self) -> str:
        """One line of key=value pairs for scripts to parse."""
        accept = ",".join(f"{a:.3f}" for a in self.acceptance) or "-"
        return (
            f"tokens={self.tokens} forwards={self.forwards} tokens/forward={self.tokens_per_forward:.3f} "
            f"accept={accept} wall_s={self.wall_time_s:.3f} tokens/s={self.tokens_per_s:.1f} "
            f"ms/forward={self.ms_per_forward:.3f} prefill_ms={1000 * self.prefill_s:.1f}"
        )


@torch.inference_mode()
def generate(
    model: MTPModel, prompts: list[list[int]], config: GenerationConfig
) -> tuple[list[list[int]], DecodeStats]:
    """Continue every prompt (a list of token ids each) by up to ``max_new_tokens`` tokens; rows are independent."""
    if config.heads > model.n_future and not model.config.share_depth:
        raise ValueError(
            f"heads={config.heads} but the model has {model.n_future}; only causal heads trained with "
            "model.share_depth=true can draft beyond the heads they were trained with"
        )
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    device = next(model.parameters()).device
    drafts_per_step = config.heads - 1
    # room for a step's drafts past the budget, and for causal depths' windows (the step's width + k - 2)
    max_len = max(map(len, prompts)) + config.max_new_tokens + 2 * config.heads
    if max_len > model.config.max_seq_len:
        raise ValueError(
            f"prompt ({max(map(len, prompts))} tokens) + max_new_tokens ({config.max_new_tokens}) exceeds the "
            f"model's context of {model.config.max_seq_len} tokens"
        )
    stats = DecodeStats(rows=len(prompts), drafted=[0] * drafts_per_step, accepted=[0] * drafts_per_step)
    outputs: list[list[int]] = [[] for _ in prompts]
    rows = list(range(len(prompts)))  # original index of each live row
    inference = InferenceModel.of(model, config.heads, config.compile)
    cache = inference.new_cache(len(prompts), max_len)
    # a step draws at most: an acceptance test per draft, the next token, the new drafts
    steps = config.max_new_tokens + 1  # every step emits a token; the prompt's step too
    uniforms = None if config.greedy else RowUniforms(config.seed, len(prompts), steps, 2 * config.heads - 1, device)
    start = time.perf_counter()

    # Step 0: the prompts. Every prompt token counts as accepted; the last one is each row's base position.
    width = max(map(len, prompts))
    inputs = torch.tensor([p + [0] * (width - len(p)) for p in prompts], device=device)
    first_base = [len(p) - 1 for p in prompts]
    base = torch.tensor(first_base, device=device)
    n_drafts = 0
    draft_probs: Tensor | None = None  # (B, drafts, V) proposals of the pending drafts, when sampling

    while rows:
        held, held_on_device = cache.host_lengths, cache.lengths
        cache.begin(inputs.size(1))
        # head 1's logits where drafts are verified: after the last accepted input (base) and each pending draft
        read = None if n_drafts else base[:, None]
        head1, hidden = inference.verify(inputs, cache, read)  # (B, n_drafts + 1, V), (B, S, d)
        draft = partial(inference.draft, hidden, cache)  # heads 2..k after each row's last accepted input
        accepted, next_token, drafts, draft_probs = _verify_and_draft(
            head1, draft, inputs, base, n_drafts, draft_probs, config, uniforms
        )
        cache.commit(inputs.size(1))
        stats.forwards += 1
        stats.row_forwards += len(rows)
        # the one device-to-host transfer of the step: what each row accepted and emitted
        host = torch.cat([accepted[:, None], next_token[:, None], inputs[:, 1:] if n_drafts else base[:, None]], 1)
        host = host.tolist()  # waits for the device: the step's time ends here
        if stats.forwards == 1:
            stats.prefill_s = time.perf_counter() - start
        # keep the last accepted input and everything before it: base + accepted + 1 new positions
        kept = [held[i] + h[0] + 1 + first_base[i] for i, h in enumerate(host)]
        cache.rollback(kept, held_on_device + base + accepted + 1)  # the same, computed where it is used

        keep = []
        for i, (n_accepted, token, *pending) in enumerate(host):
            emitted = (pending[:n_accepted] if n_drafts else []) + [token]
            for j in range(n_drafts):
                stats.drafted[j] += 1
                stats.accepted[j] += int(j < n_accepted)
            if _extend(outputs[rows[i]], emitted, config):
                keep.append(i)
        if len(keep) < len(rows):
            rows = [rows[i] for i in keep]
            if not rows:
                break
            index = torch.tensor(keep, device=device)
            cache.keep_rows(keep)
            if uniforms is not None:
                uniforms.keep_rows(index)
            next_token, drafts = next_token[index], drafts[index]
            draft_probs = None if draft_probs is None else draft_probs[index]
        inputs = torch.cat([next_token[:, None], drafts], dim=1)
        first_base = [0] * len(rows)
        base = torch.zeros(len(rows), dtype=torch.long, device=device)
        n_drafts = drafts_per_step

    if device.type == "cuda":
        torch.cuda.synchronize()
    stats.wall_time_s = time.perf_counter() - start
    stats.tokens = sum(map(len, outputs))
    return outputs, stats


def _extend(output: list[int], emitted: list[int], config: GenerationConfig) -> bool:
    """Append emitted tokens up to EOS or the length budget; True while the row goes on."""
    for token in emitted:
        if token == config.eos_id:
            return False
        output.append(token)
        if len(output) >= config.max_new_tokens:
            return False
    return True


def target_probs(head1_logits: Tensor, config: GenerationConfig) -> Tensor:
    """The law autoregressive sampling draws from: head 1's distribution after temperature, top-k and top-p."""
    return processed_probs(head1_logits, config.temperature, config.top_k, config.top_p)


def proposal_probs(draft_logits: Tensor, config: GenerationConfig) -> Tensor:
    """The law a head's draft is sampled from: its distribution, processed exactly as the target is."""
    return processed_probs(draft_logits, config.temperature, config.top_k, config.top_p)


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


def _verify_and_draft(
    head1: Tensor,
    draft: Callable[..., Tensor],
    inputs: Tensor,
    base: Tensor,
    n_drafts: int,
    draft_probs: Tensor | None,
    config: GenerationConfig,
    uniforms: RowUniforms | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Accepted draft counts (B,), the token after them (B,), next drafts (B, heads - 1) and their proposals.

    head1: (B, n_drafts + 1, V), head 1's logits after input ``base`` (B,) and after each pending draft (which
    follow it). ``draft(last, inputs, next_token, choose)``: the drafts after each row's input ``last`` and
    ``next_token`` (:meth:`InferenceModel.draft`).
    """
    B = inputs.size(0)
    rows = torch.arange(B, device=inputs.device)
    drafting = config.heads > 1

    if config.greedy:
        choice = head1.argmax(dim=-1)  # (B, n_drafts + 1): head 1's token after the base and each draft
        if n_drafts:
            match = inputs[:, 1:] == choice[:, :n_drafts]
            accepted = match.long().cumprod(dim=1).sum(dim=1)
        else:
            accepted = torch.zeros(B, dtype=torch.long, device=inputs.device)
        next_token = choice[rows, accepted]
        if not drafting:
            return accepted, next_token, inputs.new_empty(B, 0), None
        drafts = draft(base + accepted, inputs, next_token, lambda logits, first: logits.argmax(dim=-1))
        return accepted, next_token, drafts, None

    draws = uniforms.next(n_drafts + config.heads)  # acceptance, next token, drafts
    target = target_probs(head1, config)  # (B, n_drafts + 1, V)
    if n_drafts:
        pending = inputs[:, 1:, None]
        q = target[:, :n_drafts].gather(-1, pending).squeeze(-1)  # (B, D) target probability of each draft
        p = draft_probs.gather(-1, pending).squeeze(-1)  # its proposal probability
        accepted = accept_drafts(draws[:, :n_drafts], p, q).long().cumprod(dim=1).sum(dim=1)
    else:
        accepted = torch.zeros(B, dtype=torch.long, device=inputs.device)
    q_last = target[rows, accepted]  # (B, V): after the last accepted input
    if n_drafts:
        p_first_rejected = draft_probs[rows, accepted.clamp(max=n_drafts - 1)]  # (B, V)
        q_last = correction_probs(q_last, p_first_rejected, accepted < n_drafts)
    next_token = sample_from(q_last, draws[:, n_drafts])
    if not drafting:
        return accepted, next_token, inputs.new_empty(B, 0), None
    proposals = []

    def sample_drafts(logits: Tensor, first: int) -> Tensor:  # (h, B, V) -> (h, B), keeping the proposals
        probs = proposal_probs(logits, config).transpose(0, 1)  # (B, h, V)
        proposals.append(probs)
        start = n_drafts + 1 + first
        return sample_from(probs, draws[:, start : start + probs.size(1)]).T

    drafts = draft(base + accepted, inputs, next_token, sample_drafts)
    return accepted, next_token, drafts, torch.cat(proposals, dim=1)
