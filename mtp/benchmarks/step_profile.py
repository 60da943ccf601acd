"""Where a decoding step's time goes: one :func:`~mtp.decode.generate` run under ``torch.profiler``, its time per
forward split into the matrix products (every matrix the step multiplies, and the bytes per second they stream),
attention, norms, the cache's writes, the rest of PyTorch's operations, compiled code's dispatch, and what runs outside
PyTorch's operations (Python: the decoding loop, its bookkeeping, host syncs).

A step is split by the profiler's tree of events: an event is counted once, in the first category (in the order of
:data:`CATEGORIES`) that its name matches, with its time including its children's (a norm's power, mean and rsqrt are
the norm's); an event that matches none gives its own time to the last category it belongs to and its children are
looked at in turn (a compiled graph's call holds the fused code inductor generated, and the products it calls out to).

    python -m mtp.commands.profile_step CKPT [--threads 2] [--max-new-tokens 64] [--compile] [--quantize int8]
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from torch import nn
from torch.profiler import ProfilerActivity, profile

from mtp.benchmarks.bandwidth import streamed_bytes
from mtp.benchmarks.threads import described
from mtp.decode import generate
from mtp.decode.plan import Plan

CATEGORIES: tuple[tuple[str, re.Pattern], ...] = (
    (
        "matrix products",
        re.compile(
            r"^(aten::(mm|bmm|baddbmm|addmm|addbmm|mv|matmul|linear|_weight_int8pack_mm|_weight_int4pack_mm\w*)"
            r"|mkl::_mkl_linear)$"
        ),
    ),
    ("attention", re.compile(r"^aten::(scaled_dot_product\w*|_scaled_dot_product\w*|_flash_attention\w*)$")),
    ("norms", re.compile(r"^aten::(rms_norm|_fused_rms_norm|layer_norm|native_layer_norm)$")),
    ("cache writes", re.compile(r"^aten::(index_put_?|_index_put_impl_)$")),
    ("compiled code", re.compile(r"^## Call CompiledFxGraph")),
    ("compiled dispatch", re.compile(r"^(TorchDynamo|Torch-Compiled Region|Pregraph|AOTDispatcher)")),
)
"""Categories of a step's time, each an event name pattern; the first that matches counts an event."""
OTHER, OUTSIDE = "other operations", "outside operations"
"""The rest of PyTorch's operations (rotary, activations, views, copies, sampling's); the time outside any operation."""


@dataclass
class StepProfile:
    """Milliseconds per forward in each category (``ms``), what was decoded, and how fast the products streamed."""

    ms: dict[str, float]
    forwards: int
    tokens: int
    wall_ms: float
    """Milliseconds per forward of the profiled run (the prompt's forward included), profiler overhead included."""
    step_ms: float
    """Milliseconds per decoding forward of an unprofiled run of the same plan (the prompt's excluded)."""
    product_bytes: int
    """Bytes a batch-1 autoregressive step's matrices stream (:func:`mtp.benchmarks.bandwidth.streamed_bytes`)."""
    threads: str
    """The threads and CPUs it ran on (:func:`mtp.benchmarks.threads.described`)."""

    @property
    def product_gb_per_s(self) -> float:
        """The rate the products streamed their matrices at, in the profiled run (0 when none ran)."""
        product_ms = self.ms.get("matrix products", 0.0)
        return self.product_bytes / (product_ms / 1e3) / 1e9 if product_ms else 0.0

    def to_dict(self) -> dict:
        return {"ms_per_forward": self.ms, "forwards": self.forwards, "tokens": self.tokens, "wall_ms": self.wall_ms,
                "step_ms": self.step_ms, "product_bytes": self.product_bytes,
                "product_gb_per_s": self.product_gb_per_s, "threads": self.threads}  # fmt: skip

    def table(self) -> str:
        """The categories as a table: milliseconds per forward and their share of the profiled forward."""
        lines = [f"{'':<22}{'ms/forward':>12}{'share':>8}"]
        for name, ms in self.ms.items():
            lines.append(f"{name:<22}{ms:>12.2f}{ms / self.wall_ms:>8.1%}")
        lines.append(f"{'profiled forward':<22}{self.wall_ms:>12.2f}")
        lines.append(f"{'unprofiled forward':<22}{self.step_ms:>12.2f}")
        if self.product_gb_per_s:
            lines.append(
                f"the products streamed {self.product_bytes / 1e6:.0f} MB of matrices a forward at "
                f"{self.product_gb_per_s:.1f} GB/s"
            )
        return "\n".join(lines)


def precision_of(model: nn.Module, plan: Plan) -> str:
    """The precision the plan's products read the model's matrices in (a key of
    :data:`mtp.benchmarks.bandwidth.PRECISIONS`)."""
    if plan.step.quantize != "none":
        return plan.step.quantize
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def category_of(name: str) -> str | None:
    """The category of an event named ``name`` (:data:`CATEGORIES`), or None."""
    return next((category for category, pattern in CATEGORIES if pattern.match(name)), None)


def split_events(events) -> dict[str, float]:
    """Microseconds per category of the profiler's ``events`` (its ``events()``): each event counted once, in the first
    category its name matches, its children included; an event of no category gives its own time to the enclosing
    category (none: :data:`OTHER`) and its children are split in turn. Roots that are no operation (the profiler's own
    spans of Python) are not counted."""
    totals = {category: 0.0 for category, _ in CATEGORIES} | {OTHER: 0.0}

    def visit(event, enclosing: str) -> None:
        category = category_of(event.name)
        if category is not None and category not in ("compiled code", "compiled dispatch"):
            totals[category] += event.cpu_time_total
            return
        own = category or enclosing
        totals[own] += event.self_cpu_time_total
        for child in event.cpu_children:
            visit(child, own if category else enclosing)

    for event in events:
        if event.cpu_parent is None:
            visit(event, OTHER)
    return totals


def profile_step(model: nn.Module, prompts: list[list[int]], plan: Plan) -> StepProfile:
    """The step of ``plan`` on ``model`` profiled: a warm-up ``generate`` (compiles, picks layouts), an unprofiled one
    (the step's own time), then a profiled one split into :data:`CATEGORIES`, per forward. The products' bytes (and so
    their rate) are counted for an autoregressive plan, whose forward reads each matrix of the path and head 1 once."""
    generate(model, prompts, plan)
    _, stats = generate(model, prompts, plan)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        _, profiled = generate(model, prompts, plan)
        wall_s = time.perf_counter() - start
    totals = split_events(prof.events())
    forwards = profiled.forwards
    ms = {name: us / 1e3 / forwards for name, us in totals.items()}
    ms[OUTSIDE] = max(wall_s * 1e3 / forwards - sum(ms.values()), 0.0)
    return StepProfile(
        ms=ms,
        forwards=forwards,
        tokens=profiled.tokens,
        wall_ms=wall_s * 1e3 / forwards,
        step_ms=stats.ms_per_forward,
        product_bytes=streamed_bytes(model, precision_of(model, plan)) if plan.step_drafts == 0 else 0,
        threads=described(),
    )
