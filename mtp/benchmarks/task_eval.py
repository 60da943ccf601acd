"""Scoring a checkpoint on what it was trained on (``mtp eval-task``): the synthetic task of its data (Gloeckle et al.
2024, section 4), or, for a model of a text corpus, its held-out next-token loss and how far its heads draft.

The evaluation is chosen by the checkpoint's recorded data source kind: a task of
:data:`mtp.training.task_scores.TASKS` (polynomial, induction: scored as a training run's curve scores them), or
:func:`evaluate_corpus` for every other source (stdlib, files, hub). Each returns results holding ``metric``,
``group``, ``rows`` and ``decoding`` (the decoder's totals, or None).

- ``corpus``: head 1's mean cross-entropy over the validation split of the checkpoint's own data (the documents
  training held out, each followed by end-of-text, read in windows of the training's ``seq_len``), in nats per token
  and in bits per byte of text; then greedy self-speculative decoding of held-out prompts with every head: tokens per
  forward, the acceptance of each draft position, and whether the tokens equal autoregressive decoding's. Bits per
  byte divide the summed loss (in bits) by the bytes the scored tokens stand for: the split's bytes per token (a
  document's UTF-8 bytes and one for its end-of-text) times the tokens scored; for the byte tokenizer, exactly one
  byte a token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from mtp.checkpoint.load import LoadedCheckpoint
from mtp.data.prompts import held_out_prompts
from mtp.data.sources import SourceConfig, iter_texts, load_documents, split_documents
from mtp.data.tokenizer import eot_id
from mtp.decode import GenerationConfig, HeadsSettings, Plan, generate
from mtp.errors import UserError
from mtp.model import MTPModel
from mtp.training.task_scores import TASKS, TaskSettings

CORPUS = "corpus"
"""The evaluation of a checkpoint trained on a text corpus (any data source kind that is not a task)."""
DEFAULT_SEQ_LEN = 256
"""The window of a checkpoint that does not record its training's ``seq_len``."""


@dataclass
class CorpusSettings:
    """How a corpus model is scored (the evaluation command's flags)."""

    windows: int | None = None
    """Validation windows whose loss is measured, the first of the split (None: all of it)."""
    prompts: int = 16
    """Held-out prompts decoded."""
    prompt_tokens: int = 64
    """Tokens of each prompt (the opening of a validation document)."""
    new_tokens: int = 128
    """Tokens decoded after each prompt."""
    heads: int | None = None
    """Heads that decode (k > 1: heads 2..k draft); None: all the model's."""
    batch_size: int = 16
    """Windows scored, and prompts decoded, together."""


def evaluation_of(loaded: LoadedCheckpoint) -> str:
    """What ``loaded`` is scored by: its task (the data source kind it trained on), or :data:`CORPUS`. A checkpoint
    that records no training data (another format's model, an old mtp checkpoint) is refused in one sentence."""
    kind = loaded.data.get("source", {}).get("kind")
    if kind is None:
        raise UserError(
            "this checkpoint does not record the data it was trained on, so there is nothing held out to score it on; "
            "pass a checkpoint written by scripts/pretrain.py."
        )
    return kind if kind in TASKS else CORPUS


def validation_tokens(data: dict[str, Any], tokenizer: Tokenizer) -> tuple[list[int], int]:
    """The validation split of the data a checkpoint records, as training packed it (every document encoded, then
    end-of-text), and its size in bytes (each document's UTF-8 bytes, plus one for each end-of-text)."""
    source = SourceConfig(**data["source"])
    validation = split_documents(load_documents(source), data["val_fraction"])["validation"]
    eot = eot_id(tokenizer)
    ids: list[int] = []
    n_bytes = 0
    for texts in iter_texts(validation, batch_size=512):
        for text, encoding in zip(texts, tokenizer.encode_batch(texts), strict=True):
            ids += encoding.ids + [eot]
            n_bytes += len(text.encode("utf-8")) + 1
    if len(ids) < 2:
        raise UserError(f"the validation split of data.source.kind={source.kind} holds no text to score.")
    return ids, n_bytes


def held_out_loss(
    model: MTPModel, ids: list[int], seq_len: int, windows: int | None = None, batch_size: int = 16
) -> tuple[float, int]:
    """(head 1's summed cross-entropy in nats, tokens scored) over ``ids`` read in windows of ``seq_len`` inputs, one
    after another (each token but the first is scored once, from the tokens before it in its window: training's
    validation windows); the first ``windows`` of them (None: all)."""
    device = next(model.parameters()).device
    starts = list(range(0, len(ids) - 1, seq_len))[:windows]
    total, count = 0.0, 0
    for first in range(0, len(starts), batch_size):
        chunk = [ids[s : s + seq_len + 1] for s in starts[first : first + batch_size]]
        length = max(map(len, chunk))
        window = torch.tensor([c + [0] * (length - len(c)) for c in chunk], device=device)  # (B, T + 1)
        target = window[:, 1:].clone()
        for row, c in enumerate(chunk):
            target[row, len(c) - 1 :] = -100  # the padding of a short last window is not scored
        with torch.no_grad():
            logits = model.next_token_logits(window[:, :-1]).float()  # (B, T, V)
            total += F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="sum").item()
        count += int((target != -100).sum())
    return total, count


def evaluate_corpus(loaded: LoadedCheckpoint, settings: CorpusSettings) -> dict[str, Any]:
    model, tokenizer, data = loaded.model, loaded.tokenizer, loaded.data
    n = loaded.config.n_future
    heads = n if settings.heads is None else settings.heads
    if heads > n:
        raise UserError(f"--heads {heads} is more than the {n} heads the model has; use at most {n}.")
    ids, n_bytes = validation_tokens(data, tokenizer)
    seq_len = data.get("seq_len", DEFAULT_SEQ_LEN)
    nats, scored = held_out_loss(model, ids, seq_len, settings.windows, settings.batch_size)
    scored_bytes = n_bytes * scored / len(ids)  # the split's bytes per token, times the tokens scored
    rows = [{"head": 1, "loss": nats / scored, "tokens": scored, "bits_per_byte": nats / math.log(2) / scored_bytes,
             "seq_len": seq_len}]  # fmt: skip
    prompts = held_out_prompts(data, tokenizer, settings.prompts, settings.prompt_tokens)
    config = GenerationConfig(max_new_tokens=settings.new_tokens)
    outputs, stats, match = [], None, True
    for first in range(0, len(prompts), settings.batch_size):
        batch = prompts[first : first + settings.batch_size]
        drafted, batch_stats = generate(model, batch, Plan(config, HeadsSettings(heads=heads)))
        plain, _ = generate(model, batch, Plan(config)) if heads > 1 else (drafted, None)
        match &= drafted == plain
        outputs += drafted
        stats = batch_stats if stats is None else stats + batch_stats
    decoding = {"heads": heads, "prompts": len(prompts), "prompt_tokens": settings.prompt_tokens,
                "tokens": stats.tokens, "row_forwards": stats.row_forwards,
                "tokens_per_forward": stats.tokens / stats.row_forwards, "acceptance": list(stats.acceptance),
                "outputs_match": match}  # fmt: skip
    return {"metric": "held-out loss", "group": "head", "rows": rows, "decoding": decoding}


def evaluate(loaded: LoadedCheckpoint, task: TaskSettings, corpus: CorpusSettings) -> dict[str, Any]:
    """The evaluation of ``loaded`` (:func:`evaluation_of`), with its task's settings or the corpus's."""
    kind = evaluation_of(loaded)
    if kind == CORPUS:
        return {"task": CORPUS, **evaluate_corpus(loaded, corpus)}
    return {"task": kind, **TASKS[kind](loaded.model, loaded.tokenizer, loaded.data, task)}


def operator_table(rows: list[dict[str, Any]], group: str) -> str:
    """The exact match of each row by its problems' outermost operation (right / problems)."""
    operators = list(rows[0]["operators"])
    names = {"neg": "negation", "+": "addition", "*": "multiplication", "o": "composition"}
    lines = [
        f"| {group} | " + " | ".join(names.get(op, op) for op in operators) + " |",
        "|---:|" + "---:|" * len(operators),
    ]
    for row in rows:
        cells = []
        for op in operators:
            counts = row["operators"][op]
            share = counts["correct"] / counts["problems"] if counts["problems"] else 0.0
            cells.append(f"{share:.1%} ({counts['correct']}/{counts['problems']})")
        lines.append(f"| {row[group]} | " + " | ".join(cells) + " |")
    return "By outermost operation:\n\n" + "\n".join(lines)


def corpus_table(results: dict[str, Any]) -> str:
    """results.md of a corpus model: head 1's held-out loss, then its decoding."""
    row, decoding = results["rows"][0], results["decoding"]
    lines = [
        "| head | tokens scored | loss (nats/token) | bits per byte |",
        "|---:|---:|---:|---:|",
        f"| {row['head']} | {row['tokens']} | {row['loss']:.4f} | {row['bits_per_byte']:.4f} |",
        "",
        f"Greedy decoding of {decoding['prompts']} held-out prompts of {decoding['prompt_tokens']} tokens with "
        f"{decoding['heads']} head(s): {decoding['tokens_per_forward']:.2f} tokens per forward"
        + (f", acceptance by position {', '.join(f'{a:.3f}' for a in decoding['acceptance'])}" if decoding["acceptance"]
           else "")
        + f"; the tokens {'equal' if decoding['outputs_match'] else 'DIFFER FROM'} autoregressive decoding's.",
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def results_table(results: dict[str, Any]) -> str:
    """results.md: one row per group, accuracy with its interval (a corpus model: its loss and decoding)."""
    if results.get("task") == CORPUS:
        return corpus_table(results)
    group = results["group"]
    lines = [
        f"| {group} | domain | problems | correct | {results['metric']} | 95% interval |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for row in results["rows"]:
        low, high = row["ci95"]
        domain = "in" if row.get("in_domain") else "out"
        lines.append(
            f"| {row[group]} | {domain} | {row['problems']} | {row['correct']} | {row['accuracy']:.1%} | "
            f"{low:.1%}-{high:.1%} |"
        )
    if any("operators" in row for row in results["rows"]):
        lines += ["", operator_table(results["rows"], group)]
    decoding = results["decoding"]
    if decoding is not None:  # a teacher-forced score decodes nothing
        lines.append(
            f"\nGreedy decoding with {decoding['heads']} head(s): {decoding['tokens_per_forward']:.2f} tokens per "
            "forward."
        )
    return "\n".join(lines) + "\n"
