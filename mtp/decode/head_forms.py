"""The draft heads' inference forms, one per head type: how heads 2..k draft inside a decoding step.

Each form is built from the model and the inference form it drafts for (:class:`mtp.decode.inference.InferenceModel`),
packs the heads' weights (:mod:`mtp.decode.packed`) and drafts from the step's forward: ``draft(hidden, cache, last,
inputs, next_token, choose)`` reads what the path left for the heads at each row's last accepted position (``last``)
and returns the drafts, (B, heads - 1). :data:`HEAD_FORMS` maps each head type's module (:mod:`mtp.model.heads`)
to its form.

=================  ==================================================================================================
ParallelBlocks     transformer heads: blocks on the trunk output, stacked and run as one batched computation
Unembeddings       linear and medusa heads: unembeddings of the trunk output (after residual blocks: medusa)
CausalChain        causal heads: DeepSeek-V3 MTP depths, one after another, each on a cache of its own
Eagle3Chain        eagle3 heads: EAGLE-3's layer on three trunk layers' states, then on its own, one slot of the cache
=================  ==================================================================================================
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from mtp.decode.cache import ChainCache, KVCache
from mtp.decode.graphs import StepGraphs
from mtp.decode.packed import OWN_PRODUCTS, PackedBlocks, Unembedding, matrices_in, product
from mtp.model import MTPModel
from mtp.model.config import ModelConfig
from mtp.model.heads import CausalHeads, Eagle3Heads, Heads, LinearHeads, MedusaHeads, ParallelHeads

Chooser = Callable[[Tensor, int], Tensor]
"""``choose(logits, first)``: draft tokens (h, B) from heads first+2..first+h+1's logits (h, B, V): greedy argmax, or
samples whose proposals the caller keeps. A causal chain calls it once per depth, since depth k needs draft k-1."""


class Form(Protocol):
    """What a head form uses of the inference form it drafts for (:class:`mtp.decode.inference.InferenceModel`)."""

    config: ModelConfig
    heads: int
    eps: float
    embeddings: Tensor
    rotations: Tensor
    graphs: StepGraphs | None
    draft_rows: slice

    run_blocks: Callable[..., Tensor]
    """:meth:`mtp.decode.inference.InferenceModel.run_blocks`."""

    def kv_cache(self, slots: int, batch_size: int, max_len: int, storage: Callable | None = None) -> KVCache: ...

    def draft_logits(self, x: Tensor) -> Tensor: ...

    def full_vocab(self, logits: Tensor) -> Tensor: ...


class HeadForm:
    """Heads 2..k of one type, packed to draft inside a step of the inference form ``form``."""

    cache_slots = 0
    """Slots the heads' blocks take in the form's cache, after the path's."""
    own_output = False
    """The heads unembed with matrices of their own (else with the form's ``draft_output``, head 1's or its rows of a
    reduced draft vocabulary, which the form quantizes with them)."""

    def __init__(self, model: MTPModel, form: Form) -> None:
        self.form = form

    @staticmethod
    def reads(model: MTPModel) -> list[int]:
        """The path's states the heads read, each as the number of the path's blocks applied before it (what
        :meth:`mtp.decode.inference.InferenceModel.verify` returns for them, concatenated): the path's output."""
        return [len(model.layers)]

    def prepare(self, cache: KVCache, batch_size: int, max_len: int) -> None:
        """Add what the heads keep beside the form's new ``cache`` (rolled back and trimmed with it)."""

    def to_precision(self, form: Form, precision: str) -> HeadForm:
        """These heads with their matrices in ``precision`` (:func:`mtp.decode.packed.matrices_in`: int8 drafts, or a
        quantized target's int8 or int4), drafting for ``form`` (:meth:`InferenceModel.with_int8_drafts`,
        :meth:`InferenceModel.quantized`)."""
        raise NotImplementedError

    def draft(
        self, hidden: Tensor, cache: KVCache, last: Tensor, inputs: Tensor, next_token: Tensor, choose: Chooser
    ) -> Tensor:
        """Draft tokens (B, heads - 1): :meth:`mtp.decode.inference.InferenceModel.draft`."""
        raise NotImplementedError


class ParallelBlocks(HeadForm):
    """Heads 2..k as blocks on the trunk output, stacked along a leading head dimension and run as one batched
    computation; their keys and values follow the path's in the cache."""

    @staticmethod
    def reads(model: MTPModel) -> list[int]:
        return [len(model.layers) - 1]  # the trunk output: what head 1's block reads too

    def __init__(self, model: MTPModel, form: Form) -> None:
        config = model.config
        super().__init__(model, form)
        self.blocks = PackedBlocks(
            [model.head_block(k) for k in range(2, form.heads + 1)], config.n_heads, config.n_kv_heads
        )
        self.cache_slots = form.heads - 1
        self.slots = slice(len(model.layers), len(model.layers) + form.heads - 1)

    def to_precision(self, form: Form, precision: str) -> ParallelBlocks:
        quantized = copy.copy(self)
        quantized.form, quantized.blocks = form, self.blocks.to_precision(precision)
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
        out = form.run_blocks(self.blocks, x, rotation, cache, self.slots, last)  # (h, B, d)
        return (form.draft_logits(out),)


class Unembeddings(HeadForm):
    """Heads 2..k as unembeddings of the trunk output (linear), after residual blocks of their own (medusa)."""

    own_output = True

    def __init__(self, model: MTPModel, form: Form) -> None:
        super().__init__(model, form)
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

    def to_precision(self, form: Form, precision: str) -> Unembeddings:
        quantized = copy.copy(self)
        quantized.form, quantized.outputs = form, matrices_in(precision, self.outputs, unembedding=True)
        if self.residual is not None:
            quantized.residual = [matrices_in(precision, weight) for weight in self.residual]
        return quantized

    def draft(self, hidden, cache, last, inputs, next_token, choose) -> Tensor:
        x = hidden[torch.arange(hidden.size(0), device=hidden.device), last]  # (B, d)
        normed = F.rms_norm(x, (x.size(-1),), eps=self.form.eps).expand(self.form.heads - 1, -1, -1)  # (h, B, d)
        if self.residual is not None:
            normed = normed * self.norm_weight
            for weight in self.residual:
                normed = normed + F.silu(product(normed, weight))
        return choose(self.form.full_vocab(product(normed, self.outputs)), 0).T


class CausalChain(HeadForm):
    """Heads 2..k as DeepSeek-V3 MTP depths, drafted one after another: depth k reads depth k-1's hidden state and
    the embedding of draft k-1 (of the token after the accepted ones, for depth 2).

    Each depth is a causal block over its own sequence: at position i it reads token t_{i+k-1} and h_{k-1}(i), as in
    training. So depth k's keys and values at i are final once t_{i+k-1} is known (accepted), which lags the trunk
    by k - 2 positions; each step recomputes a depth from where its final entries end up to the last accepted
    position, with drafts standing in for the tokens not known yet (those entries are rolled back after the step).
    Every depth keeps its own cache and a buffer of its hidden states (:class:`mtp.decode.cache.ChainCache`).
    """

    def __init__(self, model: MTPModel, form: Form) -> None:
        super().__init__(model, form)
        config = model.config
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
        self.zero_first_token = config.causal_first_token == "zero"
        self.blocks = [pack(model.heads.block(k), pack_block) for k in depths]
        self.inputs: list = [pack(model.heads.causal_input(k), pack_input) for k in depths]  # or quantized stacks

    def to_precision(self, form: Form, precision: str) -> CausalChain:
        """These depths in ``precision`` (a shared depth's quantized once), drafting for ``form``."""
        quantized = copy.copy(self)
        quantized.form, quantized.blocks = form, [blocks.to_precision(precision) for blocks in self.blocks]
        inputs = {id(matrix): matrix for matrix in self.inputs}
        converted = {key: matrices_in(precision, matrix[None]) for key, matrix in inputs.items()}  # (1, 2d, d)
        quantized.inputs = [converted[id(matrix)] for matrix in self.inputs]
        return quantized

    def prepare(self, cache: KVCache, batch_size: int, max_len: int) -> None:
        form = self.form
        caches = [form.kv_cache(1, batch_size, max_len) for _ in self.blocks]
        shape = (form.heads - 1, batch_size, max_len, form.config.d_model)  # the last depth's are never read
        cache.chain = ChainCache(caches, form.embeddings.new_zeros(shape))

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
            if self.zero_first_token:  # position 0 reads no token, as in training (model.causal_first_token=zero)
                embedded = embedded.masked_fill((positions == 0)[..., None], 0.0)
            d = (embedded.size(-1),)
            x = torch.cat([F.rms_norm(embedded, d, eps=eps), F.rms_norm(previous, d, eps=eps)], dim=-1)
            projection = self.inputs[k - 2]
            if isinstance(projection, OWN_PRODUCTS):
                x = projection(x[None])[0]  # (B, width, d)
            else:
                x = torch.matmul(x, projection)  # (B, width, d)
            rotation = form.rotations[depth_cache.rotary]
            read = held + last - positions[:, 0]  # (B,) the position each row drafts from, within the window
            if k < form.heads:  # the next depth reads this one's hidden states at every position of the window
                out = form.run_blocks(self.blocks[k - 2], x[None], rotation, depth_cache, slice(0, 1))[
                    0
                ]  # (B, width, d)
                chain.hidden[k - 1][rows, positions] = out
                at_last = out[rows[:, 0], read]  # (B, d)
            else:  # the last depth: keys and values everywhere, the rest of the block at the one position read
                at_last = form.run_blocks(self.blocks[k - 2], x[None], rotation, depth_cache, slice(0, 1), read)[0]
            token = choose(form.draft_logits(at_last)[None], k - 2)[0]
            stream[rows[:, 0], last + k] = token
            drafts.append(token)
            depth_cache.commit(width)
        return torch.stack(drafts, dim=1)


class Eagle3Chain(HeadForm):
    """EAGLE-3's draft layer (:class:`mtp.model.heads.Eagle3Heads`) drafting recursively inside the step, on one slot
    of the form's cache after the path's.

    At a position i the slot holds the layer's keys and values of the fused trunk features at i and the token after i
    (what draft 1 from i reads): final once that token is known, which for the last accepted position is the step's
    next token. So each step writes the step's positions (the fused features of the step's inputs, each with the
    input after it, the next token after the last accepted one; the entries past that are overwritten by the chain or
    rolled back with the step), reads the layer's output at the last accepted position (draft 1), then drafts from its
    own output state one position further per draft, each position attending to the accepted entries and to its own
    chain's: the training-time test's attention (:class:`mtp.model.heads.Eagle3Layer`)."""

    cache_slots = 1
    own_output = True

    @staticmethod
    def reads(model: MTPModel) -> list[int]:
        return list(model.config.feature_layers)  # the inputs of those trunk layers: blocks applied before them

    def __init__(self, model: MTPModel, form: Form) -> None:
        super().__init__(model, form)
        config, heads = model.config, model.heads
        self.slot = slice(len(model.layers), len(model.layers) + 1)
        self.fc = heads.fc.weight.T.contiguous()  # (3d, d), or a quantized stack of it
        # its split norm's weights folded into q/k/v as any block's norm is (the layer is named as a Block is)
        self.layer = PackedBlocks([heads.layer], config.n_heads, config.n_kv_heads)
        self.output = Unembedding(model.head_weight(2)[form.draft_rows] * heads.norm.weight)  # its own norm folded in

    def to_precision(self, form: Form, precision: str) -> Eagle3Chain:
        """This layer, its fc and its unembedding in ``precision``, drafting for ``form``."""
        quantized = copy.copy(self)
        quantized.form, quantized.layer = form, self.layer.to_precision(precision)
        quantized.fc, quantized.output = matrices_in(precision, self.fc[None]), self.output.to_precision(precision)
        return quantized

    def draft(self, hidden, cache, last, inputs, next_token, choose) -> Tensor:
        form = self.form
        B, S = inputs.shape
        held = cache.positions[:, 0]  # (B,) positions held before this step
        if form.graphs is not None and cache.max_length:  # not the prompts' step: a width per prompt length
            state, logits = form.graphs.run("eagle3 first", self.first, cache, hidden, inputs, next_token, last)
        else:
            state, logits = self.first(cache, hidden, inputs, next_token, last)
        token = choose(logits[None], 0)[0]
        drafts = [token]
        keys = torch.arange(cache.max_len, device=inputs.device)
        for j in range(1, form.heads - 1):  # draft j + 1 from position held + last + j, reading draft j
            position = held + last + j
            multiple = cache.span_multiple
            span = min(cache.max_len, -(-(cache.span + j) // multiple) * multiple)  # past every row's position
            mask = (keys[:span] <= position[:, None])[:, None, None]  # (B, 1, 1, span)
            if form.graphs is not None and cache.max_length:
                state, logits = form.graphs.run("eagle3 chain", self.chain, cache, state, token, position, mask)
            else:
                state, logits = self.chain(cache, state, token, position, mask)
            token = choose(logits[None], j)[0]
            drafts.append(token)
        return torch.stack(drafts, dim=1)

    def first(
        self, cache: KVCache, hidden: Tensor, inputs: Tensor, next_token: Tensor, last: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The layer over the step's positions (its keys and values written at each), on the fused features
        ``hidden`` (B, S, 3d) and the token after each input: its output state (B, d) and logits (B, V) at ``last``."""
        rows = torch.arange(inputs.size(0), device=inputs.device)
        after = torch.cat([inputs[:, 1:], inputs[:, -1:]], dim=1)  # the last position's is never read
        after[rows, last] = next_token
        if isinstance(self.fc, OWN_PRODUCTS):
            fused = self.fc(hidden[None])[0]  # (B, S, d)
        else:
            fused = torch.matmul(hidden, self.fc)
        state = self.form.run_blocks(
            self.layer, fused[None], self.form.rotations[cache.rotary], cache, self.slot, last,
            attention_input=self.attention_input(after, fused)[None],
        )[0]  # fmt: skip
        return state, self.logits(state)

    def chain(
        self, cache: KVCache, state: Tensor, token: Tensor, position: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The layer at one position per row, ``position`` (B,), on its own last output state (B, d) and the draft
        ``token`` (B,), attending under ``mask`` (B, 1, 1, span): its output state and logits there."""
        positions = position[:, None]
        state = self.form.run_blocks(
            self.layer, state[None, :, None], self.form.rotations[positions], cache, self.slot,
            attention_input=self.attention_input(token[:, None], state[:, None])[None],
            at=(positions, mask.size(-1), mask),
        )[0, :, 0]  # fmt: skip
        return state, self.logits(state)

    def attention_input(self, tokens: Tensor, state: Tensor) -> Tensor:
        """[RMSNorm(Emb(tokens)); RMSNorm(state)] (..., 2d), the norms' weights folded into the layer's q/k/v."""
        form = self.form
        embedded = F.embedding(tokens, form.embeddings)
        d = (embedded.size(-1),)
        return torch.cat([F.rms_norm(embedded, d, eps=form.eps), F.rms_norm(state, d, eps=form.eps)], dim=-1)

    def logits(self, state: Tensor) -> Tensor:
        """The draft's logits (B, V) of its output states (B, d), through its own norm and unembedding."""
        normed = F.rms_norm(state, (state.size(-1),), eps=self.form.eps)
        return self.form.full_vocab(self.output(normed))


HEAD_FORMS: dict[type[Heads], type[HeadForm]] = {
    ParallelHeads: ParallelBlocks,
    LinearHeads: Unembeddings,
    MedusaHeads: Unembeddings,
    CausalHeads: CausalChain,
    Eagle3Heads: Eagle3Chain,
}
"""The form of each head type's module."""


def head_form(model: MTPModel, form: Form) -> HeadForm:
    """``model``'s heads 2..``form.heads`` as their type's form, drafting for ``form``."""
    return HEAD_FORMS[type(model.heads)](model, form)
