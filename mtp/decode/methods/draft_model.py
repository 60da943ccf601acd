"""A draft model (speculative sampling with a smaller mtp model on the target's tokenizer: Leviathan et al. 2023;
Chen et al. 2023), decoded plainly or itself speculatively (staged: its own drafts from prompt lookup or from its
heads), and beside the target's heads (hybrid): its proposers and its method.

- :class:`ModelDrafter` drafts gamma tokens autoregressively with head 1 of a model's inference form, on its own KV
  cache, which follows the accepted tokens: after a step it keeps the drafts it had read that the target accepted, and
  reads what it has not seen (the token after them) at the start of its next proposal. Sampling with lossless
  acceptance, each draft is drawn from the draft's processed distribution p (temperature and top-k as the target's,
  top-p unless ``draft_choice="tempered"``) and p is returned with it; otherwise the top-ranked tokens are drafted.
  With ``draft_dtype="int8"`` the form computes with int8 matrices (:mod:`mtp.decode.int8`), with ``quantize`` with
  the target's quantized ones (:mod:`mtp.decode.quantize`). Layer skip drafts with
  the same class on the target's own form (:mod:`mtp.decode.methods.layer_skip`).
- :class:`StagedDrafter` (:class:`StagedLookup`, :class:`StagedHeads`): the draft model's own drafts decoded
  speculatively.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from mtp.checkpoint.load import LoadedCheckpoint, load_checkpoint
from mtp.data.packing import TokenizerConfig
from mtp.decode.acceptance import Greedy, Lossless
from mtp.decode.heads_proposer import HeadsProposer
from mtp.decode.inference import InferenceModel, SkippingForm
from mtp.decode.methods.base import DecodingMethod, Target, register
from mtp.decode.plan import DEFAULT_GAMMA, Plan, Proposal, Proposer
from mtp.decode.sampling import Draws, RandomLayout, RowUniforms, processed_probs, sample_from, top_tokens
from mtp.decode.settings import DraftSettings, HeadsSettings
from mtp.errors import SettingError, Trained, UserError, literal
from mtp.model import MTPModel
from mtp.model.config import ModelConfig


class ModelDrafter(Proposer):
    """Autoregressive drafting with head 1 of an inference form (a draft model's, or the target's with blocks
    skipped) on a KV cache of its own; the plan's ``draft_dtype`` picks the form's precision at each ``start`` (its int8
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

    def start(self, prompts: list[list[int]], max_len: int, plan: Plan | None = None) -> None:
        super().start(prompts, max_len, plan)
        if max_len > self.context:
            raise SettingError(
                f"the draft model's context ({self.context} tokens) is below the {max_len} decoding needs; shorten "
                "the prompt or lower {max_new_tokens:name}.",
                max_new_tokens=plan.sampling.max_new_tokens if plan is not None else None,
            )
        int8 = plan is not None and plan.drafts.draft_dtype == "int8"
        quantize = plan.step.quantize if plan is not None else "none"
        if quantize != "none":  # the target's precision, drafts included
            self.drafting = self.form.quantized(quantize)
        else:
            self.drafting = self.form.int8_drafter() if int8 else self.form
        self.cache = self.drafting.new_cache(len(prompts), max_len)
        self.unread = [list(p) for p in prompts]  # tokens of each row not in the cache yet
        self.held = [0] * len(prompts)  # cache positions that hold accepted tokens
        self.read_drafts = [0] * len(prompts)  # drafts the last proposal read into each row's cache
        self.forwards = 0
        self.branches = plan.drafts.drafts_per_step if plan is not None else 1
        # a step that verifies a tree (k chains, or a hybrid's) keeps none of the drafts read: which chain the accepted
        # tokens came from is not known here
        self.tree = plan.step_tree if plan is not None else None

    def check_weights(self, plan: Plan) -> None:
        form = self.form
        plan.step.check_model(form.config, form.embeddings.device, form.embeddings.dtype)

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
        form, cache, plan, k = self.drafting, self.cache, self.plan, self.branches
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
                top_p, sampling = plan.proposal_top_p(logits.device, heads=False), plan.sampling
                proposals.append(processed_probs(logits, sampling.temperature, sampling.top_k, top_p))
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
    speculatively, verified by the draft's head 1 with the exact rules (greedy, or lossless sampling); where its inner
    drafts come from is a subclass's: prompt lookup over the row's tokens (:class:`StagedLookup`) or the draft
    model's own heads (:class:`StagedHeads`, a draft trained as mtp2 or mtp4). The drafts are then exactly the draft
    model's autoregressive ones (greedy), or distributed as them (sampling), in fewer draft forwards, and the law of
    each is the draft's head-1 distribution after the ones before it: what the target's step verifies them against."""

    method = "staged"
    inner: ClassVar[str]
    """Where its inner drafts come from, for the statistics."""
    inner_heads: ClassVar[bool] = False
    """Its inner drafts are the draft model's heads' (drafted in its inner steps' forwards)."""

    def __init__(self, form: InferenceModel, gamma: int = DEFAULT_GAMMA) -> None:
        super().__init__(form, "staged", {"inner": self.inner}, gamma)

    @staticmethod
    def check_plan(plan: Plan) -> None:
        if plan.drafts.drafts_per_step > 1:
            raise SettingError(
                "a staged draft decodes one sequence of its own; use {drafts_per_step:1} with it.",
                drafts_per_step=plan.drafts.drafts_per_step,
            )
        if not plan.sampling.greedy and plan.drafts.draft_choice in ("top", "tempered"):
            raise SettingError(
                "a staged draft samples its drafts as the draft model would, and {draft_choice} asks for other ones; "
                "use {draft_choice:auto} with it.",
                draft_choice=plan.drafts.draft_choice,
            )

    def start(self, prompts: list[list[int]], max_len: int, plan: Plan | None = None) -> None:
        plan = plan or Plan(drafter=self)
        super().start(prompts, max_len, plan)
        self.sequence = [list(p) for p in prompts]  # each row's accepted tokens: what lookup searches
        sampling = replace(plan.sampling, acceptance="exact")
        heads = HeadsSettings(self.form.heads if self.inner_heads else 1)
        inner = Plan(sampling, heads, drafts=DraftSettings(draft_choice=plan.drafts.draft_choice))
        self.heads = HeadsProposer(inner) if self.inner_heads else None
        width = heads.heads - 1 if self.inner_heads else self.gamma  # drafts an inner step verifies at most
        layout = RandomLayout.of(width, self.heads.draws(inner) if self.heads is not None else Draws())
        self.rule = Greedy(sampling, layout) if sampling.greedy else Lossless(sampling, layout)
        if self.heads is not None:
            self.heads.join(self.drafting)  # the draft model's own heads, out of its inner steps' forwards
            self.heads.lay_out(layout)
            self.heads.start(prompts, max_len, inner)
        steps = (plan.sampling.max_new_tokens + 1) * (self.gamma + 1)  # inner steps: each emits a token at least
        self.uniforms = None
        if self.sampled:
            seed = plan.sampling.seed + STAGED_SEED_OFFSET
            self.uniforms = RowUniforms(seed, len(prompts), steps, layout.per_step, self.device)

    def next_inner(self, sequence: list[int], gamma: int) -> list[int]:
        """A row's inner drafts after an inner step, of its tokens so far (``sequence``), where they do not come out
        of the step's forward (the heads' do)."""
        raise NotImplementedError

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
                    pending[b] = self.next_inner(self.sequence[b] + out[b], gamma)
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


def lookup_continuation(tokens: list[int], ngram: int, gamma: int) -> list[int]:
    """Up to ``gamma`` tokens that followed the latest earlier occurrence of the last n tokens (n from ``ngram`` down
    to 1), copied with overlap past the end: prompt lookup's drafts
    (:class:`~mtp.decode.methods.prompt_lookup.LookupDrafter`, which keeps an index of the n-grams), a staged draft's
    inner ones."""
    for n in range(min(ngram, len(tokens) - 1), 0, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == tail:
                period = len(tokens) - (start + n)
                return [tokens[start + n + i % period] for i in range(gamma)]
    return []


class StagedLookup(StagedDrafter):
    """A staged draft whose inner drafts are prompt lookup's over the row's tokens (the longest n-gram ``ngram``)."""

    inner = "lookup"

    def __init__(self, form: InferenceModel, ngram: int = 3, gamma: int = DEFAULT_GAMMA) -> None:
        super().__init__(form, gamma)
        self.ngram = ngram

    def next_inner(self, sequence: list[int], gamma: int) -> list[int]:
        return lookup_continuation(sequence, self.ngram, gamma)


class StagedHeads(StagedDrafter):
    """A staged draft whose inner drafts are the draft model's own heads' (all of them: a draft trained as mtp2 or
    mtp4)."""

    inner = "heads"
    inner_heads = True

    def __init__(self, form: InferenceModel, gamma: int = DEFAULT_GAMMA) -> None:
        if form.heads < 2:
            raise ValueError("a staged draft that drafts with its heads needs a draft model with more than one head")
        super().__init__(form, gamma)


STAGED: dict[str, type[StagedDrafter]] = {"lookup": StagedLookup, "heads": StagedHeads}
"""The staged drafter of each choice of :attr:`DraftModelSettings.staged`."""


def draft_model_drafter(draft: MTPModel, compile: bool = False, gamma: int = DEFAULT_GAMMA) -> ModelDrafter:
    """Speculative sampling with ``draft`` (head 1 of any mtp model on the target's tokenizer), ``gamma`` drafts a
    step."""
    return ModelDrafter(InferenceModel.of(draft, 1, compile), "draft", gamma=gamma)


def staged_drafter(draft: MTPModel, inner: str, compile: bool = False, gamma: int = DEFAULT_GAMMA) -> StagedDrafter:
    """Staged speculative decoding with ``draft``, its own drafts from prompt lookup (``inner="lookup"``) or from its
    heads (``inner="heads"``: all of them), ``gamma`` drafts a step."""
    kind = STAGED[inner]
    heads = draft.config.n_future if kind.inner_heads else 1
    return kind(InferenceModel.of(draft, heads, compile), gamma=gamma)


def load_draft(path: Path, target: LoadedCheckpoint, device: torch.device, dtype: str) -> LoadedCheckpoint:
    """A draft checkpoint for ``target``: an mtp checkpoint with the same tokenizer and vocabulary (a
    :class:`~mtp.errors.SettingError` naming ``draft`` otherwise)."""
    try:
        draft = load_checkpoint(path, device, dtype)
    except UserError as err:
        raise SettingError("{draft:name}: " + literal(err), draft=path) from err
    if draft.tokenizer.to_str() != target.tokenizer.to_str():
        raise SettingError(
            "{draft} has a different tokenizer from the target's; train the draft on the target's tokenizer "
            "({kind} {path}).",
            draft=path,
            kind=Trained(TokenizerConfig, "pretrained"),
            path=Trained(TokenizerConfig, "TARGET.ckpt"),
        )
    if draft.config.vocab_size != target.config.vocab_size:
        raise SettingError(
            f"{{draft}} has {{vocab_size:{draft.config.vocab_size}}} but the target has {target.config.vocab_size}; "
            "train the draft with {vocab_size}.",
            draft=path,
            vocab_size=Trained(ModelConfig, target.config.vocab_size),
        )
    return draft


def staged_draft(
    path: Path, draft: LoadedCheckpoint, inner: str, compile: bool = False, gamma: int = DEFAULT_GAMMA
) -> StagedDrafter:
    """The staged drafter of the draft ``path`` staged with ``inner``: the draft model's own drafts from prompt lookup
    or from its heads, which it must have."""
    if STAGED[inner].inner_heads and draft.config.n_future < 2:
        raise SettingError(
            "{staged} drafts with the draft model's own heads, and {draft} has one; train the draft with model=mtp2 "
            "(or mtp4), or use {staged:lookup}.",
            staged=inner,
            draft=path,
        )
    return staged_drafter(draft.model, inner, compile, gamma)


@dataclass
class DraftModelSettings:
    draft: Path | None = None
    """Draft with this checkpoint (same tokenizer; e.g. a tiny mtp1), verify with CKPT."""
    staged: Literal["lookup", "heads"] | None = None
    """Decode the draft model speculatively too, its own drafts from prompt lookup or from its heads (a draft trained
    as mtp2 or mtp4)."""

    def __post_init__(self) -> None:
        if self.staged is not None and self.draft is None:
            raise SettingError(
                "{staged:name} decodes a draft model speculatively; give it with {draft:name} DRAFT.ckpt.",
                staged=self.staged,
                draft=self.draft,
            )


@register
class DraftModel(DecodingMethod):
    """A draft model drafts gamma tokens a step (Leviathan et al. 2023), staged or beside the heads."""

    name = "draft"
    settings = DraftModelSettings
    selected_by = "draft"
    beside_heads = True

    def proposer_class(self) -> type[Proposer]:
        return STAGED[self.options.staged] if self.options.staged is not None else ModelDrafter

    def proposer(self, target: Target) -> Proposer:
        options = self.options
        draft = load_draft(options.draft, target.loaded, target.device, target.dtype)
        if options.staged is not None:
            return staged_draft(options.draft, draft, options.staged, target.compile)
        return draft_model_drafter(draft.model, target.compile)
