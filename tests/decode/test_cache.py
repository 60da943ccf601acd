"""The inference form with its KV cache computes what the full forward computes, at every position it is asked for."""

import pytest
import torch

from mtp.decode import inference as inference_module
from mtp.decode import packed as packed_module
from mtp.decode.cache import KVCache
from mtp.decode.inference import InferenceModel
from mtp.decode.plan import Plan
from mtp.decode.settings import HeadsSettings, StepSettings
from tests.decode import helpers
from tests.decode.helpers import HEAD_TYPES


def tiny_model(**kwargs):
    """helpers.tiny_model with every norm weight away from 1, so that a norm weight lost in packing shows."""
    model = helpers.tiny_model(**kwargs)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.copy_(1 + 0.3 * torch.randn(parameter.shape, generator=generator))
    return model


def cached_step(inference: InferenceModel, tokens, cache, last, truth=None):
    """Head 1's logits at every new position (B, S, V) and heads 2..k's at ``last`` (heads - 1, B, V), one step.

    truth (B, L): the whole sequence of each row, which its step continues; the drafter is handed the true tokens
    after ``last`` (the next token, and what causal depths condition on) instead of its own choices."""
    cache.begin(tokens.size(1))
    held = cache.positions[:, 0]
    head1, hidden = inference.verify(tokens, cache)
    drafts = None
    if inference.heads > 1:
        last = torch.tensor(last)
        rows = torch.arange(tokens.size(0))
        after = held + last  # each row's last accepted position in the whole sequence
        following = torch.stack([truth[rows, after + j] for j in range(1, inference.heads + 1)], dim=1)  # (B, heads)
        logits = []

        def choose(step_logits, first):  # record the logits, hand back the true tokens
            logits.append(step_logits)
            return following[:, 1 + first : 1 + first + step_logits.size(0)].T

        inference.draft(hidden, cache, last, tokens, following[:, 0], choose)
        drafts = torch.cat(logits)
    cache.commit(tokens.size(1))
    return head1, drafts


def check_step(full, head1, drafts, rows_from: list[int], last: list[int]) -> None:
    """full: (n, B, T, V); row b of the step covers full positions rows_from[b] onwards."""
    for b, start in enumerate(rows_from):
        S = head1.size(1)
        torch.testing.assert_close(head1[b], full[0, b, start : start + S], rtol=1e-5, atol=1e-5)
        if drafts is not None:
            torch.testing.assert_close(
                drafts[:, b], full[1 : 1 + len(drafts), b, start + last[b]], rtol=1e-5, atol=1e-5
            )


def full_forward(model, tokens, length):
    """Every head's logits over the first ``length`` tokens, causal heads conditioned on the true ones after."""
    following = torch.stack([tokens[:, j : j + length] for j in range(1, model.n_future)])
    return model(tokens[:, :length], following=following)


CACHED_CASES = {**HEAD_TYPES, "causal-zero-first": {"head_type": "causal", "causal_first_token": "zero"}}
"""Every head type, and causal depths that read no token at position 0 (row 2's first step drafts from there)."""


@pytest.mark.parametrize(
    ("head_type", "compile", "draft_vocab"),
    [
        *((name, False, 0) for name in CACHED_CASES),
        *((name, False, 24) for name in HEAD_TYPES),
        pytest.param("transformer", True, 0, marks=pytest.mark.slow),
    ],
    ids=[*CACHED_CASES, *(f"{name}-draft-vocab" for name in HEAD_TYPES), "transformer-compiled"],
)
def test_cached_steps_equal_the_full_forward_for_ragged_rows(head_type, compile, draft_vocab):
    """Head 1's logits at every position of a step, the draft heads' at each row's last accepted one; with a reduced
    draft vocabulary, theirs are -inf outside it, as the full forward's are."""
    model = tiny_model(draft_vocab=draft_vocab, **CACHED_CASES[head_type])
    tokens = torch.randint(0, 40, (3, 18), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = full_forward(model, tokens, 14)  # (4, 3, 14, 40)
        inference = InferenceModel(model, heads=4, compile=compile)
        cache = inference.new_cache(3, 32)
        head1, drafts = cached_step(inference, tokens[:, :6], cache, [5, 3, 0], tokens)
        check_step(full, head1, drafts, [0, 0, 0], [5, 3, 0])
        # rows advance by different amounts: roll two rows back and re-feed what they dropped
        cache.rollback([6, 4, 1])
        refeed = torch.stack([tokens[0, 6:10], tokens[1, 4:8], tokens[2, 1:5]])
        head1, drafts = cached_step(inference, refeed, cache, [0, 3, 2], tokens)
        check_step(full, head1, drafts, [6, 4, 1], [0, 3, 2])
        cache.rollback([7, 8, 4])
        refeed = torch.stack([tokens[0, 7:10], tokens[1, 8:11], tokens[2, 4:7]])
        head1, drafts = cached_step(inference, refeed, cache, [2, 0, 1], tokens)
        check_step(full, head1, drafts, [7, 8, 4], [2, 0, 1])
    assert cache.host_lengths == [10, 11, 7] and cache.lengths.tolist() == [10, 11, 7]


@pytest.mark.parametrize("head_type", ["transformer", "causal"])
def test_cached_steps_with_spans_rounded_up_equal_the_full_forward(monkeypatch, head_type):
    """As on a GPU (inference.SPAN_MULTIPLE), attention spans the held positions rounded up to a multiple of 8 here:
    the positions beyond are masked (empty, or stale after a rollback), so every step computes what the full
    forward does; the causal heads' own caches round too."""
    monkeypatch.setitem(inference_module.SPAN_MULTIPLE, "cpu", 8)
    spans = []
    begin = KVCache.begin
    monkeypatch.setattr(KVCache, "begin", lambda self, *args: (begin(self, *args), spans.append(self.span))[0])
    test_cached_steps_equal_the_full_forward_for_ragged_rows(head_type, False, 0)
    assert set(spans) == {8, 16}  # 6 new positions, then up to 11 and 11 held and fed: each rounded up


@pytest.mark.parametrize("layout", ["BY_WEIGHT", "MKL_PACKED"])
def test_cached_steps_equal_the_full_forward_in_every_block_layout(monkeypatch, layout):
    """The path's blocks in each CPU layout a step can pick (W @ x^T, or MKL's packed matrices for the step's row
    count) compute what x @ W does: the full forward's logits, step after step of other row counts."""
    if layout == "MKL_PACKED" and not torch.backends.mkl.is_available():
        pytest.skip("this PyTorch has no MKL to pack matrices with")
    chosen = getattr(packed_module, layout)
    monkeypatch.setattr(InferenceModel, "block_layout", lambda self, rows, dtype: chosen)
    calls = []
    product = packed_module.PackedMatrices.__call__
    monkeypatch.setattr(
        packed_module.PackedMatrices, "__call__", lambda self, x: calls.append(x.size(1)) or product(self, x)
    )
    test_cached_steps_equal_the_full_forward_for_ragged_rows("transformer", False, 0)
    # the path's 3 rows of 6, 4 and 3 positions, each count packed (and the draft heads' blocks at 3 last positions)
    assert (set(calls) == {18, 12, 9, 3}) == (layout == "MKL_PACKED")


def test_packed_copies_of_the_blocks_are_kept_for_a_few_row_counts():
    """Each packed copy holds the weights once more: a batch shrinking row by row must not keep one per count."""
    if not torch.backends.mkl.is_available():
        pytest.skip("this PyTorch has no MKL to pack matrices with")
    blocks = InferenceModel(tiny_model(), 1).path[0]
    copies = {rows: blocks.packed_for(rows) for rows in (5, 4, 3)}
    assert blocks.packed_for(5) is copies[5]  # kept, and now the most recently used
    blocks.packed_for(2)  # a fourth count: the least recently used (4) is dropped
    assert list(blocks._packed) == [3, 5, 2] == [3, 5, 2][: packed_module.PACKED_COPIES]
    assert blocks.packed_for(4) is not copies[4] and blocks.packed_for(4).packed_rows == 4


def test_a_span_rounds_up_to_its_multiple_within_the_cache():
    cache = KVCache(1, 2, 1, 4, 12, "cpu", torch.float32, span_multiple=8)
    cache.begin(3)
    assert cache.span == 8 and cache.mask.shape == (2, 1, 3, 8)
    assert cache.mask[0, 0].tolist() == [[j <= i for j in range(8)] for i in range(3)]  # the rest masked
    cache.commit(3)
    cache.begin(6)  # 9 positions: rounded up to 16, but the cache holds 12
    assert cache.span == 12 and cache.mask.shape == (2, 1, 6, 12)


def test_cached_steps_equal_the_full_forward_with_the_unembeddings_packed(monkeypatch):
    """MKL's packed unembedding (a step of up to PACKED_ROWS rows) gives head 1's logits at every position of a step
    and the draft heads' (a reduced vocabulary's, an unembedding of its own) what the full forward gives."""
    if not torch.backends.mkl.is_available():
        pytest.skip("this PyTorch has no MKL to pack matrices with")
    monkeypatch.setattr(packed_module, "_LAYOUTS", {})
    monkeypatch.setattr(packed_module, "faster_layout", lambda key, rows, products: len(products) - 1)
    packed, product = [], packed_module.Unembedding.packed_rows

    def counted(self, rows):
        packed.append(rows.size(0))
        return product(self, rows)

    monkeypatch.setattr(packed_module.Unembedding, "packed_rows", counted)
    model = tiny_model(draft_vocab=24)
    tokens = torch.randint(0, 40, (1, 18), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = full_forward(model, tokens, 14)
        inference = InferenceModel(model, heads=4)
        cache = inference.new_cache(1, 32)
        for held, fed, last in ((0, 5, 4), (5, 3, 2), (8, 1, 0), (9, 4, 1)):
            head1, drafts = cached_step(inference, tokens[:, held : held + fed], cache, [last], tokens)
            check_step(full, head1, drafts, [held], [last])
            cache.rollback([held + last + 1])
    assert packed == [5, 3, 3, 3, 1, 3, 4, 3]  # head 1's rows, then the three draft heads' at one position each


def test_the_unembedding_packs_for_a_few_row_counts_of_float32_where_memory_allows(monkeypatch):
    """Each packed copy holds the unembedding once more: kept for at most PACKED_COPIES row counts (the least recently
    used dropped), offered only for float32 steps of up to PACKED_ROWS rows, and not where the copies would take more
    than a quarter of the memory available."""
    if not torch.backends.mkl.is_available():
        pytest.skip("this PyTorch has no MKL to pack matrices with")
    from mtp.decode.packed import PACKED_COPIES, PACKED_ROWS, Unembedding

    offered = []
    monkeypatch.setattr(packed_module, "_LAYOUTS", {})

    def last_product(key, rows, products):
        offered.append(len(products))
        return len(products) - 1

    monkeypatch.setattr(packed_module, "faster_layout", last_product)
    torch.manual_seed(0)
    unembedding = Unembedding(torch.randn(300, 24))
    for rows in (5, 4, 3, 5, 2, PACKED_ROWS + 1):
        x = torch.randn(rows, 24)
        torch.testing.assert_close(unembedding(x), x @ unembedding.weight.T)
    assert offered == [3, 3, 3, 3, 3, 2]  # more rows than PACKED_ROWS: x @ W^T and W @ x^T only
    assert list(unembedding._packed) == [3, 5, 2][-PACKED_COPIES:]  # 4 dropped, 5 kept as the more recently used
    offered.clear()
    Unembedding(torch.randn(300, 24, dtype=torch.float64))(torch.randn(2, 24, dtype=torch.float64))
    monkeypatch.setattr(packed_module, "available_bytes", lambda device: 1000)  # bytes: far below any copy
    short = Unembedding(torch.randn(300, 24))
    short(torch.randn(2, 24))
    assert offered == [2, 2] and not short._packed


@pytest.mark.parametrize("head_type", HEAD_TYPES)
def test_a_draft_vocabulary_chosen_at_decoding_scores_the_first_token_ids(head_type):
    """InferenceModel(draft_first_ids=N): heads 2..k's logits are the full forward's over token ids 0..N-1 and -inf
    above, on every kind of head (the ones sharing head 1's unembedding, and linear and medusa heads' own); head 1's
    are untouched."""
    model = tiny_model(**HEAD_TYPES[head_type])
    tokens = torch.randint(0, 40, (3, 18), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = full_forward(model, tokens, 14)
        inference = InferenceModel(model, heads=4, draft_first_ids=24)
        head1, drafts = cached_step(inference, tokens[:, :6], inference.new_cache(3, 32), [5, 3, 0], tokens)
    kept = full.clone()
    kept[1:, ..., 24:] = float("-inf")
    check_step(kept, head1, drafts, [0, 0, 0], [5, 3, 0])
    assert torch.isinf(drafts[..., 24:]).all() and torch.isfinite(drafts[..., :24]).all()
    # the forms built once per model are kept apart by their draft vocabulary
    every, first = InferenceModel.of(model, 4), InferenceModel.of(model, 4, draft_first_ids=24)
    assert every.draft_tokens is None and first.draft_tokens.tolist() == list(range(24))


def test_fewer_heads_use_only_their_head_blocks():
    model = tiny_model()
    tokens = torch.randint(0, 40, (1, 5))
    with torch.no_grad():
        full = model(tokens)
        for heads in (1, 2, 3):
            inference = InferenceModel(model, heads)
            head1, drafts = cached_step(inference, tokens, inference.new_cache(1, 8), [4], torch.randint(0, 40, (1, 9)))
            check_step(full, head1, drafts, [0], [4])
            assert drafts is None or len(drafts) == heads - 1


@pytest.mark.parametrize("head_type", ["transformer", "causal"])
def test_keep_rows_drops_finished_rows(head_type):
    model = tiny_model(**HEAD_TYPES[head_type])
    tokens = torch.randint(0, 40, (3, 13))
    with torch.no_grad():
        full = full_forward(model, tokens, 9)
        inference = InferenceModel(model, heads=4)
        cache = inference.new_cache(3, 16)
        cached_step(inference, tokens[:, :5], cache, [4, 4, 4], tokens)
        cache.rollback([5, 5, 5])  # a step ends at the accepted lengths (causal depths drop their drafted entries)
        cache.keep_rows([0, 2])
        head1, drafts = cached_step(inference, tokens[[0, 2], 5:9], cache, [3, 1], tokens[[0, 2]])
    check_step(full[:, [0, 2]], head1, drafts, [5, 5], [3, 1])


def test_rollback_refuses_lengths_it_does_not_hold():
    """A rollback past what a row holds, below 0, or for another number of rows is an error (also under python -O,
    which drops asserts), not a cache that claims positions it never computed."""
    cache = InferenceModel.of(tiny_model(), 1).new_cache(2, 16)
    cache.begin(3)
    cache.commit(3)
    cache.rollback([2, 3])
    for lengths in ([4, 3], [-1, 0], [1]):
        with pytest.raises(ValueError, match="rollback to lengths"):
            cache.rollback(lengths)


def test_compiled_steps_raise_the_recompile_limit_only_while_they_run(monkeypatch):
    """Dynamo compiles at a call, so the decoder's higher limit must be in force there, and nowhere else: the
    process's own setting (a user's, another library's) is left as it was. A stand-in for torch.compile records the
    limit each call runs under."""
    from mtp.decode import GenerationConfig, generate

    limits = []

    def compile_recording(fn, **options):
        def step(*args, **kwargs):
            limits.append(torch._dynamo.config.recompile_limit)
            return fn(*args, **kwargs)

        return step

    monkeypatch.setattr(torch, "compile", compile_recording)
    # dynamo's own patch, not monkeypatch's: pytest's undo may delete the setting, which hides it from dynamo after
    with torch._dynamo.config.patch(recompile_limit=8):
        generate(
            helpers.tiny_model(),
            [[1, 2, 3]],
            Plan(GenerationConfig(max_new_tokens=4), heads=HeadsSettings(heads=4), step=StepSettings(compile=True)),
        )
        assert limits and set(limits) == {32}
        assert torch._dynamo.config.recompile_limit == 8


@pytest.mark.slow
def test_decoding_compiled_leaves_the_recompile_limit_as_it_was():
    from mtp.decode import GenerationConfig, generate

    before = torch._dynamo.config.recompile_limit
    model = helpers.tiny_model()
    config = Plan(GenerationConfig(max_new_tokens=4), heads=HeadsSettings(heads=4))
    expected, _ = generate(model, [[1, 2, 3], [4]], config)
    out, _ = generate(
        model,
        [[1, 2, 3], [4]],
        Plan(GenerationConfig(max_new_tokens=4), heads=HeadsSettings(heads=4), step=StepSettings(compile=True)),
    )
    assert out == expected
    assert torch._dynamo.config.recompile_limit == before


@pytest.mark.slow  # ~4 s: compiles
@pytest.mark.parametrize("by_weight", [False, True], ids=["x-by-weight", "weight-by-x"])
def test_a_compiled_product_of_one_row_stays_a_blas_call_on_cpu(by_weight):
    """Inductor lowers a one-row (or one-column) bmm on CPU to a loop of its own, which made SmolLM2's compiled
    one-row step about twice the eager one's time: the compiled product must leave a BLAS call in the generated code
    for every layout a compiled step takes, and equal the eager product."""
    from torch._inductor.utils import run_and_get_code  # an internal of inductor's, needed by this test only

    x, weight = torch.randn(3, 1, 16), torch.randn(3, 16, 24)
    stored = weight.transpose(1, 2).contiguous() if by_weight else weight
    compiled = torch.compile(lambda x, w: packed_module.product(x, w, by_weight), fullgraph=True)
    try:
        out, codes = run_and_get_code(compiled, x, stored)
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(out, torch.bmm(x, weight))
    calls = [line for code in codes for line in code.splitlines() if "extern_kernels." in line and "import" not in line]
    assert any("mm(" in line for line in calls), "\n".join(codes)


def test_the_unembedding_takes_the_product_measured_faster_and_both_products_agree(monkeypatch):
    """On CPU the unembedding times x @ W^T and W @ x^T the first time it meets a row count and keeps the faster
    (which one depends on the CPU and the rows); both are the same logits up to rounding, in rows."""
    import time

    from mtp.decode.packed import Unembedding, faster_layout

    torch.manual_seed(0)
    unembedding = Unembedding(torch.randn(300, 24))
    for rows in (1, 3, 8):
        x = torch.randn(rows, 24)
        expected = x @ unembedding.weight.T
        products = [unembedding.rows_by_transposed, unembedding.rows_by_weight]
        if torch.backends.mkl.is_available():
            products.append(unembedding.packed_rows)
        for product in products:
            logits = product(x)
            assert logits.is_contiguous() and torch.allclose(logits, expected, atol=1e-5)
        assert torch.allclose(unembedding(x[None]), expected[None], atol=1e-5)

    monkeypatch.setattr(packed_module, "_LAYOUTS", {})
    calls = []

    def slow(rows):
        calls.append("slow")
        time.sleep(0.003)
        return rows

    def fast(rows):
        calls.append("fast")
        return rows

    assert faster_layout(("shape",), torch.zeros(2, 1), (slow, fast)) == 1
    assert faster_layout(("shape",), torch.zeros(2, 1), (fast, slow)) == 1  # measured once: kept for that shape
    assert calls == ["slow", "fast"] * 6  # a warm-up each, then rounds that time each in turn
    assert faster_layout(("other",), torch.zeros(2, 1), (fast, slow)) == 0

    def paused(seconds):  # the machine pauses during the 2nd to 4th product calls, whichever product runs then
        def product(rows):
            calls.append(seconds)
            time.sleep(seconds + (0.03 if 2 <= len(calls) <= 4 else 0))
            return rows

        return product

    calls.clear()
    assert faster_layout(("paused",), torch.zeros(2, 1), (paused(0.001), paused(0.006))) == 0


def test_layouts_are_timed_on_fewer_than_256_rows_and_larger_counts_take_x_at_w_untimed(monkeypatch):
    """A large batch shrinking row by row must not time both layouts at every count (each timing costs several of
    its steps): counts up to 32 are timed each, larger ones at the power of two below them, on that many rows, and
    from 256 rows x @ W is taken without timing (W @ x^T's copy back to rows loses there); the product still covers
    every row."""
    from mtp.decode.packed import Unembedding, timed_rows

    assert [timed_rows(n) for n in (1, 7, 32, 33, 63, 64, 200, 255, 256, 40_000)] == [
        1, 7, 32, 32, 32, 64, 128, 128, 0, 0,
    ]  # fmt: skip
    monkeypatch.setattr(packed_module, "_LAYOUTS", {})
    timed = []

    def faster_layout(key, rows, products):
        timed.append((key[1], rows.size(0)))
        return 1

    monkeypatch.setattr(packed_module, "faster_layout", faster_layout)
    torch.manual_seed(0)
    unembedding = Unembedding(torch.randn(50, 8))
    products = []
    monkeypatch.setattr(
        unembedding, "rows_by_transposed", lambda rows: products.append("x @ W^T") or rows @ unembedding.transposed
    )
    for rows in (3000, 300, 200, 100):
        x = torch.randn(rows, 8)
        torch.testing.assert_close(unembedding(x), x @ unembedding.weight.T)
    assert timed == [(128, 128), (64, 64)]  # the real faster_layout measures a key once; this stand-in records each ask
    assert products == ["x @ W^T"] * 2  # 3000 and 300 rows, untimed


@pytest.mark.parametrize("rows", [1, 2, 3])
def test_a_product_by_weight_of_one_row_is_taken_as_two_and_gives_that_row(rows):
    """weight @ x^T of one row multiplies the row twice (a BLAS matrix product, not a matrix-vector one: some BLAS
    libraries run the latter several times slower) and returns the one row; other counts as they are."""
    torch.manual_seed(0)
    x, weight = torch.randn(3, rows, 16), torch.randn(3, 16, 24)
    stored = weight.transpose(1, 2).contiguous()
    torch.testing.assert_close(packed_module.product(x, stored, by_weight=True), torch.bmm(x, weight))
    assert packed_module.paired(x).size(1) == (2 if rows == 1 else rows)
    unembedding = packed_module.Unembedding(torch.randn(50, 16))
    torch.testing.assert_close(unembedding.rows_by_weight(x[0]), x[0] @ unembedding.weight.T)
