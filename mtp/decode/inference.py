"""The model's inference form: the same math as MTPModel, packed for cached decoding with few, large operations.

Built once per model, head count and compile setting (:meth:`InferenceModel.of`) from an :class:`MTPModel`: the
verification path (the trunk and head 1) as packed blocks and head 1's unembedding (:mod:`mtp.decode.packed`: every
norm's weight folded into the matrix that reads it, q/k/v and gate/up as one matrix each, the products in the
layout that reads the weights fastest), and the draft heads as their type's form (:mod:`mtp.decode.head_forms`).
With int8 drafts (``draft_dtype="int8"``, CPU), the draft side multiplies int8 copies of its matrices
(:mod:`mtp.decode.int8`): the draft heads' and their unembedding (:meth:`InferenceModel.with_int8_drafts`, which
shares the verification path and head 1's unembedding, at full precision), or a drafter's whole form
(:meth:`InferenceModel.int8_drafter`). A quantized target (``quantize="int8"`` or ``"int4"``, CPU) multiplies
quantized copies of every matrix, the path's, head 1's and the draft heads' (:meth:`InferenceModel.quantized`,
:mod:`mtp.decode.quantize`), so that its verifying and drafting forwards read the same weights.

One step is split where verification sits: :meth:`InferenceModel.verify` runs the trunk and head 1 over the
step's positions and returns head 1's logits there (and what the draft heads read); the caller picks each row's last
accepted position on the device; :meth:`InferenceModel.draft` then writes the draft heads' keys and values at
every position of the step (a head block's cache needs them) but runs the rest of those blocks, the norm and the
unembedding at that one position per row. Head 1's and the trunk's results equal the full forward's at the same
positions; so do the draft heads' at the positions asked for (``tests/decode/test_cache.py``).

A layer-skip draft (:meth:`InferenceModel.skipping`, :class:`SkippingForm`) is this form without some of the path's
attention and MLP sublayers, on the same packed weights.
"""

from __future__ import annotations

import copy
import gc
import weakref
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor

from mtp.decode.cache import KVCache
from mtp.decode.graphs import StepGraphs
from mtp.decode.head_forms import Chooser, HeadForm, head_form
from mtp.decode.memory import return_freed_memory
from mtp.decode.packed import (
    BY_INPUT,
    BY_WEIGHT,
    INT8_DRAFTS,
    MKL_PACKED,
    PackedBlocks,
    Unembedding,
    block_layout,
    block_step,
    compiled_block_step,
    compiled_step,
    feed_forward_step,
)
from mtp.decode.quantize import Quantize
from mtp.decode.settings import DraftDtype
from mtp.decode.tree import DraftTree
from mtp.model import MTPModel

LEAVES_UNEMBEDDED_AT_ONCE = 4
"""On CPU, a tree step unembeds head 1 after every node when the tree has at most this many leaves; with more, after
the nodes with children, then once more after the accepted node (:meth:`InferenceModel.verify_tree`). For an
unembedding of more than LARGE_UNEMBEDDING weights, at most one leaf."""
LARGE_UNEMBEDDING = 8_000_000
"""Weights (vocabulary x width) above which a row of head 1's unembedding costs about what a call does on CPU (SmolLM2's
49152 x 576 is above it, the default model's 8192 x 192 below): there the rows of leaves that are not accepted cost more
than a second call after the one that is, so a tree step unembeds one leaf at a time."""
SPAN_MULTIPLE = {"cuda": 128}
"""By device type: an eager step's attention spans the held positions and the step's rounded up to a multiple of this
(the rest masked), so that its shapes repeat from step to step: PyTorch prefers cuDNN's attention on Hopper and
Blackwell GPUs (with cuDNN above 9.15), which builds an execution plan for every new shape, and a span one position
longer every step is a new shape every step. On CPU, spans are exact (masked positions would cost compute)."""

CAPTURED_LENGTH_MULTIPLE = 256
"""With captured steps, a cache's length is rounded up to a multiple of this (within the model's context), so that
prompts of nearby lengths decode on the same storage and replay the same graphs (:mod:`mtp.decode.graphs`)."""

_built: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(heads, compile, ...): (weights, form)}

ATTENTION, FEED_FORWARD = "a", "m"
"""A block's two sublayers as a skip set names them: ``3a`` is block 3's attention, ``5m`` block 5's MLP."""
Sublayer = tuple[int, str]
"""(block index in head 1's path, ATTENTION or FEED_FORWARD)."""


def sublayers_of(skip: Iterable[int | Sublayer]) -> frozenset[Sublayer]:
    """A skip set as sublayers: a block index alone stands for both of its sublayers."""
    sublayers = set()
    for item in skip:
        if isinstance(item, int):
            sublayers |= {(item, ATTENTION), (item, FEED_FORWARD)}
        elif isinstance(item, tuple) and len(item) == 2 and item[1] in (ATTENTION, FEED_FORWARD):
            sublayers.add((int(item[0]), item[1]))
        else:
            raise ValueError(f"{item!r} is neither a block index nor a (block, 'a' or 'm') sublayer")
    return frozenset(sublayers)


def skip_label(skip: Iterable[int | Sublayer]) -> str:
    """A skip set as the flags write it, by block: ``3a,5m,7`` (block 7 whole)."""
    sublayers = sublayers_of(skip)
    parts = []
    for block in sorted({b for b, _ in sublayers}):
        halves = [half for half in (ATTENTION, FEED_FORWARD) if (block, half) in sublayers]
        parts.append(str(block) if len(halves) == 2 else f"{block}{halves[0]}")
    return ",".join(parts)


def head1_logits_at(output: Unembedding, eps: float, x: Tensor, read: Tensor | None = None) -> Tensor:
    """Head 1's logits through ``output`` (its unembedding, the final norm's weight folded in) of path outputs x
    (B, S, d), at each row's positions ``read`` (B, R) (None: every position)."""
    if read is not None:
        x = x[torch.arange(x.size(0), device=x.device)[:, None], read]  # (B, R, d)
    return output(F.rms_norm(x, (x.size(-1),), eps=eps))


class InferenceModel:
    """Cached decoding with an MTPModel's weights (shared, not copied, where no packing is needed)."""

    def __init__(
        self,
        model: MTPModel,
        heads: int,
        compile: bool = False,
        draft_first_ids: int = 0,
        cuda_graphs: bool = False,
        sharing: InferenceModel | None = None,
    ) -> None:
        config = model.config
        self.config, self.heads = config, heads
        self.eps = config.norm_eps
        self.embeddings = model.tok_embeddings.weight
        final_norm = model.norm.weight  # folded into the unembeddings, like every norm weight here
        # verification path: the trunk and head 1 (all of `layers`); a form of the same weights (``sharing``, another
        # head count or step) lends its own, with every copy derived from them (layouts, packings, quantized)
        if sharing is not None:
            self.path, self.head1_output = sharing.path, sharing.head1_output
        else:
            self.path = [PackedBlocks([block], config.n_heads, config.n_kv_heads) for block in model.layers]
            self.head1_output = Unembedding(model.unembedding(1).weight * final_norm)
        # the draft heads' shared unembedding: head 1's, or its rows of a reduced draft vocabulary, trained or the first
        # ``draft_first_ids`` token ids chosen here (then their logits are spread back over the whole vocabulary, -inf
        # elsewhere: a proposal with no mass outside the subset)
        self.vocab_size, self.draft_tokens = config.vocab_size, model.head_vocab(2) if heads > 1 else None
        self.draft_output = self.head1_output
        self.draft_rows = slice(None)  # the rows of a draft head's own unembedding (linear, medusa) it scores
        if self.draft_tokens is not None:
            self.draft_output = Unembedding(model.head_weight(2) * final_norm)
        elif draft_first_ids and heads > 1:
            self.draft_tokens = torch.arange(draft_first_ids, device=self.embeddings.device)
            self.draft_output = Unembedding(self.head1_output.weight[:draft_first_ids])
            self.draft_rows = slice(draft_first_ids)
        # rotary angles per position (max_seq_len, head_dim / 2): e^{i theta t} eager (fewest operations), as
        # (cos, sin) pairs (..., 2) compiled (inductor generates no code for complex numbers)
        if compile:
            self.rotations = torch.stack([model.rope_cos, model.rope_sin], dim=-1)
        else:
            self.rotations = torch.complex(model.rope_cos, model.rope_sin)
        self.compiled = compile
        # captured steps (mtp.decode.graphs): the verification step, and the parallel draft heads' part of it
        self.graphs = StepGraphs(self.embeddings.device) if cuda_graphs else None
        self.block_indices: dict[int, Tensor] = {}  # blocks -> (blocks, 1, 1) index of a block_step's cache slots
        self.block_step = compiled_block_step() if compile else block_step
        self.draft_dtype: DraftDtype = "auto"
        self.quantize: Quantize = "none"
        self._variants: dict[str, InferenceModel] = {}  # the quantized forms derived from this one, built once
        # heads 2..k as their type's form, and the path depths whose outputs they read (blocks applied: the trunk
        # output for parallel head blocks, the path's output for causal heads and those whose every block is trunk)
        self.drafter: HeadForm | None = head_form(model, self) if heads > 1 else None
        self.draft_inputs = self.drafter.reads(model) if self.drafter is not None else [len(model.layers)]

    @classmethod
    def of(
        cls,
        model: MTPModel,
        heads: int,
        compile: bool = False,
        draft_dtype: DraftDtype = "auto",
        draft_first_ids: int = 0,
        cuda_graphs: bool = False,
        quantize: Quantize = "none",
    ) -> InferenceModel:
        """The inference form of ``model`` for ``heads`` heads, its weights quantized to ``quantize`` (none: the
        model's own; :meth:`quantized`), its draft heads in ``draft_dtype`` scoring the first
        ``draft_first_ids`` token ids (0: a trained draft vocabulary, or every token): built once, reused while the
        weights (and buffers, such as a reduced draft vocabulary) stay the same, so repeated ``generate`` calls pay
        neither the packing nor a recompile; the forms kept for the same weights (other head counts, steps) share one
        verification path, the packed trunk and head 1's unembedding with every copy derived from them, so that
        decoding at k = 1..4 holds those copies once, not four times. The model says when they change
        (:attr:`MTPModel.weights_version`: a state dict loaded, or :meth:`MTPModel.weights_changed`, which whoever
        writes them in place calls: the training module after each optimizer step, the online updates after theirs); a
        tensor moved to another device or dtype is seen here, and the forms of weights it no longer has are dropped. An
        int8-drafts form is derived from the full-precision one (:meth:`with_int8_drafts`), whose verification path it
        shares; so is a quantized one, built once too. With ``cuda_graphs`` its steps are captured
        (:mod:`mtp.decode.graphs`), and the graphs kept with the form."""
        placed = tuple((t.device, t.dtype) for t in (*model.parameters(), *model.buffers()))
        weights = (model.weights_version, placed)
        built = _built.setdefault(model, {})
        for stale in [key for key, (seen, _) in built.items() if seen != weights]:  # of weights the model no longer has
            del built[stale]
        key = (heads, compile, draft_first_ids if heads > 1 else 0, cuda_graphs)
        if key not in built:  # the verification path of the forms kept for these weights, shared, not packed again
            sharing = next((form for _, form in built.values()), None)
            built[key] = (weights, cls(model, heads, compile, draft_first_ids, cuda_graphs, sharing))
        form = built[key][1]
        if quantize != "none":
            form = form.quantized(quantize)
        return form if draft_dtype == "auto" else form.with_int8_drafts()

    @staticmethod
    def release(model: MTPModel) -> None:
        """Drop every inference form built for ``model`` (:meth:`of`), with the copies of its weights they hold (packed,
        by layout, quantized) and their compiled steps: for a caller that decodes once in a while between weight
        updates, such as a training run's validation, where a kept form is rebuilt before its next use anyway and
        would only hold memory meanwhile. The next :meth:`of` builds again."""
        if _built.pop(model, None) is not None:
            gc.collect()  # a form and its drafter refer to each other: freed by the collector, not at the pop
            return_freed_memory()

    def _variant(self, name: str, build: Callable[[InferenceModel], None]) -> InferenceModel:
        """A copy of this form changed by ``build`` (in place on the copy), made once per form and ``name``."""
        if name not in self._variants:
            form = copy.copy(self)
            form._variants, form.block_indices, form.graphs = {}, {}, None
            build(form)
            self._variants[name] = form
        return self._variants[name]

    def with_int8_drafts(self) -> InferenceModel:
        """This form with its draft heads' matrices, and the unembedding they share, in int8 (on CPU); the path and head
        1's unembedding, which verify, stay this form's own, at full precision, so the output does not change."""
        assert self.drafter is not None, "a form without draft heads has nothing to draft in int8"

        def quantize(form: InferenceModel) -> None:
            form.draft_dtype = "int8"
            if not self.drafter.own_output:  # linear and medusa heads unembed with their own outputs
                form.draft_output = self.draft_output.to_precision(INT8_DRAFTS)
            form.drafter = self.drafter.to_precision(form, INT8_DRAFTS)

        return self._variant("int8 draft heads", quantize)

    def int8_drafter(self) -> InferenceModel:
        """This form, a drafter's (a draft model's, or the target's with blocks skipped), with its path's blocks and
        head 1's unembedding in int8 (on CPU; each packed block quantized once, whichever forms share it), and its own
        draft heads too when it has some (a staged draft's). Its head 1 is then no longer the model's: a form that only
        drafts."""
        return self._all_in(INT8_DRAFTS)

    def quantized(self, precision: Quantize) -> InferenceModel:
        """This form with every matrix quantized weight-only to ``precision`` (int8 or int4, CPU:
        :mod:`mtp.decode.quantize`): the path's blocks, head 1's unembedding, the draft heads' and their unembedding,
        each packed block quantized once whichever forms share it. Its verifying and drafting forwards read the same
        quantized weights, so its greedy output is its own autoregressive output (this form with one head), not the
        float model's."""
        return self._all_in(precision)

    def _all_in(self, precision: str) -> InferenceModel:
        """This form with every matrix in ``precision`` (:func:`mtp.decode.packed.matrices_in`), built once."""

        def quantize(form: InferenceModel) -> None:
            if precision == INT8_DRAFTS:
                form.draft_dtype = "int8"
            else:
                form.quantize = precision
            form.path = [blocks.to_precision(precision) for blocks in self.path]
            form.head1_output = self.head1_output.to_precision(precision)
            shared = self.draft_output is self.head1_output  # no reduced draft vocabulary
            form.draft_output = form.head1_output if shared else self.draft_output.to_precision(precision)
            if self.drafter is not None:  # the heads (a staged draft's verify nothing either)
                form.drafter = self.drafter.to_precision(form, precision)

        return self._variant(precision, quantize)

    def skipping(self, skip: Iterable[int | Sublayer]) -> SkippingForm:
        """This form without the path's sublayers in ``skip`` (whole blocks by index, or (block, ATTENTION or
        FEED_FORWARD)) and without draft heads: head 1 on less of its path, a layer-skip draft (Draft & Verify). The
        packed weights are shared with this form, not copied."""
        return SkippingForm(self, sublayers_of(skip))

    @property
    def path_slots(self) -> slice:
        """The cache slots of the verification path's blocks (trunk and head 1)."""
        return slice(0, len(self.path))

    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        """An empty cache for these blocks; compiled, attention spans every preallocated position (fixed shapes).
        With captured steps, its length is rounded up to a multiple of :data:`CAPTURED_LENGTH_MULTIPLE` and its
        storage is the one the form's graphs replay on (an earlier cache's of the same shape)."""
        extra_slots = self.drafter.cache_slots if self.drafter is not None else 0
        storage = None
        if self.graphs is not None:
            multiple = CAPTURED_LENGTH_MULTIPLE
            max_len = max(max_len, min(-(-max_len // multiple) * multiple, self.config.max_seq_len))
            storage = self.graphs.cache_storage
        cache = self.kv_cache(len(self.path) + extra_slots, batch_size, max_len, storage)
        if self.drafter is not None:
            self.drafter.prepare(cache, batch_size, max_len)
        return cache

    def kv_cache(self, slots: int, batch_size: int, max_len: int, storage: Callable | None = None) -> KVCache:
        config = self.config
        return KVCache(
            slots, batch_size, config.n_kv_heads, config.d_model // config.n_heads, max_len,
            self.embeddings.device, self.embeddings.dtype, full_span=self.compiled,
            span_multiple=SPAN_MULTIPLE.get(self.embeddings.device.type, 1), storage=storage,
        )  # fmt: skip

    # -- one step
    def verify(self, tokens: Tensor, cache: KVCache, read: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Head 1's logits (B, R, V) at the step's positions ``read`` (B, R) (default: all S), and what the draft heads
        read (B, S, d), for tokens (B, S) after each row's cached ones.

        The caller starts the step in ``cache`` (``cache.begin(S)``) before, and commits it after :meth:`draft`;
        this writes the keys and values of every block of the path. A prompt's step reads one position per row.
        With captured steps, every step but the prompts' replays a graph (whose outputs the next replay overwrites).
        """
        if self.graphs is not None and cache.max_length:  # the prompts' step (nothing held yet) runs eagerly
            head1, draft_input = self.graphs.run("verify", self._verify, cache, tokens, read)
            return head1, draft_input
        return self._verify(cache, tokens, read)

    def _verify(self, cache: KVCache, tokens: Tensor, read: Tensor | None) -> tuple[Tensor, Tensor]:
        x, draft_input = self.run_path(tokens, cache)
        return head1_logits_at(self.head1_output, self.eps, x, read), draft_input

    def run_path(self, tokens: Tensor, cache: KVCache) -> tuple[Tensor, Tensor]:
        """The path's output (B, S, d) before the final norm, and what the draft heads read: the path's states after
        the blocks :attr:`draft_inputs` counts, concatenated (B, S, d each)."""
        rotation = self.rotations[cache.rotary]  # (B, S, head_dim / 2)
        x = F.embedding(tokens, self.embeddings)
        read = {0: x}
        for i, blocks in enumerate(self.path):
            x = self.run_blocks(blocks, x[None], rotation, cache, slice(i, i + 1))[0]
            read[i + 1] = x
        inputs = [read[depth] for depth in self.draft_inputs]
        return x, inputs[0] if len(inputs) == 1 else torch.cat(inputs, dim=-1)

    def verify_tree(self, tokens: Tensor, cache: KVCache, tree: DraftTree) -> tuple[Tensor, Tensor, Callable, Tensor]:
        """A tree step's forward over [root, nodes] (``tokens`` (B, S), the cache begun with the tree's mask): head 1's
        logits where the step verifies (B, P, V), each node's index among them (S,) (-1: not there), ``after(nodes
        (B,))`` -> head 1's logits (B, V) after a node of each row, and what the draft heads read (B, S, d).

        One unembedding of all S positions costs on CPU about what one of fewer rows does (the weight streams once),
        and on other devices one call is cheaper than two; with many leaves on CPU (more than one where a row of the
        unembedding costs about what a call does: :data:`LARGE_UNEMBEDDING`), the rows of the leaves that are not
        accepted cost more than a second call after the accepted node (a leaf's logits are needed only when it
        wins)."""
        if self.graphs is not None and cache.max_length:
            x, hidden = self.graphs.run("tree path", lambda view, nodes: self.run_path(nodes, view), cache, tokens)
        else:
            x, hidden = self.run_path(tokens, cache)
        B, S, _ = x.shape
        rows = torch.arange(B, device=x.device)
        parents, slot = tree.parents_within(S, x.device)
        at_once = LEAVES_UNEMBEDDED_AT_ONCE
        if self.vocab_size * x.size(-1) > LARGE_UNEMBEDDING:
            at_once = min(at_once, 1)
        if x.device.type != "cpu" or S - len(parents) <= at_once:
            head1 = self.head1_logits(x)  # (B, S, V)
            return head1, torch.arange(S, device=x.device), lambda nodes: head1[rows, nodes], hidden
        return self.head1_logits(x[:, parents]), slot, lambda nodes: self.head1_logits(x[rows, nodes]), hidden

    def head1_logits(self, x: Tensor) -> Tensor:
        """Head 1's logits (..., V) of path outputs x (..., d)."""
        return head1_logits_at(self.head1_output, self.eps, x)

    def draft_logits(self, x: Tensor) -> Tensor:
        """The logits (..., V) of draft heads that share head 1's unembedding, from their hidden states x (..., d)."""
        return self.full_vocab(self.draft_output(F.rms_norm(x, (x.size(-1),), eps=self.eps)))

    def full_vocab(self, logits: Tensor) -> Tensor:
        """Draft logits over the whole vocabulary (..., V), from those over a reduced draft vocabulary (..., K)."""
        if self.draft_tokens is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.draft_tokens, logits)

    def draft(
        self, hidden: Tensor, cache: KVCache, last: Tensor, inputs: Tensor, next_token: Tensor, choose: Chooser
    ) -> Tensor:
        """Draft tokens (B, heads - 1) after each row's input ``last`` (B,) of the step and the token that follows it,
        ``next_token`` (B,): heads 2..k's logits there, turned into tokens by ``choose``. hidden: :meth:`verify`'s
        second output; inputs: the step's tokens (B, S). Called before the step is committed; the step ends with
        ``cache.rollback`` to the accepted lengths (held + last + 1), which causal depths' caches follow."""
        return self.drafter.draft(hidden, cache, last, inputs, next_token, choose)

    def run_blocks(
        self,
        w: PackedBlocks,
        x: Tensor,
        rotation: Tensor,
        cache: KVCache,
        slots: slice,
        last: Tensor | None = None,
        feed_forward: bool = True,
        attention_input: Tensor | None = None,
        at: tuple[Tensor, int, Tensor] | None = None,
    ) -> Tensor:
        """:func:`~mtp.decode.packed.block_step` on these blocks' slice of ``cache`` (compiled when this form is, unless
        the blocks are quantized: torch.compile does not see into the quantized operators), at the positions the cache's
        step began, or ``at``: (positions (B, S), span, mask (B, 1, S, span)) of the caller's."""
        if self.compiled:  # not a view: a view's base would enter dynamo's guards and cause needless recompiles
            x = x.detach()
            attention_input = attention_input.detach() if attention_input is not None else None
        blocks = slots.stop - slots.start
        if blocks not in self.block_indices:
            self.block_indices[blocks] = torch.arange(blocks, device=x.device)[:, None, None]
        positions, span, mask = at if at is not None else (cache.positions, cache.span, cache.mask)
        rows = torch.arange(positions.size(0), device=x.device)[:, None] if at is not None else cache.rows
        where = (self.block_indices[blocks], rows[None], positions[None])
        keys, values = cache.keys[slots], cache.values[slots]
        rows = x.size(1) * x.size(2)
        layout = self.block_layout(rows, x.dtype) if not w.quantized and x.device.type == "cpu" else BY_INPUT
        if layout == BY_WEIGHT:
            w = w.weight_major()
        elif layout == MKL_PACKED:
            w = w.packed_for(rows)
        step = block_step if w.quantized or w.packed_rows else self.block_step  # compile sees into neither operator
        return step(x, w, rotation, keys, values, where, span, mask, self.eps, last, feed_forward, attention_input)

    def block_layout(self, rows: int, dtype: torch.dtype) -> int:
        """How the path's matrices multiply ``rows`` rows fastest (CPU): :func:`mtp.decode.packed.block_layout`."""
        return block_layout(self.path, rows, dtype)


class SkippingForm:
    """A layer-skip draft (Draft & Verify): the target form's head 1 on its path without some sublayers, no draft heads,
    on a cache of its own. A block whose attention is skipped runs only its MLP residual and holds no cache slot; one
    whose MLP is skipped runs its attention residual only (its keys and values still go to the draft's cache); a block
    skipped whole is not run. It drafts as a drafter's form does (``verify``, ``new_cache``, ``int8_drafter``,
    ``quantized``) with the target's packed weights and steps (compiled ones included), which it holds, not copies."""

    heads, drafter, graphs = 1, None, None  # head 1 only; never captured (its steps are the drafter's, not verified)

    def __init__(self, target: InferenceModel, skip: frozenset[Sublayer], precision: str | None = None) -> None:
        self.target, self.skip = target, skip
        self.config, self.embeddings, self.vocab_size = target.config, target.embeddings, target.vocab_size
        self.draft_dtype: DraftDtype = "int8" if precision == INT8_DRAFTS else "auto"
        self.quantize: Quantize = precision if precision in ("int8", "int4") else "none"
        self.head1_output = target.head1_output.to_precision(precision) if precision else target.head1_output
        self.path: list[PackedBlocks] = []  # the blocks that run, whole or in part
        self.sublayers: list[tuple[slice | None, bool]] = []  # of each: its cache slot (None: no attention), its MLP
        self.attending = 0  # blocks that run attention: the cache's slots
        for i, blocks in enumerate(target.path):
            attention, feed_forward = (i, ATTENTION) not in skip, (i, FEED_FORWARD) not in skip
            if attention or feed_forward:
                self.path.append(blocks.to_precision(precision) if precision else blocks)
                self.sublayers.append((slice(self.attending, self.attending + 1) if attention else None, feed_forward))
                self.attending += attention
        self.feed_forward_step = compiled_step(feed_forward_step) if target.compiled else feed_forward_step
        self._variants: dict[str, SkippingForm] = {}  # precision -> this draft in it

    def int8_drafter(self) -> SkippingForm:
        """This draft with its blocks and head 1's unembedding in int8 (CPU), built once: see
        :meth:`InferenceModel.int8_drafter`."""
        return self._in(INT8_DRAFTS)

    def quantized(self, precision: Quantize) -> SkippingForm:
        """This draft with its blocks and head 1's unembedding quantized to ``precision``, built once: the target's
        quantized weights (:meth:`InferenceModel.quantized`), skipped as this draft skips them."""
        return self._in(precision)

    def _in(self, precision: str) -> SkippingForm:
        if precision not in self._variants:
            self._variants[precision] = SkippingForm(self.target, self.skip, precision)
        return self._variants[precision]

    @property
    def path_slots(self) -> slice:
        return slice(0, self.attending)

    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        return self.target.kv_cache(self.attending, batch_size, max_len)

    def verify(self, tokens: Tensor, cache: KVCache, read: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Head 1's logits (B, R, V) at positions ``read`` (default: all S), and the path's output (B, S, d): as
        :meth:`InferenceModel.verify`, on this draft's path."""
        x = self.run_path(tokens, cache)
        return head1_logits_at(self.head1_output, self.target.eps, x, read), x

    def run_path(self, tokens: Tensor, cache: KVCache) -> Tensor:
        """The path's output (B, S, d) before the final norm (folded into head 1's unembedding)."""
        target, compiled = self.target, self.target.compiled
        rotation = target.rotations[cache.rotary]  # (B, S, head_dim / 2)
        x = F.embedding(tokens, self.embeddings)[None]  # (1, B, S, d)
        for blocks, (slots, feed_forward) in zip(self.path, self.sublayers, strict=True):
            if slots is None:
                step = feed_forward_step if blocks.quantized else self.feed_forward_step
                x = step(x.detach() if compiled else x, blocks, target.eps)
            else:
                x = target.run_blocks(blocks, x, rotation, cache, slots, feed_forward=feed_forward)
        return x[0]
