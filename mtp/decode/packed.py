"""Weights packed for decoding steps of a few rows, and the products that read them fastest.

A decoding step runs on a handful of positions per row, where a forward's cost is the operations it launches (on a
GPU) and the weights it reads from memory (on a CPU) far more than its arithmetic. So the inference forms
(:mod:`mtp.decode.inference`, :mod:`mtp.decode.head_forms`) hold their weights packed:

- each block's q/k/v projections are one matrix and its SwiGLU gate/up projections another, every norm's weight
  folded into the matrix that reads the norm's output (:class:`PackedBlocks`);
- q and k columns are permuted within each attention head so that rotary pairs are adjacent: rotary is one
  complex multiplication, and q.k is unchanged (the same permutation on both sides; v is not permuted);
- blocks of the same shape (parallel draft heads) are stacked along a leading dimension and run as one batched
  computation (:func:`block_step`, a pure function of tensors that compiles to one graph per shape);
- on CPU, each product takes the layout that reads its weight fastest for its number of rows, among x @ W, W @ x^T
  and, where PyTorch has MKL, MKL's packed matrices for that row count (a few rows' product without BLAS repacking
  the matrix at every call): the unembeddings (:class:`Unembedding`) and the blocks (:func:`block_layout`,
  :class:`PackedMatrices`), timed once per shape in the process (:func:`faster_layout`).

Every layout computes the same product, equal up to rounding.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from mtp.decode.int8 import Int8Matrices, Int8Unembedding
from mtp.decode.memory import available_bytes
from mtp.decode.quantize import QuantizedMatrices, QuantizedUnembedding
from mtp.model.blocks import Block

INT8_DRAFTS = "int8-drafts"
"""The precision of int8 drafts (:mod:`mtp.decode.int8`: the draft side only, float matrices past a few rows), beside a
quantized target's ``int8`` and ``int4`` (:mod:`mtp.decode.quantize`: every matrix, every call)."""


def matrices_in(precision: str, stacked: Tensor, unembedding: bool = False) -> Int8Matrices | QuantizedMatrices:
    """A stack of matrices (blocks, in, out) in ``precision``: :data:`INT8_DRAFTS` (fbgemm's kernel for
    ``unembedding`` matrices, see :mod:`mtp.decode.int8`), or a quantized target's int8 or int4."""
    if precision == INT8_DRAFTS:
        return Int8Matrices(stacked, "fbgemm" if unembedding else "weight_only")
    return QuantizedMatrices(stacked, precision)


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
    is timed beside them: the weight packed by MKL for exactly that row count (:meth:`packed_rows`), kept for at most
    :data:`PACKED_COPIES` row counts as the blocks' are. Every product is the same, equal up to rounding. Other devices
    use ``F.linear``.
    """

    def __init__(self, weight: Tensor) -> None:
        self.weight = weight
        self.transposed = weight.T.contiguous() if weight.device.type == "cpu" else None
        self._quantized: dict[str, Int8Unembedding | QuantizedUnembedding] = {}  # precision -> a quantized copy
        self._packed: dict[int, Tensor] = {}  # rows -> the weight packed by MKL for them, the most recently used last
        self._room: bool | None = None  # whether the packed copies fit in memory (:meth:`packs`)

    def to_precision(self, precision: str) -> Int8Unembedding | QuantizedUnembedding:
        """A copy in ``precision`` (:data:`INT8_DRAFTS`, int8 or int4), made once per precision: forms that share this
        unembedding share it."""
        if precision not in self._quantized:
            int8_drafts = precision == INT8_DRAFTS
            made = Int8Unembedding(self.weight) if int8_drafts else QuantizedUnembedding(self.weight, precision)
            self._quantized[precision] = made
        return self._quantized[precision]

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
        return torch.mm(self.weight, paired(rows).T)[:, : rows.size(0)].T.contiguous()

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
"""Layouts are timed at each row count up to ``EXACT_ROWS`` (where they differ most), then once per power of
two below ``UNTIMED_ROWS``; from ``UNTIMED_ROWS`` rows up the product is compute-bound and x @ W, which needs no copy
back to rows, is taken without timing (W @ x^T and its copy are slower there), where timing a batch of thousands of
rows cost several of its steps at every count it shrank through."""


def timed_rows(rows: int) -> int:
    """The row count whose timed layout serves ``rows`` rows (at most ``rows``: the input is sliced to it), or 0 where
    x @ W is taken without timing."""
    if rows >= UNTIMED_ROWS:
        return 0
    return rows if rows <= EXACT_ROWS else 1 << (rows.bit_length() - 1)


TIMING_ROUNDS = 5
"""Rounds of :func:`faster_layout`'s timing."""


def faster_layout(key: tuple, rows: Tensor, products: tuple[Callable[[Tensor], Tensor], ...]) -> int:
    """The index of the fastest of ``products`` (each the same product of ``rows`` in another layout), timed on
    ``rows`` the first time ``key`` (the shapes and dtypes) is met: one warm-up call each, then the best of
    :data:`TIMING_ROUNDS` rounds that each time every product in turn (a pause of the machine's during one round then
    slows every product once, not one product's every try)."""
    if key not in _LAYOUTS:
        for product in products:
            product(rows)
        best = [float("inf")] * len(products)
        for _ in range(TIMING_ROUNDS):
            for i, product in enumerate(products):
                start = time.perf_counter()
                product(rows)
                best[i] = min(best[i], time.perf_counter() - start)
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
        self.quantized, self._quantized = False, {}  # int8 or int4 matrices; precision -> such a copy
        self.by_weight, self._by_weight = False, None  # products as W @ x^T (each matrix stored (out, in))
        self.packed_rows = 0  # > 0: these matrices are MKL-packed for that many rows
        self._packed: dict[int, PackedBlocks] = {}  # rows -> such a copy, the most recently used last

    def weight_major(self) -> PackedBlocks:
        """A copy of these blocks whose matrices are stored (out, in), multiplied as W @ x^T (:func:`product`), which
        CPU BLAS streams faster than x @ W at a few rows on some CPUs (:meth:`InferenceModel.block_layout`); made once
        and shared like :meth:`to_precision`'s."""
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

    def to_precision(self, precision: str) -> PackedBlocks:
        """A copy of these blocks with their matrices in ``precision`` (:func:`matrices_in`), made once per precision:
        forms that share these blocks, such as a layer-skip form and its target, share it; these blocks are left as
        they are."""
        if precision not in self._quantized:
            self._quantized[precision] = self._with(lambda m: matrices_in(precision, m), quantized=True)
        return self._quantized[precision]

    def _with(self, convert: Callable[[Tensor], Any], **flags: Any) -> PackedBlocks:
        """A copy of these blocks with each matrix converted and ``flags`` set, holding none of their derived copies."""
        other = copy.copy(self)
        for name in ("qkv", "wo", "gate_up", "down"):
            setattr(other, name, convert(getattr(self, name)))
        other._by_weight, other._quantized, other._packed = None, {}, {}
        for name, value in flags.items():
            setattr(other, name, value)
        return other


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
    attention_input: Tensor | None = None,
) -> Tensor:
    """Blocks applied to x (h, B, S, d), one per leading index; a pure function of tensors, so that it compiles
    to one graph for every block of the same shape.

    keys/values (h, B, n_kv_heads, L, head_dim): these blocks' cache, written in place at ``where`` (block
    index (h, 1, 1), rows (1, B, 1), positions (1, B, S)); attention reads its first ``span`` positions under
    ``mask`` (B, 1, S, span). With ``last`` (B,), every position's keys and values are written but only each row's
    position ``last`` attends and goes on: returns (h, B, d). Without ``feed_forward``, the attention residual only (a
    layer-skip draft that skips these blocks' MLP). ``attention_input`` (h, B, S, d_in): what the q/k/v projections
    read, already normed (an EAGLE-3 layer's [RMSNorm(embedding); RMSNorm(state)], the norms' weights folded into
    ``w.qkv``), x staying the residual; default: RMSNorm(x).
    """
    h, B, S, d = x.shape
    normed = F.rms_norm(x, (d,), eps=eps) if attention_input is None else attention_input
    qkv = product(normed.reshape(h, B * S, -1), w.qkv, w.by_weight).view(h, B, S, -1)
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
    if isinstance(w.wo, OWN_PRODUCTS) or w.by_weight:
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
    every call, which at a few rows costs as much as the product itself. Other row counts multiply the float
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


OWN_PRODUCTS = (Int8Matrices, QuantizedMatrices, PackedMatrices)
"""Stacks of matrices that multiply x themselves (``stack(x)``), rather than through ``bmm``."""


def product(
    x: Tensor, weight: Tensor | Int8Matrices | QuantizedMatrices | PackedMatrices, by_weight: bool = False
) -> Tensor:
    """x (h, M, in) @ weight (h, in, out): one ``bmm``, or each matrix's product of a quantized or packed stack;
    ``by_weight``: weight stored (h, out, in), the product taken as weight @ x^T and returned as (h, M, out) rows.
    A single row is multiplied as two (:func:`paired`): BLAS takes a one-column weight @ x^T as a matrix-vector
    product, which some BLAS libraries run far slower than the same matrix times two columns (the weight, read once
    either way, is what costs).

    Compiled on CPU, the ``bmm`` is a ``baddbmm`` with ``beta=0`` (the added matrix a zero broadcast, never read):
    Inductor lowers a ``bmm`` of one row (or one column) on CPU to a loop of its own instead of the BLAS call, which
    made SmolLM2's compiled one-row step about twice the eager one's time on 2 cores; ``baddbmm`` stays the BLAS
    call."""
    if isinstance(weight, OWN_PRODUCTS):
        return weight(x)
    rows = x.size(1)
    a, b = (weight, paired(x).transpose(1, 2)) if by_weight else (x, weight)
    if torch.compiler.is_compiling() and x.device.type == "cpu":  # the BLAS call, not Inductor's loop
        out = torch.baddbmm(a.new_zeros(()).expand(a.size(0), a.size(1), b.size(2)), a, b, beta=0)
    else:
        out = torch.bmm(a, b)
    return out[..., :rows].transpose(1, 2).contiguous() if by_weight else out


def paired(x: Tensor) -> Tensor:
    """x (..., M, in), its one row repeated when M is 1: what weight @ x^T multiplies as a matrix, not a vector (MKL's
    matrix-vector product runs several times slower than its matrix product on AMD CPUs; block_layout times both)."""
    return torch.cat([x, x], dim=-2) if x.size(-2) == 1 else x


def rotate(x: Tensor, rotation: Tensor) -> Tensor:
    """Rotary on x (h, B, S, heads, head_dim) in the packed (adjacent pairs) layout; rotation (B, S, hd/2), complex,
    or (B, S, hd/2, 2) real (cos, sin)."""
    pairs = x.float().unflatten(-1, (-1, 2))
    if rotation.is_complex():
        return torch.view_as_real(torch.view_as_complex(pairs) * rotation[:, :, None]).flatten(-2).type_as(x)
    a, b = pairs.unbind(-1)
    cos, sin = rotation[:, :, None].unbind(-1)
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2).type_as(x)


def block_layout(path: list[PackedBlocks], rows: int, dtype: torch.dtype) -> int:
    """How the matrices of the blocks ``path`` (a form's trunk and head 1) multiply ``rows`` rows fastest (CPU):
    :data:`BY_INPUT` (x @ W), :data:`BY_WEIGHT` (stored (out, in), W @ x^T) or :data:`MKL_PACKED`
    (:class:`PackedMatrices` for exactly that many rows: up to :data:`PACKED_ROWS`, float32, where PyTorch has MKL).
    Timed once per shape and :func:`timed_rows` in the process (:func:`faster_layout`) over the blocks' feed-forward
    matrices in turn, so that each streams from memory as in a step. x @ W without timing where another copy of the
    weights would take more than a quarter of the memory available."""
    first = path[0]
    timed = timed_rows(rows)
    if not timed:
        return BY_INPUT
    key = ("blocks", tuple(first.gate_up.shape[1:]), len(path), timed, dtype)
    if key in _LAYOUTS:
        return _LAYOUTS[key]
    packed = [blocks for blocks in path if not blocks.quantized]
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
            product(x, m, by_weight=True)

    products = [by_input, by_weight]
    if PackedMatrices.available(timed, dtype):  # a count it packs for is timed exactly (timed == rows)
        mkl = [PackedMatrices(m, timed) for m in matrices]

        def mkl_packed(x: Tensor) -> None:
            for m in mkl:
                m(x)

        products.append(mkl_packed)
    return faster_layout(key, x, tuple(products))
