"""The model's inference form: the same math as MTPModel, packed for cached decoding with few, large operations.

A decoding step runs on a handful of positions per row, where a forward's cost is the operations it launches
(on a GPU) and the weights it reads from memory (on a CPU) far more than its arithmetic. So, built once per
model, head count and compile setting (:meth:`InferenceModel.of`) from an :class:`MTPModel`:

- each block's q/k/v projections are one matrix and its SwiGLU gate/up projections another;
- q and k columns are permuted within each attention head so that rotary pairs are adjacent: rotary is one
  complex multiplication, and q.k is unchanged (the same permutation on both sides; v is not permuted);
- the draft heads' blocks (heads 2..k, applied in parallel to the trunk output) are stacked along a leading
  head dimension and run as one batched computation;
- norms are ``F.rms_norm``;
- on CPU, each product picks the layout that reads its weight fastest for its number of rows, among x @ W, W @ x^T
  and, where PyTorch has MKL, MKL's packed matrices for that row count (a few rows' product without BLAS repacking
  the matrix at every call): the unembeddings (:class:`Unembedding`) and the path's blocks (:class:`PackedMatrices`);
- with int8 drafts (``draft_dtype="int8"``, CPU), the draft side multiplies int8 copies of its matrices
  (:mod:`mtp.decode.int8`): the draft heads' and their unembedding (:meth:`InferenceModel.with_int8_drafts`, which
  shares the verification path and head 1's unembedding, at full precision), or a drafter's whole form
  (:meth:`InferenceModel.int8_drafter`).

One step is split where verification sits: :meth:`InferenceModel.verify` runs the trunk and head 1 over the
step's positions and returns head 1's logits there (and the trunk output); the caller picks each row's last
accepted position on the device; :meth:`InferenceModel.draft` then writes the draft heads' keys and values at
every position of the step (a head block's cache needs them) but runs the rest of those blocks, the norm and the
unembedding at that one position per row. Head 1's and the trunk's results equal the full forward's at the same
positions; so do the draft heads' at the positions asked for (``tests/decode/test_cache.py``).

A layer-skip draft (:meth:`InferenceModel.skipping`, :class:`SkippingForm`) is this form without some of the path's
attention and MLP sublayers, on the same packed weights.
"""

from __future__ import annotations

import copy
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.optim.optimizer import register_optimizer_step_post_hook

from mtp.decode.cache import ChainCache, KVCache
from mtp.decode.graphs import StepGraphs
from mtp.decode.int8 import Int8Matrices, Int8Unembedding
from mtp.decode.memory import available_bytes
from mtp.decode.settings import DraftDtype
from mtp.decode.tree import DraftTree
from mtp.model import MTPModel
from mtp.model.blocks import Block

LEAVES_UNEMBEDDED_AT_ONCE = 4
"""On CPU, a tree step unembeds head 1 after every node when the tree has at most this many leaves; with more, after
the nodes with children, then once more after the accepted node (:meth:`InferenceModel.verify_tree`). For an
unembedding of more than LARGE_UNEMBEDDING weights, at most one leaf."""
LARGE_UNEMBEDDING = 8_000_000
"""Weights (vocabulary x width) above which a row of head 1's unembedding costs about what a call does on CPU: SmolLM2's
49152 x 576 takes 3.6 ms for 1 row and 7.3 for 4, so the rows of leaves that are not accepted cost more than a second
call after the one that is (a 4-sibling tree step 47.1 against 51.3 ms, measured in one process; the toy's 8192 x 192,
about 0.26 ms a call and 0.03 a row, keeps up to 4 leaves in one call)."""
SPAN_MULTIPLE = {"cuda": 128}
"""By device type: an eager step's attention spans the held positions and the step's rounded up to a multiple of this
(the rest masked), so that its shapes repeat from step to step: PyTorch prefers cuDNN's attention on Hopper and
Blackwell GPUs (with cuDNN above 9.15), which builds an execution plan for every new shape, and a span one position
longer every step is a new shape every step. On CPU, spans are exact (masked positions would cost compute)."""

CAPTURED_LENGTH_MULTIPLE = 256
"""With captured steps, a cache's length is rounded up to a multiple of this (within the model's context), so that
prompts of nearby lengths decode on the same storage and replay the same graphs (:mod:`mtp.decode.graphs`)."""

_built: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(heads, compile): (weights, form)}
_optimizer_steps = 0
"""Optimizer steps taken in this process (torch.optim's step hook): a fused step writes the weights without bumping
their version counters, so a form built before any step is not reused after it."""


def _count_optimizer_step(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
    global _optimizer_steps
    _optimizer_steps += 1


register_optimizer_step_post_hook(_count_optimizer_step)

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


def rotary_permutation(head_dim: int) -> Tensor:
    """Indices that put rotary pair (i, i + head_dim/2) at (2i, 2i + 1)."""
    half = head_dim // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()


class Unembedding:
    """Logits (..., V) of x (..., d) through a weight (V, d), in the layout that reads the weight fastest.

    A decoding step reads the whole matrix for a few rows of x, so its cost is how fast the weight streams from
    memory, and CPU BLAS libraries stream the two layouts at speeds that depend on the CPU and on the number of rows:
    on one machine x @ W^T with W^T stored contiguously is the faster at every step's row count, on another it is the
    faster at one row and several times the slower at two to eight (where W @ x^T streams the weight at about its
    one-row speed). So on CPU the unembedding keeps the transposed copy beside the weight and, the first time it
    meets a row count, times both products on that input (on its first :func:`timed_rows` rows; from a few hundred
    rows x @ W^T without timing) and keeps the faster for that shape (:func:`faster_layout`, shared by every
    unembedding of the same shape in the process); W @ x^T's logits are copied back to rows (reading them transposed
    costs more than the copy). For up to :data:`PACKED_ROWS` rows of float32 where PyTorch has MKL, a third product
    is timed beside them: the weight packed by MKL for exactly that row count (:meth:`packed_rows`; SmolLM2's 49152 x
    576 took 6.5 ms for 4 rows as x @ W^T, 4.2 packed, 2.2 for one row), kept for at most :data:`PACKED_COPIES` row
    counts as the blocks' are. Every product is the same, equal up to rounding. Other devices use ``F.linear``.
    """

    def __init__(self, weight: Tensor) -> None:
        self.weight = weight
        self.transposed = weight.T.contiguous() if weight.device.type == "cpu" else None
        self._int8: Int8Unembedding | None = None
        self._packed: dict[int, Tensor] = {}  # rows -> the weight packed by MKL for them, the most recently used last
        self._room: bool | None = None  # whether the packed copies fit in memory (:meth:`packs`)

    def int8(self) -> Int8Unembedding:
        """An int8 copy, for drafting (made once: forms that share this unembedding share it)."""
        if self._int8 is None:
            self._int8 = Int8Unembedding(self.weight)
        return self._int8

    def __call__(self, x: Tensor) -> Tensor:
        if self.transposed is None:
            return F.linear(x, self.weight)
        rows = x.reshape(-1, x.size(-1))
        timed = timed_rows(rows.size(0))
        products: tuple[Callable[[Tensor], Tensor], ...] = (self.rows_by_transposed, self.rows_by_weight)
        if timed == rows.size(0) and self.packs(rows):
            products += (self.packed_rows,)
        key = (tuple(self.weight.shape), timed, rows.dtype, self.weight.dtype, len(products))
        logits = products[faster_layout(key, rows[:timed], products) if timed else 0](rows)
        return logits.reshape(*x.shape[:-1], self.weight.size(0))

    def packs(self, rows: Tensor) -> bool:
        """Whether ``rows`` may take the packed product: float32 rows and weight, at most :data:`PACKED_ROWS` of them,
        MKL, and room for the copies (together at most a quarter of the memory available, checked once)."""
        if not PackedMatrices.available(rows.size(0), rows.dtype) or self.weight.dtype != rows.dtype:
            return False
        if self._room is None:
            available = available_bytes(torch.device("cpu"))
            copies = PACKED_COPIES * self.weight.numel() * self.weight.element_size()
            self._room = available is None or copies <= available // 4
        return self._room

    def rows_by_transposed(self, rows: Tensor) -> Tensor:
        return torch.mm(rows, self.transposed)

    def rows_by_weight(self, rows: Tensor) -> Tensor:
        return torch.mm(self.weight, rows.T).T.contiguous()

    def packed_rows(self, rows: Tensor) -> Tensor:
        """rows (M, d) @ W^T through the weight packed by MKL for exactly M rows (packed the first time M is met; at
        most :data:`PACKED_COPIES` counts are kept, the least recently used dropped)."""
        count = rows.size(0)
        packed = recently_used(
            self._packed, count, lambda: torch.ops.mkl._mkl_reorder_linear_weight(self.weight.contiguous(), count)
        )
        return torch.ops.mkl._mkl_linear(rows.contiguous(), packed, self.weight, None, count)


_LAYOUTS: dict[tuple, int] = {}
"""The faster product (index) per (weight shape, rows timed, dtype), measured once per process."""

EXACT_ROWS, UNTIMED_ROWS = 32, 256
"""Layouts are timed at each row count up to ``EXACT_ROWS`` (where they differ most: up to 2x), then once per power of
two below ``UNTIMED_ROWS``; from ``UNTIMED_ROWS`` rows up the product is compute-bound and x @ W, which needs no copy
back to rows, is taken without timing (W @ x^T and its copy measured 1.2x to 5x slower there, from a 7M to a 135M
model's shapes), where timing a batch of thousands of rows cost several of its steps at every count it shrank
through."""


def timed_rows(rows: int) -> int:
    """The row count whose timed layout serves ``rows`` rows (at most ``rows``: the input is sliced to it), or 0 where
    x @ W is taken without timing."""
    if rows >= UNTIMED_ROWS:
        return 0
    return rows if rows <= EXACT_ROWS else 1 << (rows.bit_length() - 1)


def faster_layout(key: tuple, rows: Tensor, products: tuple[Callable[[Tensor], Tensor], ...]) -> int:
    """The index of the fastest of ``products`` (each the same product of ``rows`` in another layout), timed on
    ``rows`` the first time ``key`` (the shapes and dtypes) is met: one warm-up call each, then the best of three."""
    if key not in _LAYOUTS:
        best = []
        for product in products:
            product(rows)
            times = []
            for _ in range(3):
                start = time.perf_counter()
                product(rows)
                times.append(time.perf_counter() - start)
            best.append(min(times))
        _LAYOUTS[key] = min(range(len(products)), key=best.__getitem__)
    return _LAYOUTS[key]


class PackedBlocks:
    """Weights of one or more blocks (a leading block dimension), packed for inference.

    Each norm's weight is folded into the matrix that reads the norm's output (x * w) @ W = x @ (w[:, None] * W),
    so a norm is one ``F.rms_norm`` without weight.
    """

    def __init__(self, blocks: list[Block], n_heads: int, n_kv_heads: int) -> None:
        attention = [b.attention for b in blocks]
        head_dim = attention[0].head_dim
        perm = rotary_permutation(head_dim).to(attention[0].wq.weight.device)

        def permuted(weight: Tensor, heads: int) -> Tensor:  # rows grouped by attention head, pairs made adjacent
            return weight.view(heads, head_dim, -1)[:, perm].reshape(heads * head_dim, -1)

        def qkv(block: Block) -> Tensor:  # (d, (n_heads + 2 n_kv_heads) head_dim)
            a = block.attention
            w = torch.cat([permuted(a.wq.weight, n_heads), permuted(a.wk.weight, n_kv_heads), a.wv.weight]).T
            return block.attention_norm.weight[:, None] * w

        def gate_up(block: Block) -> Tensor:  # (d, 2 ffn)
            w = torch.cat([block.feed_forward.w1.weight, block.feed_forward.w3.weight]).T
            return block.ffn_norm.weight[:, None] * w

        self.qkv = torch.stack([qkv(b) for b in blocks])
        self.wo = torch.stack([a.wo.weight.T for a in attention]).contiguous()  # (blocks, n_heads head_dim, d)
        self.gate_up = torch.stack([gate_up(b) for b in blocks])
        self.down = torch.stack([b.feed_forward.w2.weight.T for b in blocks]).contiguous()  # (blocks, ffn, d)
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.grouped = n_heads != n_kv_heads  # grouped-query attention
        self.q_width, self.kv_width = n_heads * head_dim, n_kv_heads * head_dim
        self.int8, self._int8 = False, None
        self.by_weight, self._by_weight = False, None  # products as W @ x^T (each matrix stored (out, in))
        self.packed_rows = 0  # > 0: these matrices are MKL-packed for that many rows
        self._packed: dict[int, PackedBlocks] = {}  # rows -> such a copy, the most recently used last

    def weight_major(self) -> PackedBlocks:
        """A copy of these blocks whose matrices are stored (out, in), multiplied as W @ x^T (:func:`product`), which
        CPU BLAS streams faster than x @ W at a few rows on some CPUs (:meth:`InferenceModel.block_layout`); made once
        and shared like :meth:`in_int8`'s."""
        if self._by_weight is None:
            self._by_weight = self._with(lambda m: m.transpose(1, 2).contiguous(), by_weight=True)
        return self._by_weight

    def packed_for(self, rows: int) -> PackedBlocks:
        """A copy of these blocks whose matrices are :class:`PackedMatrices` for ``rows`` rows, shared as
        :meth:`weight_major`'s copy is; each copy holds the weights once more, so at most :data:`PACKED_COPIES` row
        counts keep theirs (the least recently used is dropped, and packed again if its count returns)."""

        def packed() -> PackedBlocks:
            return self._with(lambda m: PackedMatrices(m, rows), packed_rows=rows)

        return recently_used(self._packed, rows, packed)

    def in_int8(self) -> PackedBlocks:
        """A copy of these blocks with int8 matrices, for drafting (made once: forms that share these blocks, such as
        a layer-skip form and its target, share it); these blocks are left as they are."""
        if self._int8 is None:
            self._int8 = self._with(Int8Matrices, int8=True)
        return self._int8

    def _with(self, convert: Callable[[Tensor], Any], **flags: Any) -> PackedBlocks:
        """A copy of these blocks with each matrix converted and ``flags`` set, holding none of their derived copies."""
        other = copy.copy(self)
        for name in ("qkv", "wo", "gate_up", "down"):
            setattr(other, name, convert(getattr(self, name)))
        other._by_weight, other._int8, other._packed = None, None, {}
        for name, value in flags.items():
            setattr(other, name, value)
        return other


Chooser = Callable[[Tensor, int], Tensor]
"""``choose(logits, first)``: draft tokens (h, B) from heads first+2..first+h+1's logits (h, B, V): greedy argmax, or
samples whose proposals the caller keeps. A causal chain calls it once per depth, since depth k needs draft k-1."""


class InferenceModel:
    """Cached decoding with an MTPModel's weights (shared, not copied, where no packing is needed)."""

    def __init__(
        self, model: MTPModel, heads: int, compile: bool = False, draft_first_ids: int = 0, cuda_graphs: bool = False
    ) -> None:
        config = model.config
        self.config, self.heads = config, heads
        self.eps = config.norm_eps
        self.embeddings = model.tok_embeddings.weight
        final_norm = model.norm.weight  # folded into the unembeddings, like every norm weight here
        # verification path: the trunk and head 1 (all of `layers`)
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
        # what the draft heads read: the trunk output (parallel head blocks) or the path's output (head 1's hidden
        # state for causal heads, the trunk output of linear and medusa heads, whose every block is trunk)
        self.draft_input_depth = len(model.layers) - (1 if model.heads.reads_trunk else 0)
        self.compiled = compile
        # captured steps (mtp.decode.graphs): the verification step, and the parallel draft heads' part of it
        self.graphs = StepGraphs(self.embeddings.device) if cuda_graphs else None
        self.block_indices: dict[int, Tensor] = {}  # blocks -> (blocks, 1, 1) index of a block_step's cache slots
        self.block_step = compiled_block_step() if compile else block_step
        self.draft_dtype: DraftDtype = "auto"
        self._variants: dict[str, InferenceModel] = {}  # the int8 forms derived from this one, built once
        self.drafter = None
        if heads > 1:
            if model.heads.reads_trunk:
                self.drafter = ParallelBlocks(model, self)
            elif model.heads.conditions_on_tokens:
                self.drafter = CausalChain(model, self)
            else:
                self.drafter = Unembeddings(model, self)

    @classmethod
    def of(
        cls,
        model: MTPModel,
        heads: int,
        compile: bool = False,
        draft_dtype: DraftDtype = "auto",
        draft_first_ids: int = 0,
        cuda_graphs: bool = False,
    ) -> InferenceModel:
        """The inference form of ``model`` for ``heads`` heads, its draft heads in ``draft_dtype`` scoring the first
        ``draft_first_ids`` token ids (0: a trained draft vocabulary, or every token): built once, reused
        while the weights (and buffers, such as a reduced draft vocabulary) stay the same, so repeated ``generate``
        calls pay neither the packing nor a recompile. They changed when a tensor moved, changed dtype or was written
        in place (its version counter), when any optimizer stepped (fused steps bump no counter), or when
        :meth:`MTPModel.weights_changed` said so. An int8 form is derived from the
        full-precision one (:meth:`with_int8_drafts`), whose verification path it shares. With ``cuda_graphs`` its
        steps are captured (:mod:`mtp.decode.graphs`), and the graphs kept with the form."""
        tensors = tuple((t.data_ptr(), t._version, t.dtype) for t in (*model.parameters(), *model.buffers()))
        weights = (model.weights_version, _optimizer_steps, tensors)
        built = _built.setdefault(model, {})
        key = (heads, compile, draft_first_ids if heads > 1 else 0, cuda_graphs)
        if key not in built or built[key][0] != weights:
            built[key] = (weights, cls(model, heads, compile, draft_first_ids, cuda_graphs))
        form = built[key][1]
        return form if draft_dtype == "auto" else form.with_int8_drafts()

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
            if not isinstance(self.drafter, Unembeddings):  # linear and medusa heads unembed with their own outputs
                form.draft_output = self.draft_output.int8()
            form.drafter = self.drafter.in_int8(form)

        return self._variant("int8 drafts", quantize)

    def int8_drafter(self) -> InferenceModel:
        """This form, a drafter's (a draft model's, or the target's with blocks skipped), with its path's blocks and
        head 1's unembedding in int8 (on CPU; each packed block quantized once, whichever forms share it), and its own
        draft heads too when it has some (a staged draft's). Its head 1 is then no longer the model's: a form that only
        drafts."""

        def quantize(form: InferenceModel) -> None:
            form.draft_dtype = "int8"
            form.path = [blocks.in_int8() for blocks in self.path]
            form.head1_output = self.head1_output.int8()
            shared = self.draft_output is self.head1_output  # no reduced draft vocabulary
            form.draft_output = form.head1_output if shared else self.draft_output.int8()
            if self.drafter is not None:  # a staged draft's heads, which verify nothing either
                form.drafter = self.drafter.in_int8(form)

        return self._variant("int8 drafter", quantize)

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
        cache = self._kv_cache(len(self.path) + extra_slots, batch_size, max_len, storage)
        if isinstance(self.drafter, CausalChain):
            cache.chain = self.drafter.new_chain(batch_size, max_len)
        return cache

    def _kv_cache(self, slots: int, batch_size: int, max_len: int, storage: Callable | None = None) -> KVCache:
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
        """The path's output (B, S, d) before the final norm, and what the draft heads read (B, S, d)."""
        rotation = self.rotations[cache.rotary]  # (B, S, head_dim / 2)
        x = F.embedding(tokens, self.embeddings)
        draft_input = x
        for i, blocks in enumerate(self.path):
            x = self._blocks(blocks, x[None], rotation, cache, slice(i, i + 1))[0]
            if i == self.draft_input_depth - 1:
                draft_input = x
        return x, draft_input

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

    def _blocks(
        self,
        w: PackedBlocks,
        x: Tensor,
        rotation: Tensor,
        cache: KVCache,
        slots: slice,
        last: Tensor | None = None,
        feed_forward: bool = True,
    ) -> Tensor:
        """:func:`block_step` on these blocks' slice of ``cache`` (compiled when this form is, unless the blocks are
        int8: torch.compile does not see into the quantized operators)."""
        if self.compiled:  # not a view: a view's base would enter dynamo's guards and cause needless recompiles
            x = x.detach()
        blocks = slots.stop - slots.start
        if blocks not in self.block_indices:
            self.block_indices[blocks] = torch.arange(blocks, device=x.device)[:, None, None]
        where = (self.block_indices[blocks], cache.rows[None], cache.positions[None])
        keys, values = cache.keys[slots], cache.values[slots]
        rows = x.size(1) * x.size(2)
        layout = self.block_layout(rows, x.dtype) if not w.int8 and x.device.type == "cpu" else BY_INPUT
        if layout == BY_WEIGHT:
            w = w.weight_major()
        elif layout == MKL_PACKED:
            w = w.packed_for(rows)
        step = block_step if w.int8 or w.packed_rows else self.block_step  # compile sees into neither operator
        return step(x, w, rotation, keys, values, where, cache.span, cache.mask, self.eps, last, feed_forward)

    def block_layout(self, rows: int, dtype: torch.dtype) -> int:
        """How the path's matrices multiply ``rows`` rows fastest (CPU): :data:`BY_INPUT` (x @ W), :data:`BY_WEIGHT`
        (stored (out, in), W @ x^T) or :data:`MKL_PACKED` (:class:`PackedMatrices` for exactly that many rows: up to
        :data:`PACKED_ROWS`, float32, where PyTorch has MKL). Timed once per shape and :func:`timed_rows` in the
        process (:func:`faster_layout`) over the path's feed-forward matrices in turn, so that each streams from
        memory as in a step. x @ W without timing where another copy of the weights would take more than a quarter of
        the memory available."""
        first = self.path[0]
        timed = timed_rows(rows)
        if not timed:
            return BY_INPUT
        key = ("blocks", tuple(first.gate_up.shape[1:]), len(self.path), timed, dtype)
        if key in _LAYOUTS:
            return _LAYOUTS[key]
        packed = [blocks for blocks in self.path if not blocks.int8]
        copy_bytes = sum(m.numel() * m.element_size() for b in packed for m in (b.qkv, b.wo, b.gate_up, b.down))
        available = available_bytes(torch.device("cpu"))
        if available is not None and copy_bytes > available // 4:  # no room for another copy of the weights
            _LAYOUTS[key] = BY_INPUT
            return BY_INPUT
        matrices = [blocks.gate_up for blocks in packed]
        transposed = [m.transpose(1, 2).contiguous() for m in matrices]
        x = torch.randn(first.gate_up.size(0), timed, first.gate_up.size(1), dtype=dtype)

        def by_input(x: Tensor) -> None:
            for m in matrices:
                torch.bmm(x, m)

        def by_weight(x: Tensor) -> None:
            for m in transposed:
                torch.bmm(m, x.transpose(1, 2))

        products = [by_input, by_weight]
        if PackedMatrices.available(timed, dtype):  # a count it packs for is timed exactly (timed == rows)
            mkl = [PackedMatrices(m, timed) for m in matrices]

            def mkl_packed(x: Tensor) -> None:
                for m in mkl:
                    m(x)

            products.append(mkl_packed)
        return faster_layout(key, x, tuple(products))


class SkippingForm:
    """A layer-skip draft (Draft & Verify): the target form's head 1 on its path without some sublayers, no draft heads,
    on a cache of its own. A block whose attention is skipped runs only its MLP residual and holds no cache slot; one
    whose MLP is skipped runs its attention residual only (its keys and values still go to the draft's cache); a block
    skipped whole is not run. It drafts as a drafter's form does (``verify``, ``new_cache``, ``int8_drafter``) with the
    target's packed weights and steps (compiled ones included), which it holds, not copies."""

    heads, drafter, graphs = 1, None, None  # head 1 only; never captured (its steps are the drafter's, not verified)

    def __init__(self, target: InferenceModel, skip: frozenset[Sublayer], int8: bool = False) -> None:
        self.target, self.skip = target, skip
        self.config, self.embeddings, self.vocab_size = target.config, target.embeddings, target.vocab_size
        self.draft_dtype: DraftDtype = "int8" if int8 else "auto"
        self.head1_output = target.head1_output.int8() if int8 else target.head1_output
        self.path: list[PackedBlocks] = []  # the blocks that run, whole or in part
        self.sublayers: list[tuple[slice | None, bool]] = []  # of each: its cache slot (None: no attention), its MLP
        self.attending = 0  # blocks that run attention: the cache's slots
        for i, blocks in enumerate(target.path):
            attention, feed_forward = (i, ATTENTION) not in skip, (i, FEED_FORWARD) not in skip
            if attention or feed_forward:
                self.path.append(blocks.in_int8() if int8 else blocks)
                self.sublayers.append((slice(self.attending, self.attending + 1) if attention else None, feed_forward))
                self.attending += attention
        self.feed_forward_step = compiled_step(feed_forward_step) if target.compiled else feed_forward_step
        self._int8: SkippingForm | None = None

    def int8_drafter(self) -> SkippingForm:
        """This draft with its blocks and head 1's unembedding in int8 (CPU), built once: see
        :meth:`InferenceModel.int8_drafter`."""
        if self._int8 is None:
            self._int8 = self if self.draft_dtype == "int8" else SkippingForm(self.target, self.skip, int8=True)
        return self._int8

    @property
    def path_slots(self) -> slice:
        return slice(0, self.attending)

    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        return self.target._kv_cache(self.attending, batch_size, max_len)

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
                step = feed_forward_step if blocks.int8 else self.feed_forward_step
                x = step(x.detach() if compiled else x, blocks, target.eps)
            else:
                x = target._blocks(blocks, x, rotation, cache, slots, feed_forward=feed_forward)
        return x[0]


class ParallelBlocks:
    """Heads 2..k as blocks on the trunk output, stacked along a leading head dimension and run as one batched
    computation; their keys and values follow the path's in the cache."""

    def __init__(self, model: MTPModel, form: InferenceModel) -> None:
        config = model.config
        self.form = form
        self.blocks = PackedBlocks(
            [model.head_block(k) for k in range(2, form.heads + 1)], config.n_heads, config.n_kv_heads
        )
        self.cache_slots = form.heads - 1
        self.slots = slice(len(model.layers), len(model.layers) + form.heads - 1)

    def in_int8(self, form: InferenceModel) -> ParallelBlocks:
        """These heads with int8 blocks, drafting for ``form``."""
        quantized = copy.copy(self)
        quantized.form, quantized.blocks = form, self.blocks.in_int8()
        return quantized

    def draft(self, hidden, cache, last, inputs, next_token, choose) -> Tensor:
        if self.form.graphs is not None and cache.max_length:  # not the prompts' step: a width per prompt length
            logits = self.form.graphs.run("draft", self.logits, cache, hidden, last)[0]
        else:
            logits = self.logits(cache, hidden, last)[0]
        return choose(logits, 0).T

    def logits(self, cache: KVCache, hidden: Tensor, last: Tensor) -> tuple[Tensor]:
        """Heads 2..k's logits (h, B, V) at each row's position ``last`` (B,) of the step."""
        form = self.form
        x = hidden.expand(form.heads - 1, -1, -1, -1)  # (h, B, S, d)
        rotation = form.rotations[cache.rotary]
        out = form._blocks(self.blocks, x, rotation, cache, self.slots, last)  # (h, B, d)
        return (form.draft_logits(out),)


class Unembeddings:
    """Heads 2..k as unembeddings of the trunk output (linear), after residual blocks of their own (medusa)."""

    def __init__(self, model: MTPModel, form: InferenceModel) -> None:
        self.form, self.cache_slots = form, 0
        heads = range(2, form.heads + 1)
        final_norm = model.norm.weight
        residual = [model.heads.residual_layers(k) for k in heads]  # medusa's residual blocks; none for linear heads
        self.residual = None
        if residual[0]:  # (layers, h, d, d) transposed, so that x @ W^T is one bmm over heads
            self.residual = [torch.stack([layers[i].weight.T for layers in residual]) for i in range(len(residual[0]))]
            self.norm_weight = final_norm  # the residual blocks read the normed state: the weight cannot be folded
            self.outputs = torch.stack([model.head_weight(k)[form.draft_rows].T for k in heads])  # (h, d, V or K)
        else:
            self.outputs = torch.stack([(model.head_weight(k)[form.draft_rows] * final_norm).T for k in heads])

    def in_int8(self, form: InferenceModel) -> Unembeddings:
        """These heads with int8 residual layers and outputs, drafting for ``form``."""
        quantized = copy.copy(self)
        quantized.form, quantized.outputs = form, Int8Matrices(self.outputs, "fbgemm")  # unembeddings: see int8.py
        if self.residual is not None:
            quantized.residual = [Int8Matrices(weight) for weight in self.residual]
        return quantized

    def draft(self, hidden, cache, last, inputs, next_token, choose) -> Tensor:
        x = hidden[torch.arange(hidden.size(0), device=hidden.device), last]  # (B, d)
        normed = F.rms_norm(x, (x.size(-1),), eps=self.form.eps).expand(self.form.heads - 1, -1, -1)  # (h, B, d)
        if self.residual is not None:
            normed = normed * self.norm_weight
            for weight in self.residual:
                normed = normed + F.silu(product(normed, weight))
        return choose(self.form.full_vocab(product(normed, self.outputs)), 0).T


class CausalChain:
    """Heads 2..k as DeepSeek-V3 MTP depths, drafted one after another: depth k reads depth k-1's hidden state and
    the embedding of draft k-1 (of the token after the accepted ones, for depth 2).

    Each depth is a causal block over its own sequence: at position i it reads token t_{i+k-1} and h_{k-1}(i), as in
    training. So depth k's keys and values at i are final once t_{i+k-1} is known (accepted), which lags the trunk
    by k - 2 positions; each step recomputes a depth from where its final entries end up to the last accepted
    position, with drafts standing in for the tokens not known yet (those entries are rolled back after the step).
    Every depth keeps its own cache and a buffer of its hidden states (:class:`mtp.decode.cache.ChainCache`).
    """

    def __init__(self, model: MTPModel, form: InferenceModel) -> None:
        config = model.config
        self.form, self.cache_slots = form, 0
        packed = {}  # module -> its packed form: a shared depth is packed once, whatever the number of depths

        def pack(module, packing):
            if id(module) not in packed:
                packed[id(module)] = packing(module)
            return packed[id(module)]

        def pack_block(block):
            return PackedBlocks([block], config.n_heads, config.n_kv_heads)

        def pack_input(module):  # (2d, d): [RMSNorm(e); RMSNorm(h)] @ W^T with both norm weights folded in
            norms = torch.cat([module.enorm.weight, module.hnorm.weight])
            return (module.eh_proj.weight * norms).T.contiguous()

        depths = range(2, form.heads + 1)
        self.blocks = [pack(model.heads.block(k), pack_block) for k in depths]
        self.inputs: list[Tensor | Int8Matrices] = [pack(model.heads.causal_input(k), pack_input) for k in depths]

    def in_int8(self, form: InferenceModel) -> CausalChain:
        """These depths with int8 blocks and input matrices (a shared depth's quantized once), drafting for ``form``."""
        quantized = copy.copy(self)
        quantized.form, quantized.blocks = form, [blocks.in_int8() for blocks in self.blocks]
        inputs = {id(matrix): matrix for matrix in self.inputs}
        int8 = {key: Int8Matrices(matrix[None]) for key, matrix in inputs.items()}  # (1, 2d, d): one matrix
        quantized.inputs = [int8[id(matrix)] for matrix in self.inputs]
        return quantized

    def new_chain(self, batch_size: int, max_len: int) -> ChainCache:
        form = self.form
        caches = [form._kv_cache(1, batch_size, max_len) for _ in self.blocks]
        shape = (form.heads - 1, batch_size, max_len, form.config.d_model)  # the last depth's are never read
        return ChainCache(caches, form.embeddings.new_zeros(shape))

    def draft(self, hidden, cache, last, inputs, next_token, choose) -> Tensor:
        form, chain, eps = self.form, cache.chain, self.form.eps
        B, S = inputs.shape
        rows = torch.arange(B, device=inputs.device)[:, None]
        held = cache.positions[:, 0]  # (B,) trunk positions held before this step
        chain.hidden[0][rows, cache.positions] = hidden  # head 1's hidden state at the step's positions
        # the tokens from position `held` on: the step's accepted inputs, the token after them, then the drafts
        stream = torch.cat([inputs, inputs.new_zeros(B, form.heads)], dim=1)
        stream[rows[:, 0], last + 1] = next_token
        drafts = []
        for k in range(2, form.heads + 1):
            depth_cache, width = chain.caches[k - 2], S + k - 2
            depth_cache.begin(width)  # from the first position not final yet, over the step's and k - 2 more
            positions = depth_cache.positions  # (B, width)
            tokens = stream.gather(1, (positions + k - 1 - held[:, None]).clamp(max=stream.size(1) - 1))
            previous = chain.hidden[k - 2][rows, positions]  # h_{k-1}, (B, width, d)
            embedded = F.embedding(tokens, form.embeddings)
            d = (embedded.size(-1),)
            x = torch.cat([F.rms_norm(embedded, d, eps=eps), F.rms_norm(previous, d, eps=eps)], dim=-1)
            projection = self.inputs[k - 2]
            if isinstance(projection, Int8Matrices):
                x = projection(x[None])[0]  # (B, width, d)
            else:
                x = torch.matmul(x, projection)  # (B, width, d)
            rotation = form.rotations[depth_cache.rotary]
            read = held + last - positions[:, 0]  # (B,) the position each row drafts from, within the window
            if k < form.heads:  # the next depth reads this one's hidden states at every position of the window
                out = form._blocks(self.blocks[k - 2], x[None], rotation, depth_cache, slice(0, 1))[0]  # (B, width, d)
                chain.hidden[k - 1][rows, positions] = out
                at_last = out[rows[:, 0], read]  # (B, d)
            else:  # the last depth: keys and values everywhere, the rest of the block at the one position read
                at_last = form._blocks(self.blocks[k - 2], x[None], rotation, depth_cache, slice(0, 1), read)[0]
            token = choose(form.draft_logits(at_last)[None], k - 2)[0]
            stream[rows[:, 0], last + k] = token
            drafts.append(token)
            depth_cache.commit(width)
        return torch.stack(drafts, dim=1)


def compiled_block_step():
    """:func:`block_step` compiled: one graph for every block of the path, one for the stacked draft heads, with
    dynamic shapes, so that prefill, decoding steps and batch sizes share them (sizes 1 and above compile apart:
    up to about eight graphs when k and the batch size both vary, hence a higher recompile limit than dynamo's 8,
    set around each call, where dynamo compiles lazily: the process's own setting stays as it was; a layer-skip
    draft that skips MLPs adds its own). Default mode on every device: CUDA graphs (``mode="reduce-overhead"``) are
    not used yet."""
    return compiled_step(block_step)


def compiled_step(step: Callable) -> Callable:
    """``step`` compiled as :func:`compiled_block_step` says."""
    limit = torch._dynamo.config.patch(recompile_limit=max(torch._dynamo.config.recompile_limit, 32))
    return limit(torch.compile(step, dynamic=True, fullgraph=True))


def block_step(
    x: Tensor,
    w: PackedBlocks,
    rotation: Tensor,
    keys: Tensor,
    values: Tensor,
    where: tuple[Tensor, Tensor, Tensor],
    span: int,
    mask: Tensor,
    eps: float,
    last: Tensor | None = None,
    feed_forward: bool = True,
) -> Tensor:
    """Blocks applied to x (h, B, S, d), one per leading index; a pure function of tensors, so that it compiles
    to one graph for every block of the same shape.

    keys/values (h, B, n_kv_heads, L, head_dim): these blocks' cache, written in place at ``where`` (block
    index (h, 1, 1), rows (1, B, 1), positions (1, B, S)); attention reads its first ``span`` positions under
    ``mask`` (B, 1, S, span). With ``last`` (B,), every position's keys and values are written but only each row's
    position ``last`` attends and goes on: returns (h, B, d). Without ``feed_forward``, the attention residual only (a
    layer-skip draft that skips these blocks' MLP).
    """
    h, B, S, d = x.shape
    qkv = product(F.rms_norm(x, (d,), eps=eps).view(h, B * S, d), w.qkv, w.by_weight).view(h, B, S, -1)
    qk = rotate(qkv[..., : w.q_width + w.kv_width].unflatten(-1, (-1, w.head_dim)), rotation)
    q, k = qk.split([w.n_heads, w.n_kv_heads], dim=3)  # (h, B, S, heads, head_dim)
    block, rows, positions = where
    keys[block, rows, :, positions] = k.to(keys.dtype)  # (h, B, S, n_kv_heads, head_dim) written in place
    v = qkv[..., w.q_width + w.kv_width :].unflatten(-1, (w.n_kv_heads, w.head_dim))
    values[block, rows, :, positions] = v.to(values.dtype)
    if last is not None:  # only each row's position `last` goes on past the attention: its query alone attends
        rows = torch.arange(B, device=x.device)
        x, q, mask, S = x[:, rows, last, None], q[:, rows, last, None], mask[rows, :, last][:, :, None], 1
    q = q.transpose(2, 3).reshape(h * B, w.n_heads, S, w.head_dim)
    mask = mask if h == 1 else mask.repeat(h, 1, 1, 1)
    y = F.scaled_dot_product_attention(
        q, keys[..., :span, :].flatten(0, 1), values[..., :span, :].flatten(0, 1), attn_mask=mask, enable_gqa=w.grouped
    )
    y = y.view(h, B, w.n_heads, S, w.head_dim).transpose(2, 3)  # (h, B, S, n_heads, head_dim)
    x, y = x.reshape(h, B * S, d), y.reshape(h, B * S, w.q_width)
    if isinstance(w.wo, (Int8Matrices, PackedMatrices)) or w.by_weight:
        x = x + product(y, w.wo, w.by_weight)  # x + attention
    else:
        x = torch.baddbmm(x, y, w.wo)
    if feed_forward:
        x = feed_forward_residual(x, w, eps)  # (h, B S, d)
    return x.view(h, B, S, d) if last is None else x


def feed_forward_residual(x: Tensor, w: PackedBlocks, eps: float) -> Tensor:
    """x (h, M, d) plus the blocks' feed-forward (SwiGLU)."""
    gate, up = product(F.rms_norm(x, (x.size(-1),), eps=eps), w.gate_up, w.by_weight).chunk(2, dim=-1)
    return x + product(F.silu(gate) * up, w.down, w.by_weight)


def feed_forward_step(x: Tensor, w: PackedBlocks, eps: float) -> Tensor:
    """x (h, B, S, d) plus the blocks' feed-forward, no attention (a layer-skip draft that skips their attention); a
    pure function of tensors, as :func:`block_step` is."""
    h, B, S, d = x.shape
    return feed_forward_residual(x.reshape(h, B * S, d), w, eps).view(h, B, S, d)


BY_INPUT, BY_WEIGHT, MKL_PACKED = 0, 1, 2
"""The path's block layouts on CPU (:meth:`InferenceModel.block_layout`)."""
PACKED_ROWS, PACKED_COPIES = 8, 3
"""MKL-packed matrices are tried for steps of up to ``PACKED_ROWS`` rows (a batch-1 step's chain or small tree), and
kept for at most ``PACKED_COPIES`` row counts per block: a copy per count, which a batch shrinking row by row would
otherwise multiply."""


def recently_used(copies: dict[int, Any], rows: int, make: Callable[[], Any]) -> Any:
    """``copies[rows]``, made by ``make()`` if absent, kept as the most recently used (last); at most
    :data:`PACKED_COPIES` are kept, the least recently used dropped first."""
    copy_for_rows = copies.pop(rows, None)
    if copy_for_rows is None:
        while len(copies) >= PACKED_COPIES:
            copies.pop(next(iter(copies)))
        copy_for_rows = make()
    copies[rows] = copy_for_rows
    return copy_for_rows


class PackedMatrices:
    """A stack of float32 matrices (blocks, in, out) in MKL's packed GEMM format for exactly ``rows`` rows (CPU):
    ``self(x)`` for x (blocks, rows, in) is each block's x @ matrix without the BLAS library repacking the matrix at
    every call, which at a few rows costs as much as the product itself (on a 2-core EPYC, SmolLM2's 30 blocks'
    matrices took 31 ms for 5 rows unpacked, 24 ms packed, 18 ms for one row). Other row counts multiply the float
    stack, which is kept (not copied). The same product as x @ W, equal up to rounding."""

    def __init__(self, stacked: Tensor, rows: int) -> None:
        self.full, self.rows = stacked, rows
        self.weights = [matrix.T for matrix in stacked]  # (out, in) views: the operator's fallback and shape
        self.packed = [torch.ops.mkl._mkl_reorder_linear_weight(w.contiguous(), rows) for w in self.weights]

    @staticmethod
    def available(rows: int, dtype: torch.dtype) -> bool:
        """Whether this PyTorch packs for ``rows`` rows of ``dtype``: MKL's single-precision GEMM, a few rows."""
        return dtype == torch.float32 and 1 <= rows <= PACKED_ROWS and torch.backends.mkl.is_available()

    def __call__(self, x: Tensor) -> Tensor:
        """x (blocks, M, in) -> (blocks, M, out)."""
        if x.size(1) != self.rows:
            return torch.bmm(x, self.full)
        outs = [
            torch.ops.mkl._mkl_linear(rows, packed, weight, None, self.rows)
            for rows, packed, weight in zip(x, self.packed, self.weights, strict=True)
        ]
        return outs[0][None] if len(outs) == 1 else torch.stack(outs)


def product(x: Tensor, weight: Tensor | Int8Matrices | PackedMatrices, by_weight: bool = False) -> Tensor:
    """x (h, M, in) @ weight (h, in, out): one ``bmm``, or each matrix's product of an int8 or packed stack;
    ``by_weight``: weight stored (h, out, in), the product taken as weight @ x^T and returned as (h, M, out) rows.

    Compiled on CPU, the ``bmm`` is a ``baddbmm`` with ``beta=0`` (the added matrix a zero broadcast, never read):
    Inductor lowers a ``bmm`` of one row (or one column) on CPU to a loop of its own instead of the BLAS call, which
    made SmolLM2's compiled one-row step about twice the eager one's time on 2 cores; ``baddbmm`` stays the BLAS
    call."""
    if isinstance(weight, (Int8Matrices, PackedMatrices)):
        return weight(x)
    a, b = (weight, x.transpose(1, 2)) if by_weight else (x, weight)
    if torch.compiler.is_compiling() and x.device.type == "cpu":  # the BLAS call, not Inductor's loop
        out = torch.baddbmm(a.new_zeros(()).expand(a.size(0), a.size(1), b.size(2)), a, b, beta=0)
    else:
        out = torch.bmm(a, b)
    return out.transpose(1, 2).contiguous() if by_weight else out


def rotate(x: Tensor, rotation: Tensor) -> Tensor:
    """Rotary on x (h, B, S, heads, head_dim) in the packed (adjacent pairs) layout; rotation (B, S, hd/2), complex,
    or (B, S, hd/2, 2) real (cos, sin)."""
    pairs = x.float().unflatten(-1, (-1, 2))
    if rotation.is_complex():
        return torch.view_as_real(torch.view_as_complex(pairs) * rotation[:, :, None]).flatten(-2).type_as(x)
    a, b = pairs.unbind(-1)
    cos, sin = rotation[:, :, None].unbind(-1)
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2).type_as(x)
