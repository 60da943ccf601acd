"""Pieces of the decoding benchmarks: held-out prompts of a checkpoint's own data, timed runs over them, and how a
method's outputs compare with autoregressive decoding's."""

from __future__ import annotations

from dataclasses import asdict

from mtp.data.sources import SourceConfig, iter_texts, load_documents, split_documents
from mtp.data.tokenizer import eot_id
from mtp.decode import DecodeStats, GenerationConfig, generate
from mtp.errors import UserError


def held_out_prompts(data: dict, tokenizer, count: int, length: int, skip: int = 0) -> list[list[int]]:
    """The first ``length`` tokens of ``count`` validation documents (after end-of-text, as in training), from the
    ``skip``-th document with that many tokens on."""
    if not data:
        data = {"source": {"kind": "stdlib"}, "val_fraction": 0.05}
        print("note: the checkpoint does not record its training data; using the default corpus's validation split")
    validation = split_documents(load_documents(SourceConfig(**data["source"])), data["val_fraction"])["validation"]
    eot = eot_id(tokenizer)
    prompts = []
    for texts in iter_texts(validation):
        for text in texts:
            ids = tokenizer.encode(text, add_special_tokens=False).ids
            if len(ids) >= length:
                if skip:
                    skip -= 1
                    continue
                prompts.append([eot] + ids[:length])
            if len(prompts) == count:
                return prompts
    if not prompts:
        raise UserError(f"no validation document has {length} tokens; lower --prompt-tokens.")
    return prompts


def run(model, prompts: list[list[int]], config: GenerationConfig, batch_size: int, drafter=None) -> DecodeStats:
    """:func:`decode_prompts`'s statistics alone."""
    return decode_prompts(model, prompts, config, batch_size, drafter)[1]


def decode_prompts(
    model, prompts: list[list[int]], config: GenerationConfig, batch_size: int, drafter=None
) -> tuple[list[list[int]], DecodeStats]:
    """Decode all prompts in batches of ``batch_size`` (drafting with ``drafter`` if given): every prompt's new tokens,
    in the prompts' order, and the statistics summed over the batches."""
    outputs, runs = [], []
    for start in range(0, len(prompts), batch_size):
        batch_outputs, stats = generate(model, prompts[start : start + batch_size], config, drafter)
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


FIT_SKIP_DOCUMENTS = 64
"""Validation documents left to the benchmarks' prompts: trees are fitted on the ones after them."""


def prompts_beyond_the_benchmarks(loaded, count: int, length: int) -> list[list[int]]:
    """Held-out prompts for fitting decoding settings (a tree, a skip set) that the benchmarks do not prompt with;
    on a corpus too small for that, the benchmarks' own, with a note."""
    try:
        return held_out_prompts(loaded.data, loaded.tokenizer, count, length, skip=FIT_SKIP_DOCUMENTS)
    except UserError:
        print(f"note: fewer than {FIT_SKIP_DOCUMENTS} held-out documents; fitting on the benchmarks' prompts")
        return held_out_prompts(loaded.data, loaded.tokenizer, count, length)


def fitted_tree(loaded, config: GenerationConfig, nodes: int, prompts: int = 16, prompt_tokens: int = 64):
    """A tree of at most ``nodes`` nodes fitted to a loaded checkpoint for decoding with ``config`` (its temperature,
    top-k, top-p, heads), on held-out documents the benchmarks do not prompt with (:mod:`mtp.decode.tree_fit`)."""
    from mtp.decode.tree_fit import fit_to_model

    held_out = prompts_beyond_the_benchmarks(loaded, prompts, prompt_tokens)
    settings = {**config.__dict__, "eos_id": None, "compile": False, "tree": None, "adaptive_drafts": False}
    return fit_to_model(loaded.model, held_out, nodes, GenerationConfig(**settings))
