"""The decoding loop: verify -> accept -> propose -> roll back -> emit -> drop finished rows.

Each step is ONE forward of the target over [last accepted token, pending drafts] per row (the engine,
:mod:`mtp.decode.inference`). Head 1's outputs there verify the drafts under an acceptance rule
(:mod:`mtp.decode.acceptance`: greedy-exact, lossless or typical, for a chain or a tree); a proposer
(:mod:`mtp.decode.proposers`) drafts the next step's tokens: the target's own heads from this step's forward, or a
drafter (draft model, layer skip, prompt lookup) once the step's tokens are known. The cache is rolled back to the
accepted length. With ``heads=1`` and no drafter there are no drafts: plain autoregressive decoding on the same cache
and kernels, the baseline speed-ups are measured against. A step too large for the memory available (a huge tree,
batch or prompt) is refused before anything runs (:func:`mtp.decode.memory.check_step_fits`).

With a draft tree (``config.tree``, :mod:`mtp.decode.tree`) a step verifies several candidates per depth at once:
the input is [the token head 1 chose, the tree's nodes] under a tree attention mask, the longest accepted path wins,
its keys and values are moved where a sequence would have them, and the heads draft the next tree from its last
node. ``draft_p_min`` and ``adaptive_drafts`` size each row's drafts from the drafts alone, so greedy output stays
exact and sampling lossless. The first step is the prompt itself (right-padded to the longest), so prefill also
drafts.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from mtp.decode.acceptance import NodeLaws, Rule, TreeVerification, rule_for
from mtp.decode.cache import KVCache
from mtp.decode.inference import InferenceModel
from mtp.decode.memory import check_step_fits
from mtp.decode.proposers import HeadsProposer, HybridProposer, ModelDrafter, Proposal, Proposer
from mtp.decode.sampling import RowUniforms
from mtp.decode.settings import GenerationConfig
from mtp.decode.stats import DecodeStats, SpanTimer
from mtp.model import MTPModel


@torch.inference_mode()
def generate(
    model: MTPModel, prompts: list[list[int]], config: GenerationConfig, drafter: Proposer | None = None
) -> tuple[list[list[int]], DecodeStats]:
    """Continue every prompt (a list of token ids each) by up to ``max_new_tokens`` tokens; rows are independent.
    With ``drafter`` (and ``config.gamma`` > 0) the drafts come from it instead of the heads."""
    if (drafter is not None) != (config.gamma > 0):
        raise ValueError("pass a drafter together with gamma > 0 (and gamma only with a drafter)")
    config.check_for(model.config, prompts)
    device, tree, rule = next(model.parameters()).device, config.step_tree, rule_for(config)
    config.check_device(device)
    longest, nodes = max(map(len, prompts)), tree.size if tree is not None else 0
    max_len = config.cache_length(longest)
    dtype = model.tok_embeddings.weight.dtype
    # a drafting step (head 1's logits everywhere), then the prompts' step (logits at each row's last position only)
    check_step_fits(model.config, len(prompts), max_len, 1 + (nodes or config.drafts), nodes, device, dtype)
    check_step_fits(model.config, len(prompts), max_len, longest, 0, device, dtype, logit_positions=1)
    heads_tree = tree is not None and not config.gamma  # the heads draft the tree (else a drafter, or a hybrid)
    heads = tree.depth + 1 if heads_tree else config.heads
    heads_dtype = config.draft_dtype if drafter is None or config.hybrid else "auto"  # the heads' drafts' precision
    inference = InferenceModel.of(model, heads, config.compile, heads_dtype, config.draft_vocab)
    proposer = _proposer(drafter, inference, config)
    stats = DecodeStats(
        rows=len(prompts), drafted=[0] * config.drafts, accepted=[0] * config.drafts,
        tree_nodes=tree.size if tree is not None else 0, acceptance_rule=rule.name, method=proposer.method,
        method_params={"gamma": str(config.gamma), **proposer.params()} if drafter is not None else {},
    )  # fmt: skip
    rows = _Rows(len(prompts), config)
    cache = inference.new_cache(len(prompts), max_len)
    steps, per_step = config.max_new_tokens + 1, rule.layout.per_step  # every step emits a token, the prompt's too
    uniforms = None if config.greedy else RowUniforms(config.seed, len(prompts), steps, per_step, device)
    proposer.start(prompts, max_len, config)  # a drafter's cache allocated outside the timed part, as the target's is
    draft_timer = SpanTimer(device)
    start = time.perf_counter()

    # Step 0: the prompts. Every prompt token counts as accepted; the last one is each row's base position.
    inputs = torch.tensor([p + [0] * (longest - len(p)) for p in prompts], device=device)
    first_base = [len(p) - 1 for p in prompts]
    base = torch.tensor(first_base, device=device)
    n_drafts, proposal, live = 0, None, None  # live: drafts (chain) or depths (tree) each row verifies, on the device
    while True:
        held, held_on_device = cache.host_lengths, cache.lengths
        draws = uniforms.next(per_step) if uniforms is not None else None
        accepted, next_token, node, inputs, hidden = _verify(
            inference, cache, rule, tree, inputs, base, n_drafts, live, proposal, draws
        )
        draft_timer.start()  # the heads draft here, inside the step; a drafter below, between steps
        proposed = proposer.draft_in_step(hidden, cache, base + accepted, inputs, next_token, draws)
        draft_timer.stop()
        proposed = torch.full_like(accepted, config.drafts) if proposed is None else proposed
        cache.commit(inputs.size(1))
        stats.forwards, stats.row_forwards = stats.forwards + 1, stats.row_forwards + len(rows.index)
        # the one device-to-host transfer of the step: what each row accepted and emitted, and will draft next
        pending = inputs[:, 1:] if n_drafts else base[:, None]
        node = node if node is not None else torch.zeros_like(accepted)
        host = torch.cat([torch.stack([accepted, next_token, proposed, node], 1), pending], 1).tolist()
        if stats.forwards == 1:
            stats.prefill_s = time.perf_counter() - start
        # keep the last accepted input and everything before it: base + accepted + 1 new positions
        kept = [held[i] + h[0] + 1 + first_base[i] for i, h in enumerate(host)]
        cache.rollback(kept, held_on_device + base + accepted + 1)  # the same, computed where it is used

        keep, accepted_counts, emitted_rows = rows.emit(host, n_drafts, tree is not None, stats)
        if not keep:
            break
        if len(keep) < len(host):  # finished rows leave the batch
            index = torch.tensor(keep, device=device)
            cache.keep_rows(keep)
            proposer.keep_rows(keep, index)
            if uniforms is not None:
                uniforms.keep_rows(index)
                draws = draws[index]
            next_token = next_token[index]
        proposer.advance(accepted_counts, emitted_rows)
        draft_timer.start()
        proposal = proposer.propose(max(rows.verifying), rule.layout.drafter(draws) if draws is not None else None)
        draft_timer.stop()
        if proposal.counts is not None:
            rows.verifying = [min(v, n) for v, n in zip(rows.verifying, proposal.counts, strict=True)]
        verifying = rows.verifying
        # the next step verifies what its deepest row drafts; the rest of its rows only their own
        reuse = proposal.live is not None and not config.adaptive_drafts  # then it equals verifying, on the device
        live = proposal.live if reuse else torch.tensor(verifying, device=device)
        n_drafts = tree.nodes_up_to(max(verifying)) if tree is not None else max(verifying)
        inputs = torch.cat([next_token[:, None], proposal.tokens[:, :n_drafts]], dim=1)
        first_base, base = [0] * len(verifying), torch.zeros(len(verifying), dtype=torch.long, device=device)

    if device.type == "cuda":
        torch.cuda.synchronize()
    stats.wall_time_s = time.perf_counter() - start
    stats.tokens = sum(map(len, rows.outputs))
    stats.draft_forwards = proposer.forwards
    stats.draft_s = draft_timer.seconds()
    return rows.outputs, stats


def _proposer(drafter: Proposer | None, inference: InferenceModel, config: GenerationConfig) -> Proposer:
    """Who drafts: the heads, the drafter, or both in a hybrid step (a drafter with ``heads`` above 1)."""
    if drafter is None:
        return HeadsProposer(inference, config)
    if not config.hybrid:
        return drafter
    if not isinstance(drafter, ModelDrafter):
        raise ValueError(f"a {drafter.method} drafter does not draft beside the heads; only a model drafter does")
    return HybridProposer(drafter, HeadsProposer(inference, config))


class _Rows:
    """The rows on the host: each live row's prompt index and the drafts it verifies in this step; every row's new
    tokens and draft count for its next step (adaptive drafting's)."""

    def __init__(self, count: int, config: GenerationConfig) -> None:
        self.config, self.index, self.verifying = config, list(range(count)), [0] * count
        self.outputs: list[list[int]] = [[] for _ in range(count)]
        self.planned = [config.drafts] * count

    def emit(
        self, host: list[list[int]], n_drafts: int, tree: bool, stats: DecodeStats
    ) -> tuple[list[int], list[int], list[list[int]]]:
        """Record a step (``host``: per live row its accepted drafts, the token after them, the drafts it has next,
        its accepted tree node, then the step's pending inputs); returns which live rows go on, and what each of them
        accepted and emitted. A row ends at EOS or its length budget."""
        config, keep, accepted, emitted, verifying = self.config, [], [], [], []
        for i, (n_accepted, token, next_live, at_node, *path_tokens) in enumerate(host):
            row, verified = self.index[i], self.verifying[i] if n_drafts else 0
            stats.record(verified, n_accepted, at_node if tree and n_drafts else None)
            if config.adaptive_drafts and n_drafts:
                grown = self.planned[row] + 2 if n_accepted == verified else self.planned[row] - 1
                self.planned[row] = min(config.drafts, max(1, grown))
            verifying.append(min(next_live, self.planned[row]))
            accepted.append(n_accepted)
            emitted.append((path_tokens[:n_accepted] if n_drafts else []) + [token])
            if _extend(self.outputs[row], emitted[-1], config):
                keep.append(i)
        self.index, self.verifying = [self.index[i] for i in keep], [verifying[i] for i in keep]
        return keep, [accepted[i] for i in keep], [emitted[i] for i in keep]


def _verify(
    inference: InferenceModel,
    cache: KVCache,
    rule: Rule,
    tree,
    inputs: Tensor,
    base: Tensor,
    n_drafts: int,
    live: Tensor | None,
    proposal: Proposal | None,
    draws: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor | None, Tensor, Tensor]:
    """One forward of the target over the step's ``inputs`` (B, S) and its rule's verdict: accepted drafts (depth)
    (B,), the token after them (B,), the accepted tree node (B,) (None: a chain), the step's accepted inputs (a tree
    step's path, which the cache now holds where a sequence would) and what the draft heads read there (B, S', d).
    ``base`` (B,): each row's last accepted input; the ``n_drafts`` inputs after it are drafts."""
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
        return accepted, next_token, path[:, -1], inputs, hidden
    cache.begin(inputs.size(1))
    # head 1's logits where drafts are verified: after the last accepted input (base) and each pending draft
    head1, hidden = inference.verify(inputs, cache, None if n_drafts else base[:, None])  # (B, n_drafts + 1, V)
    if n_drafts:
        accepted, next_token = rule.chain(head1, inputs[:, 1:], live, probs, draws)
    else:
        accepted, next_token = torch.zeros_like(base), rule.first(head1[:, 0], draws)
    return accepted, next_token, None, inputs, hidden


def _extend(output: list[int], emitted: list[int], config: GenerationConfig) -> bool:
    """Append emitted tokens up to EOS or the length budget; True while the row goes on."""
    for token in emitted:
        if token == config.eos_id:
            return False
        output.append(token)
        if len(output) >= config.max_new_tokens:
            return False
    return True
