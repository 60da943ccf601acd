"""The decoding loop: verify -> accept -> propose -> roll back -> emit -> drop finished rows.

Each step is ONE forward of the target over [last accepted token, pending drafts] per row (the engine,
:mod:`mtp.decode.inference`). Head 1's outputs there verify the drafts under an acceptance rule
(:mod:`mtp.decode.acceptance`: greedy-exact, lossless or typical, for a chain or a tree); a proposer drafts the next
step's tokens: the target's own heads from this step's forward (:mod:`mtp.decode.heads_proposer`), or the plan's
drafter (a draft model, layer skip, prompt lookup: :mod:`mtp.decode.methods`) once the step's tokens are known. The
cache is rolled back to the accepted length. A plan with no proposer (one head, no drafter) has no drafts: plain
autoregressive decoding on the same cache and kernels, the baseline speed-ups are measured against. A step too large
for the memory available (a huge tree, batch or prompt) is refused before anything runs
(:func:`mtp.decode.memory.check_step_fits`).

With a draft tree (the plan's ``step_tree``, :mod:`mtp.decode.tree`) a step verifies several candidates per depth at
once: the input is [the token head 1 chose, the tree's nodes] under a tree attention mask, the longest accepted path
wins, its keys and values are moved where a sequence would have them, and the heads draft the next tree from its last
node. ``draft_p_min`` and ``adaptive_drafts`` size each row's drafts from the drafts alone, so greedy output stays
exact and sampling lossless. The first step is the prompt itself (right-padded to the longest), so prefill also
drafts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from mtp.decode.acceptance import NodeLaws, Rule, TreeVerification, rule_for
from mtp.decode.cache import KVCache
from mtp.decode.heads_proposer import proposer_for
from mtp.decode.inference import InferenceModel
from mtp.decode.memory import check_step_fits
from mtp.decode.plan import Plan, Proposal
from mtp.decode.sampling import RowUniforms
from mtp.decode.settings import GenerationConfig
from mtp.decode.stats import DecodeStats, SpanTimer
from mtp.model import MTPModel


@dataclass
class Step:
    """What a step verifies: per row its last accepted input, then its drafts (the prompts' step: the prompts,
    right-padded), and where the drafts came from."""

    inputs: Tensor
    """(B, 1 + n_drafts): the last accepted input, then the drafts (a chain, or a tree's nodes)."""
    base: Tensor
    """(B,) the index in ``inputs`` of each row's last accepted input (0 after the prompts' step)."""
    first_base: list[int]
    """The same on the host."""
    n_drafts: int = 0
    live: Tensor | None = None
    """(B,) on the device: the drafts (chain) or depths (tree) each row verifies."""
    proposal: Proposal | None = None


@dataclass
class Verdict:
    """A step's forward and its rule's verdict, per row: the drafts (depths) accepted, the token after them, the
    accepted tree node (None: a chain), the accepted inputs (a tree step's path, which the cache now holds where a
    sequence would), what the draft heads read there (B, S', d), and how many drafts the heads made of it."""

    accepted: Tensor
    next_token: Tensor
    node: Tensor | None
    inputs: Tensor
    hidden: Tensor
    proposed: Tensor | None = None


@torch.inference_mode()
def generate(model: MTPModel, prompts: list[list[int]], plan: Plan) -> tuple[list[list[int]], DecodeStats]:
    """Continue every prompt (a list of token ids each) by up to ``plan.sampling.max_new_tokens`` tokens, as ``plan``
    says (:class:`~mtp.decode.plan.Plan`: who drafts, how to sample and accept, how a step runs); rows are
    independent. The plan is a built one (:meth:`~mtp.decode.plan.Plan.build`: its drafter's model loaded or its
    skip set searched, which needs the loaded checkpoint this function does not have); it was checked when it was
    made, and here it is checked against the model and the prompts."""
    run = _Run(model, prompts, plan)
    with run.exclusive():
        step = run.prompts_step(prompts)  # step 0: every prompt token counts as accepted
        while True:
            draws = run.uniforms.next(run.rule.layout.per_step) if run.uniforms is not None else None
            verdict = run.verify(step, draws)  # verify and accept; the heads propose from the same forward
            rows, draws = run.commit(step, verdict, draws)  # roll back, emit, drop finished rows
            if rows is None:
                break
            step = run.propose(*rows, draws)  # the next step's drafts
    return run.finish()


class _Run:
    """One call of :func:`generate`: its checks, the packed model, the proposer, the cache and the rows."""

    def __init__(self, model: MTPModel, prompts: list[list[int]], plan: Plan) -> None:
        if not plan.built:
            raise TypeError("generate() decodes a built plan; build its drafter first: plan.build(target)")
        plan.check(model.config, prompts)
        device, tree = next(model.parameters()).device, plan.step_tree
        plan.check_device(device)
        plan.check_weights(model.config, device, model.tok_embeddings.weight.dtype)
        longest, nodes = max(map(len, prompts)), tree.size if tree is not None else 0
        max_len = plan.cache_length(longest)
        dtype = model.tok_embeddings.weight.dtype
        # a drafting step (head 1's logits everywhere), then the prompts' step (logits at each row's last position only)
        check_step_fits(model.config, len(prompts), max_len, 1 + (nodes or plan.step_drafts), nodes, device, dtype)
        check_step_fits(model.config, len(prompts), max_len, longest, 0, device, dtype, logit_positions=1)
        heads, step = plan.heads, plan.step
        self.inference = InferenceModel.of(
            model, plan.heads_packed, step.compile, plan.heads_dtype, heads.draft_first_ids, step.cuda_graphs,
            step.quantize,
        )  # fmt: skip
        self.proposer = proposer = proposer_for(plan)
        proposer.join(self.inference)  # the heads draft out of the step's forward
        rule = rule_for(plan, proposer.draws(plan))  # its uniforms laid out beside the proposer's
        proposer.lay_out(rule.layout)
        drafts = plan.step_drafts
        self.stats = DecodeStats(
            rows=len(prompts), drafted=[0] * drafts, accepted=[0] * drafts, tree_nodes=nodes,
            acceptance_rule=rule.name, method=proposer.method, method_params=proposer.method_params(),
        )  # fmt: skip
        self.plan, self.device, self.tree, self.rule = plan, device, tree, rule
        self.rows = _Rows(len(prompts), plan)
        self.cache = self.inference.new_cache(len(prompts), max_len)
        sampling = plan.sampling
        steps = sampling.max_new_tokens + 1  # every step emits a token, the prompt's too
        self.uniforms = (
            None if sampling.greedy else RowUniforms(sampling.seed, len(prompts), steps, rule.layout.per_step, device)
        )
        proposer.start(prompts, max_len, plan)  # a drafter's cache allocated outside the timed part, as the target's
        self.draft_timer = SpanTimer(device)
        graphs = self.inference.graphs
        self.captured = (graphs.captures, graphs.capture_s) if graphs is not None else None
        self.start = time.perf_counter()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """The decoding itself; with captured steps, the only one of its form's while it runs (they replay on one
        cache storage per shape: :meth:`mtp.decode.graphs.StepGraphs.claim`)."""
        graphs = self.inference.graphs
        if graphs is None:
            yield
            return
        graphs.claim()
        try:
            yield
        finally:
            graphs.release()

    def prompts_step(self, prompts: list[list[int]]) -> Step:
        """The prompts, right-padded to the longest; the last token of each is its row's base position."""
        longest = max(map(len, prompts))
        inputs = torch.tensor([p + [0] * (longest - len(p)) for p in prompts], device=self.device)
        first_base = [len(p) - 1 for p in prompts]
        return Step(inputs, torch.tensor(first_base, device=self.device), first_base)

    def verify(self, step: Step, draws: Tensor | None) -> Verdict:
        """One forward of the target over the step and its rule's verdict; the heads draft from the same forward."""
        verdict = _verify(self.inference, self.cache, self.rule, self.tree, step, draws)
        self.draft_timer.start()  # the heads draft here, inside the step; a drafter in propose, between steps
        last = step.base + verdict.accepted
        verdict.proposed = self.proposer.draft_in_step(
            verdict.hidden, self.cache, last, verdict.inputs, verdict.next_token, draws
        )
        self.draft_timer.stop()
        return verdict

    def commit(
        self, step: Step, verdict: Verdict, draws: Tensor | None
    ) -> tuple[tuple[list[int], list[list[int]], Tensor] | None, Tensor | None]:
        """Keep what each row accepted in the cache, emit its tokens, and drop the rows that finished: (the rows'
        accepted counts, emitted tokens and next token; None once every row is done) and the step's uniforms of the
        rows that go on."""
        cache, stats, plan = self.cache, self.stats, self.plan
        accepted, base, inputs = verdict.accepted, step.base, verdict.inputs
        held, held_on_device = cache.host_lengths, cache.lengths
        proposed = torch.full_like(accepted, plan.step_drafts) if verdict.proposed is None else verdict.proposed
        cache.commit(inputs.size(1))
        stats.forwards, stats.row_forwards = stats.forwards + 1, stats.row_forwards + len(self.rows.index)
        # the one device-to-host transfer of the step: what each row accepted and emitted, and will draft next
        pending = inputs[:, 1:] if step.n_drafts else base[:, None]
        node = verdict.node if verdict.node is not None else torch.zeros_like(accepted)
        host = torch.cat([torch.stack([accepted, verdict.next_token, proposed, node], 1), pending], 1).tolist()
        if stats.forwards == 1:
            stats.prefill_s = time.perf_counter() - self.start
        # keep the last accepted input and everything before it: base + accepted + 1 new positions
        kept = [held[i] + h[0] + 1 + step.first_base[i] for i, h in enumerate(host)]
        cache.rollback(kept, held_on_device + base + accepted + 1)  # the same, computed where it is used
        keep, accepted_counts, emitted_rows = self.rows.emit(host, step.n_drafts, self.tree is not None, stats)
        if not keep:
            return None, draws
        next_token = verdict.next_token
        if len(keep) < len(host):  # finished rows leave the batch
            index = torch.tensor(keep, device=self.device)
            cache.keep_rows(keep)
            self.proposer.keep_rows(keep, index)
            if self.uniforms is not None:
                self.uniforms.keep_rows(index)
                draws = draws[index]
            next_token = next_token[index]
        return (accepted_counts, emitted_rows, next_token), draws

    def propose(self, accepted: list[int], emitted: list[list[int]], next_token: Tensor, draws: Tensor | None) -> Step:
        """The next step: each row's token after its accepted drafts, then the proposer's drafts (the heads' were
        made in :meth:`verify`; a drafter drafts here, once the step's tokens are known)."""
        rows, rule, proposer = self.rows, self.rule, self.proposer
        proposer.advance(accepted, emitted)
        self.draft_timer.start()
        proposal = proposer.propose(max(rows.verifying), rule.layout.drafter(draws) if draws is not None else None)
        self.draft_timer.stop()
        if proposal.counts is not None:
            rows.verifying = [min(v, n) for v, n in zip(rows.verifying, proposal.counts, strict=True)]
        verifying = rows.verifying
        # the next step verifies what its deepest row drafts; the rest of its rows only their own
        reuse = proposal.live is not None and not self.plan.drafts.adaptive_drafts  # then it equals verifying
        live = proposal.live if reuse else torch.tensor(verifying, device=self.device)
        n_drafts = self.tree.nodes_up_to(max(verifying)) if self.tree is not None else max(verifying)
        inputs = torch.cat([next_token[:, None], proposal.tokens[:, :n_drafts]], dim=1)
        base = torch.zeros(len(verifying), dtype=torch.long, device=self.device)
        return Step(inputs, base, [0] * len(verifying), n_drafts, live, proposal)

    def finish(self) -> tuple[list[list[int]], DecodeStats]:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        stats = self.stats
        stats.wall_time_s = time.perf_counter() - self.start
        stats.tokens = sum(map(len, self.rows.outputs))
        stats.draft_forwards = self.proposer.forwards
        stats.draft_s = self.draft_timer.seconds()
        if self.captured is not None:
            graphs = self.inference.graphs
            stats.captures, stats.capture_s = graphs.captures - self.captured[0], graphs.capture_s - self.captured[1]
        return self.rows.outputs, stats


class _Rows:
    """The rows on the host: each live row's prompt index and the drafts it verifies in this step; every row's new
    tokens and draft count for its next step (adaptive drafting's)."""

    def __init__(self, count: int, plan: Plan) -> None:
        self.plan, self.index, self.verifying = plan, list(range(count)), [0] * count
        self.outputs: list[list[int]] = [[] for _ in range(count)]
        self.planned = [plan.step_drafts] * count

    def emit(
        self, host: list[list[int]], n_drafts: int, tree: bool, stats: DecodeStats
    ) -> tuple[list[int], list[int], list[list[int]]]:
        """Record a step (``host``: per live row its accepted drafts, the token after them, the drafts it has next,
        its accepted tree node, then the step's pending inputs); returns which live rows go on, and what each of them
        accepted and emitted. A row ends at EOS or its length budget."""
        plan, keep, accepted, emitted, verifying = self.plan, [], [], [], []
        for i, (n_accepted, token, next_live, at_node, *path_tokens) in enumerate(host):
            row, verified = self.index[i], self.verifying[i] if n_drafts else 0
            stats.record(verified, n_accepted, at_node if tree and n_drafts else None)
            if plan.drafts.adaptive_drafts and n_drafts:
                grown = self.planned[row] + 2 if n_accepted == verified else self.planned[row] - 1
                self.planned[row] = min(plan.step_drafts, max(1, grown))
            verifying.append(min(next_live, self.planned[row]))
            accepted.append(n_accepted)
            emitted.append((path_tokens[:n_accepted] if n_drafts else []) + [token])
            if _extend(self.outputs[row], emitted[-1], plan.sampling):
                keep.append(i)
        self.index, self.verifying = [self.index[i] for i in keep], [verifying[i] for i in keep]
        return keep, [accepted[i] for i in keep], [emitted[i] for i in keep]


def _verify(inference: InferenceModel, cache: KVCache, rule: Rule, tree, step: Step, draws: Tensor | None) -> Verdict:
    """One forward of the target over the step's inputs (B, S) and its rule's verdict (:class:`Verdict`)."""
    inputs, base, n_drafts, live, proposal = step.inputs, step.base, step.n_drafts, step.live, step.proposal
    probs = proposal.probs if proposal is not None else None
    if tree is not None and n_drafts:
        cache.begin(inputs.size(1), tree.tensors(inputs.device))
        head1, slot, after, hidden = inference.verify_tree(inputs, cache, tree)
        laws = NodeLaws(probs, proposal.law_index, proposal.distinct) if probs is not None else None
        accepted, next_token, path = rule.tree(TreeVerification(head1, slot, after, inputs, tree, live), laws, draws)
        cache.keep_path(path, inference.path_slots)
        inputs = inputs.gather(1, path)  # (B, depth + 1): the accepted path (then its last node repeated)
        hidden = hidden.gather(1, path[..., None].expand(-1, -1, hidden.size(-1)))
        cache.begin(inputs.size(1))  # the draft heads read the accepted path as the sequence it is
        return Verdict(accepted, next_token, path[:, -1], inputs, hidden)
    cache.begin(inputs.size(1))
    # head 1's logits where drafts are verified: after the last accepted input (base) and each pending draft
    head1, hidden = inference.verify(inputs, cache, None if n_drafts else base[:, None])  # (B, n_drafts + 1, V)
    if n_drafts:
        accepted, next_token = rule.chain(head1, inputs[:, 1:], live, probs, draws)
    else:
        accepted, next_token = torch.zeros_like(base), rule.first(head1[:, 0], draws)
    return Verdict(accepted, next_token, None, inputs, hidden)


def _extend(output: list[int], emitted: list[int], config: GenerationConfig) -> bool:
    """Append emitted tokens up to EOS or the length budget; True while the row goes on."""
    for token in emitted:
        if token == config.eos_id:
            return False
        output.append(token)
        if len(output) >= config.max_new_tokens:
            return False
    return True
