"""What a decoding run measured (:class:`DecodeStats`, which add up over runs) and a timer of spans that needs no
host sync per span."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace

import torch


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
    tree_nodes: int = 0
    """Nodes of the draft tree verified per step (0: a chain)."""
    accepted_nodes: Counter = field(default_factory=Counter)
    """Tree decoding: how many row-steps ended at each node (0: the root, no draft accepted)."""
    acceptance_rule: str = "exact"
    """The rule that ran (:attr:`mtp.decode.acceptance.Rule.name`): ``greedy`` at temperature 0, whatever
    ``acceptance`` asked; ``exact`` (lossless sampling) or ``typical`` otherwise."""
    method: str = "heads"
    """Who drafts (:attr:`mtp.decode.plan.Proposer.method`): the target's heads (``heads``), a draft model
    (``draft``), layer skip (``layerskip``), prompt lookup (``lookup``)."""
    method_params: dict[str, str] = field(default_factory=dict)
    draft_s: float = 0.0
    """Wall time spent drafting: a drafter's proposals, or the heads' part of each step (after head 1's logits: the
    draft heads' blocks, their unembedding and the drafts' choice)."""
    draft_forwards: int = 0
    """Forwards a drafter's model ran."""
    captures: int = 0
    """Step shapes captured as CUDA graphs in this run (``cuda_graphs``; 0 where the run replayed earlier captures)."""
    capture_s: float = 0.0
    """Wall time spent capturing them (a capture runs its step once too): in ``wall_time_s``, but not in the decoding
    rate (:attr:`tokens_per_s`, :attr:`ms_per_forward`), which it would bias by a one-off cost."""

    def record(self, verified: int, accepted: int, node: int | None) -> None:
        """One row's step: it verified ``verified`` drafts (tree: depths), accepted ``accepted``, ended at tree
        ``node`` (None: a chain)."""
        for j in range(verified):
            self.drafted[j] += 1
            self.accepted[j] += int(j < accepted)
        if node is not None:
            self.accepted_nodes[node] += 1

    @property
    def ms_per_forward(self) -> float:
        """Mean wall time of a decoding step (every forward after the prompts'), in milliseconds, without the time
        spent capturing steps (:attr:`capture_s`)."""
        steps = self.forwards - self.prefills
        return 1000 * (self.decoding_s - self.prefill_s) / steps if steps > 0 else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / max(1, self.row_forwards)

    @property
    def acceptance(self) -> list[float]:
        """Acceptance rate of the draft at each position (heads 2..k)."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted, self.drafted, strict=True)]

    @property
    def draft_share(self) -> float:
        """The share of the wall time spent drafting (:attr:`draft_s`)."""
        return self.draft_s / self.wall_time_s if self.wall_time_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens over the wall time, without the time spent capturing steps (:attr:`capture_s`)."""
        return self.tokens / self.decoding_s if self.decoding_s > 0 else 0.0

    @property
    def decoding_s(self) -> float:
        """The wall time without the time spent capturing steps (:attr:`capture_s`): what the rates are of."""
        return self.wall_time_s - self.capture_s

    def line(self) -> str:
        """One line of key=value pairs for scripts to parse; ``method=none`` where nothing drafted (autoregressive)."""
        accept = ",".join(f"{a:.3f}" for a in self.acceptance) or "-"
        rule = "typical(lossy)" if self.acceptance_rule == "typical" else self.acceptance_rule
        return (
            f"tokens={self.tokens} forwards={self.forwards} tokens/forward={self.tokens_per_forward:.3f} "
            f"accept={accept} wall_s={self.wall_time_s:.3f} tokens/s={self.tokens_per_s:.1f} "
            f"ms/forward={self.ms_per_forward:.3f} prefill_ms={1000 * self.prefill_s:.1f} "
            f"tree_nodes={self.tree_nodes} acceptance={rule} method={self.method if self.drafted else 'none'}"
            + "".join(f" {key}={value}" for key, value in self.method_params.items())
            + (f" draft_share={self.draft_share:.3f}" if self.drafted else "")
            + (f" captures={self.captures} capture_ms={1000 * self.capture_s:.1f}" if self.captures else "")
        )

    def __add__(self, other: DecodeStats) -> DecodeStats:
        """The statistics of two decoding runs (batches) with the same settings taken together: counts and times add
        up, ``tree_nodes``, the rule and the method are the runs' own."""
        if (len(self.drafted), self.tree_nodes, self.acceptance_rule, self.method, self.method_params) != (
            len(other.drafted), other.tree_nodes, other.acceptance_rule, other.method, other.method_params,
        ):  # fmt: skip
            raise ValueError("only the statistics of runs with the same settings add up")
        summed = {
            name: getattr(self, name) + getattr(other, name)
            for name in ("rows", "forwards", "row_forwards", "tokens", "wall_time_s", "prefill_s", "prefills",
                         "accepted_nodes", "draft_s", "draft_forwards", "captures", "capture_s")
        }  # fmt: skip
        return replace(
            self,
            drafted=[a + b for a, b in zip(self.drafted, other.drafted, strict=True)],
            accepted=[a + b for a, b in zip(self.accepted, other.accepted, strict=True)],
            **summed,
        )

    @classmethod
    def empty(cls, like: DecodeStats) -> DecodeStats:
        """No run yet, with ``like``'s settings: ``sum(runs, DecodeStats.empty(runs[0]))`` adds runs up."""
        return cls(
            rows=0, prefills=0, drafted=[0] * len(like.drafted), accepted=[0] * len(like.drafted),
            tree_nodes=like.tree_nodes, acceptance_rule=like.acceptance_rule, method=like.method,
            method_params=dict(like.method_params),
        )  # fmt: skip


class SpanTimer:
    """Wall time summed over start/stop spans without a host sync per span: on CUDA, events recorded on the stream
    and read once at the end; elsewhere, the clock."""

    def __init__(self, device: torch.device) -> None:
        self.cuda, self.total, self.spans = device.type == "cuda", 0.0, []

    def start(self) -> None:
        if self.cuda:
            self.spans.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
            self.spans[-1][0].record()
        else:
            self.began = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            self.spans[-1][1].record()
        else:
            self.total += time.perf_counter() - self.began

    def seconds(self) -> float:
        """The summed time (on CUDA, after the caller has synchronized)."""
        return self.total + sum(begin.elapsed_time(end) for begin, end in self.spans) / 1000
