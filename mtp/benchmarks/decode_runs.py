"""Pieces of the decoding benchmarks: timed runs over prompts (held-out ones come from
:func:`mtp.data.prompts.held_out_prompts`), and how a method's outputs compare with autoregressive decoding's."""

from __future__ import annotations

from dataclasses import asdict

from mtp.decode import DecodeStats
from mtp.decode.loop import generate
from mtp.decode.plan import Plan


def run(model, prompts: list[list[int]], plan: Plan, batch_size: int) -> DecodeStats:
    """:func:`decode_prompts`'s statistics alone."""
    return decode_prompts(model, prompts, plan, batch_size)[1]


def decode_prompts(model, prompts: list[list[int]], plan: Plan, batch_size: int) -> tuple[list[list[int]], DecodeStats]:
    """Decode all prompts with ``plan`` in batches of ``batch_size``: every prompt's new tokens, in the prompts'
    order, and the statistics summed over the batches."""
    outputs, runs = [], []
    for start in range(0, len(prompts), batch_size):
        batch_outputs, stats = generate(model, prompts[start : start + batch_size], plan)
        outputs += batch_outputs
        runs.append(stats)
    total = sum(runs, DecodeStats.empty(runs[0]))
    return outputs, total


def output_checks(outputs: list[list[int]], reference: list[list[int]], scorer=None) -> dict:
    """How a greedy method's outputs compare with mtp autoregressive decoding's (``reference``): the number of
    prompts whose new tokens are identical and, with a :class:`~mtp.benchmarks.humaneval.HumanEvalScorer`, the
    outputs' HumanEval pass@1 and every problem's outcome."""
    checks: dict = {
        "prompts": len(reference),
        "identical_outputs": sum(a == b for a, b in zip(outputs, reference, strict=True)),
    }
    if scorer is not None:
        evaluation = scorer.evaluate(outputs)
        checks["pass_at_1"] = evaluation.pass_at_1
        checks["humaneval"] = [asdict(o) for o in evaluation.outcomes]
    return checks
