"""Self-distillation data: a model's own continuations of prompts, the training data of draft heads.

Heads added to a pretrained next-token model (Medusa-2, EAGLE, HASS, FastMTP) learn best from what the model itself
generates, because that is what they must predict when it decodes. This module makes that data:

- **Prompts** (:func:`source_prompts`, :func:`file_prompts`): from a document source (``mtp.data.sources``), its
  training split only, so the held-out documents the benchmarks prompt with are never distilled; from each document
  one or more spans of MIN..MAX tokens (random, seeded per document: the first opens the document, later ones open a
  random line), each cut at the end of a line where one falls in range. Or prompts read whole from a .jsonl /.txt
  file. Or HumanEval-style tasks (:func:`task_prompts`, from :mod:`mtp.data.tasks`: documented functions of a source
  tree, the body left out), in an order seeded by ``seed``. Optionally each is wrapped as a user message in the
  model's chat template (:func:`model_chat`); a task as EvalPlus puts a HumanEval problem to a chat model, the
  benchmark's own format (:func:`mtp.data.prompts.instruction_prompt`). The benchmarks' HumanEval prompts are in none
  of the sources; the command refuses a task or a prompt file that holds one (:func:`mtp.data.tasks.benchmark_match`).
- **Order** (:func:`windows`): the prompts are taken in source order in windows of ``shard_prompts``; a window is
  sorted by prompt length, so that the rows of a batch (consecutive prompts of a window) pad little. The order is a
  function of the settings alone, never of budgets or of where an earlier run stopped.
- **Decoding** (:func:`distill`, its settings a :class:`DistillSettings`): mtp's ``generate``, batch after batch;
  row ``i`` of the whole stream samples with seed ``seed + i`` (greedy ignores it). A row stops at the model's end
  token (a completion also ends at the first of the model's other end tokens, e.g. an instruct model's end of turn).
  Or, for teacher forcing, no decoding: each task's own function is its reply (:func:`given_replies`), text the model
  reads once in training, its own next-token distribution labelling every position (EAGLE's fixed corpus).
- **Output** (:class:`DistillFolder`): JSON-lines shards ``distill-00000.jsonl``, one per window, each row
  ``{"text", "prompt", "completion", "prompt_ids", "completion_ids", "finish"}`` (``text`` is what ``data=files``
  trains on), and ``settings.json``: the settings that made the data, the runs and running totals. Every file is
  written whole (temporary file, fsync, rename) or not at all.
- **Resume**: a rerun with the same settings keeps every whole batch already in the shards (checked against the
  prompts it regenerates) and decodes from there with the same batches, so an interrupted run and its continuation
  write exactly what one uninterrupted run writes. Different settings in the same folder are refused in one sentence.

A mistake in a setting is a :class:`~mtp.errors.SettingError` naming the setting (``batch_size``,
``force``, ``prompts``); scripts/distill.py spells it as its flag (:func:`mtp.commands.cli.settings_named_by_flags`).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from mtp.data.prompts import instruction_prompt
from mtp.data.sources import SourceConfig, iter_texts, load_documents, split_documents
from mtp.data.tasks import Task
from mtp.data.tokenizer import prompt_ids
from mtp.decode import GenerationConfig, Plan, generate
from mtp.decode.plan import positions_needed
from mtp.errors import SettingError, UserError, literal
from mtp.interop.chat import ChatTemplate
from mtp.model import MTPModel
from mtp.pretrained.distill_folder import SHARD_NAME, DistillFolder, Totals

CHARS_PER_TOKEN = 8
"""Characters tokenized ahead per wanted token (code averages 3-4; a shortfall doubles the span and tries again)."""
BATCHES_PER_SHARD = 4
"""The default shard, in batches: a window of prompts sorted by length fills this many batches."""


@dataclass(frozen=True)
class Prompt:
    text: str
    """The prompt as it enters the data (the chat template applied, if one is)."""
    ids: list[int]
    """The token ids the model reads: as documents start in training (mtp.data.tokenizer.prompt_ids), or the
    rendered chat template's own."""
    origin: str
    """Where it comes from, for messages: ``document 12`` or ``prompts.jsonl line 3``."""
    reply: list[int] | None = None
    """The reply's token ids when it is given rather than generated (:func:`given_replies`), its end token last when
    it ends."""


# ----------------------------------------------------------------------------------------------------------- prompts


def opening_span(text: str, tokenizer: Tokenizer, length: int, min_tokens: int) -> str | None:
    """The opening of ``text`` up to the end of its last non-blank line within ``length`` tokens that keeps
    ``min_tokens``; without one, its first ``length`` tokens, trailing whitespace dropped. None when ``text`` has no
    more than ``min_tokens`` tokens (a prompt must leave something to continue) or no opening keeps ``min_tokens``
    (counted as the opening alone tokenizes).

    The cut falls before the newline, not after it: byte-level BPE merges a newline with the indentation after it
    (``"\\n    "`` is one token), so a prompt ending in ``"\\n"`` would end in a token the model rarely sees there.
    """
    chars = CHARS_PER_TOKEN * (length + 1) + 64
    while True:
        piece = text[:chars]
        encoding = tokenizer.encode(piece, add_special_tokens=False)
        if len(encoding.ids) > length or chars >= len(text):
            break
        chars *= 2
    if len(encoding.ids) <= min_tokens:
        return None
    length = min(length, len(encoding.ids) - 1)
    ends = [end for _, end in encoding.offsets]
    line_ends = [match.start() for match in re.finditer(r"(?<=\S)\n", piece[: ends[length - 1] + 1])]
    # the tokens that end by a line's end are that opening's, as the whole piece tokenizes
    kept = [end for end in line_ends if bisect.bisect_right(ends, end) >= min_tokens][-1:]
    for span in [piece[:end] for end in kept] + [piece[: ends[length - 1]].rstrip()]:
        if len(tokenizer.encode(span, add_special_tokens=False).ids) >= min_tokens:  # alone it may tokenize shorter
            return span
    return None


def document_prompts(
    text: str, tokenizer: Tokenizer, rng: random.Random, min_tokens: int, max_tokens: int, count: int
) -> list[str]:
    """Up to ``count`` prompt texts of ``min_tokens..max_tokens`` tokens from one document: its opening, then spans
    opening at random (distinct) lines that start without indentation, in document order; lengths drawn from
    ``rng``."""
    starts = [0]
    if count > 1:
        lines = [match.end() for match in re.finditer(r"\n(?=\S)", text)]
        starts += sorted(rng.sample(lines, min(count - 1, len(lines))))
    spans = []
    for start in starts:
        span = opening_span(text[start:], tokenizer, rng.randint(min_tokens, max_tokens), min_tokens)
        if span is not None:
            spans.append(span)
    return spans


def source_prompts(
    source: SourceConfig,
    val_fraction: float,
    tokenizer: Tokenizer,
    prompt_tokens: tuple[int, int],
    per_document: int,
    seed: int,
) -> Iterator[tuple[str, str]]:
    """(prompt text, origin) from the training split of ``source`` (``split_documents(..., val_fraction)``), in
    document order; document ``i``'s spans are drawn from a generator seeded with ``(seed, i)`` alone, so the
    prompts never depend on how many are taken."""
    train = split_documents(load_documents(source), val_fraction)["train"]
    index = 0
    for texts in iter_texts(train):
        for text in texts:
            rng = random.Random(f"{seed}:{index}")  # a str seed hashes with sha512: the same in every process
            for span in document_prompts(text, tokenizer, rng, *prompt_tokens, per_document):
                yield span, f"document {index}"
            index += 1


def file_prompts(path: Path, field_name: str) -> Iterator[tuple[str, str]]:
    """(prompt text, origin) from a file: .jsonl, one JSON object per line, the prompt under ``field_name``; .txt,
    one prompt per block of lines between blank lines (a prompt with blank lines in it needs .jsonl)."""
    if not path.is_file():
        raise SettingError(
            f"prompt file {literal(path)} does not exist; pass an existing .jsonl or .txt file to {{prompts:name}}.",
            prompts=path,
        )
    if path.suffix == ".txt":
        block: list[str] = []
        start = 1
        with path.open(encoding="utf-8", errors="replace") as lines:
            for number, line in enumerate(lines, 1):
                if line.strip():
                    start = number if not block else start
                    block.append(line)
                elif block:
                    yield "".join(block).rstrip("\n"), f"{path.name} line {start}"
                    block = []
        if block:
            yield "".join(block).rstrip("\n"), f"{path.name} line {start}"
        return
    if path.suffix != ".jsonl":
        suffix = literal(path.suffix or "a file without suffix")
        raise SettingError(f"{{prompts}}: cannot read {suffix}; use .jsonl or .txt.", prompts=path)
    with path.open(encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise UserError(
                    f"{path} line {number} is not JSON ({err.msg}); write one JSON object per line."
                ) from None
            if not isinstance(row, dict) or field_name not in row:
                fields = ", ".join(row) if isinstance(row, dict) else "none"
                raise SettingError(
                    f"{literal(path)} line {number} has no field {literal(repr(field_name))} (fields: "
                    f"{literal(fields)}); name the prompt's field with {{prompt_field:name}}.",
                    prompt_field=field_name,
                )
            if not isinstance(row[field_name], str) or not row[field_name]:
                raise UserError(f"{path} line {number}: {field_name!r} is not a non-empty string; fix that line.")
            yield row[field_name], f"{path.name} line {number}"


def task_prompts(tasks: Iterable[Task], seed: int) -> Iterator[tuple[str, str]]:
    """(prompt text, origin) of each task, in an order drawn by ``seed`` from the tasks alone (a hash of the seed and
    the prompt's text): a budget then takes tasks from the whole tree, not from its first modules in file order."""
    for task in sorted(tasks, key=lambda task: hashlib.sha256(f"{seed}:{task.prompt}".encode()).digest()):
        yield task.prompt, task.origin


def encode_prompts(
    texts: Iterable[tuple[str, str]], tokenizer: Tokenizer, chat: ChatTemplate | None = None, tasks: bool = False
) -> Iterator[Prompt]:
    """Each (text, origin) as a :class:`Prompt`: as documents start in training, or rendered in the chat template
    (its own special tokens only: a template writes the start token it wants). With ``tasks`` each text is a code
    problem, put in the chat template as the benchmark puts HumanEval's (EvalPlus's instruction and reply opening,
    :func:`mtp.data.prompts.instruction_prompt`); without a template it is the text to complete either way."""
    for text, origin in texts:
        if chat is None:
            yield Prompt(text, prompt_ids(tokenizer, text), origin)
        else:
            rendered = instruction_prompt(text, chat.render) if tasks else chat.render(text)
            yield Prompt(rendered, tokenizer.encode(rendered, add_special_tokens=False).ids, origin)


REPLY_END = "```"
"""What closes a given reply: the code block the benchmark's reply opening started (its end of turn follows)."""


def given_replies(
    prompts: Iterable[Prompt], replies: dict[str, str], tokenizer: Tokenizer, new_tokens: int, end_id: int
) -> Iterator[Prompt]:
    """Each prompt with its reply given instead of generated: ``replies[prompt.origin]`` (a task's own function)
    closed by :data:`REPLY_END`, tokenized as a continuation of the prompt, cut at ``new_tokens`` or else followed by
    ``end_id`` (it ends there, as a reply ends at the model's end of turn)."""
    for prompt in prompts:
        ids = tokenizer.encode(replies[prompt.origin] + REPLY_END, add_special_tokens=False).ids
        yield replace(prompt, reply=ids[:new_tokens] if len(ids) > new_tokens else [*ids, end_id])


def windows(prompts: Iterable[Prompt], size: int) -> Iterator[list[Prompt]]:
    """Consecutive groups of ``size`` prompts (the last may be shorter), each sorted by length (stably), so that a
    batch of consecutive prompts pads little."""
    window: list[Prompt] = []
    for prompt in prompts:
        window.append(prompt)
        if len(window) == size:
            yield sorted(window, key=lambda p: len(p.ids))
            window = []
    if window:
        yield sorted(window, key=lambda p: len(p.ids))


# ---------------------------------------------------------------------------------------------------------- decoding


@dataclass
class DistillSettings:
    """How :func:`distill` decodes its prompts into a folder, checked on construction (a :class:`SettingError` names
    the setting). The budgets count everything in the folder, earlier runs' included; a run ends after a whole
    batch."""

    generation: GenerationConfig = field(default_factory=GenerationConfig)
    """The decoding (sampling, ``max_new_tokens``, ``eos_id``); its seed is the stream's: row ``i`` of the whole
    stream samples with ``seed + i``."""
    batch_size: int = 32
    """Prompts decoded at once."""
    shard_prompts: int | None = None
    """Prompts per shard: a window of this many, sorted by length, whose batches are decoded in turn (None:
    :data:`BATCHES_PER_SHARD` batches)."""
    end_ids: set[int] = field(default_factory=set)
    """A completion ends at the first of these tokens (the model's end token, an instruct model's end of turn)."""
    end_text: str = ""
    """What closes the text of a completion that ended at one of ``end_ids`` (the end of a chat turn)."""
    max_prompts: int = 0
    """Stop at this many prompts in the folder (0: no limit)."""
    max_tokens: int = 0
    """Stop once the folder holds this many generated tokens, after the batch that reaches it (0: no limit)."""
    deadline: float | None = None
    """``time.monotonic()`` after which no batch starts, nor one that the last batch's duration says would end past
    it (None: no limit)."""

    def __post_init__(self) -> None:
        if self.shard_prompts is None:
            self.shard_prompts = BATCHES_PER_SHARD * self.batch_size
        for name in ("batch_size", "shard_prompts"):
            if getattr(self, name) < 1:
                raise SettingError(f"{{{name}}} must be at least 1.", **{name: getattr(self, name)})
        for name in ("max_prompts", "max_tokens"):
            if getattr(self, name) < 0:
                raise SettingError(f"{{{name}}} must be at least 0 (0: no limit).", **{name: getattr(self, name)})


@dataclass
class Progress:
    """What a run did so far (this run's figures; ``totals``: the folder's)."""

    prompts: int = 0
    tokens: int = 0
    seconds: float = 0.0
    totals: Totals = field(default_factory=Totals)
    stopped: str = ""
    """Why the run ended: ``all-prompts`` (the source is exhausted), the budget setting that ended it
    (``max_prompts``, ``max_tokens``, ``deadline``) or ``interrupted``."""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def completion_row(
    prompt: Prompt,
    output: list[int],
    tokenizer: Tokenizer,
    config: GenerationConfig,
    end_ids: set[int],
    end_text: str = "",
) -> dict[str, Any]:
    """One row of the data: ``output`` cut at the first of ``end_ids``; ``finish`` is ``end`` when the completion
    ended there (``end_text``, the end of a chat turn, then closes ``text``), ``length`` at the token budget."""
    cut = next((i for i, token in enumerate(output) if token in end_ids), None)
    ended = cut is not None or len(output) < config.max_new_tokens
    ids = output if cut is None else output[:cut]
    completion = tokenizer.decode(ids, skip_special_tokens=False)
    text = prompt.text + completion + (end_text if ended else "")
    return {
        "text": text,
        "prompt": prompt.text,
        "completion": completion,
        "prompt_ids": prompt.ids,
        "completion_ids": ids,
        "finish": "end" if ended else "length",
    }


def fits(prompt_tokens: int, new_tokens: int, context: int) -> bool:
    """Whether a prompt of ``prompt_tokens`` leaves ``new_tokens`` of room in a model's ``context``: the positions
    autoregressive decoding needs (:func:`~mtp.decode.plan.positions_needed`, no drafts), what :func:`generate`
    checks."""
    return positions_needed(prompt_tokens, new_tokens, 0) <= context


def whole_batches(rows: int, window: int, batch_size: int) -> int:
    """The rows of a window's first ``rows`` that make whole batches (batch ``j`` holds window positions
    ``j * batch_size`` up to the next multiple or the window's end)."""
    return window if rows >= window else rows - rows % batch_size


def distill(
    model: MTPModel,
    tokenizer: Tokenizer,
    prompts: Iterable[Prompt],
    folder: DistillFolder,
    settings: DistillSettings,
    on_batch: Callable[[Progress], None] | None = None,
) -> Progress:
    """Decode ``prompts`` into ``folder`` as ``settings`` say (in :func:`windows` of ``shard_prompts``, batches of
    ``batch_size``, until a budget is spent): one shard per window, written when the window is done or the run
    stops; ``on_batch`` sees the progress after each batch.

    Rows already there are kept (whole batches only, each checked against the prompt it must hold) and their prompts
    skipped, so the batches, and with them the rows, are those of one uninterrupted run. Returns this run's figures
    and the folder's totals. Ctrl-C ends the run after writing the whole batches of the window in progress.
    """
    config, batch_size = settings.generation, settings.batch_size
    context = model.config.max_seq_len
    progress = Progress()
    totals = progress.totals
    this_run = folder.record["runs"][-1]
    earlier_seconds = sum(run.get("seconds", 0.0) for run in folder.record["runs"][:-1])
    start, last_batch_s = time.monotonic(), 0.0

    def save(index: int, rows: list[dict[str, Any]]) -> None:
        progress.seconds = time.monotonic() - start
        this_run.update(prompts=progress.prompts, tokens=progress.tokens, seconds=round(progress.seconds, 3))
        totals.seconds = earlier_seconds + progress.seconds
        folder.write(index, rows, totals)

    first = 0  # the stream index of the window's first prompt
    in_progress: tuple[int, list[dict[str, Any]], int] | None = None  # window index, its rows, rows read back
    try:
        for index, window in enumerate(windows(prompts, settings.shard_prompts)):
            rows = folder.rows(index)
            for prompt, row in zip(window, rows, strict=False):
                if row.get("prompt_ids") != prompt.ids:
                    raise SettingError(
                        f"{literal(folder.out / SHARD_NAME.format(index))} holds other prompts than these settings "
                        f"give ({literal(prompt.origin)} differs: the documents changed since); pass {{force:name}} "
                        "to start over there or choose another {out:name}.",
                        force=folder.force,
                        out=folder.out,
                    )
            if not (settings.max_prompts and totals.prompts + len(rows) == settings.max_prompts):
                # a batch cut by an earlier run's budget is decoded again, whole (this run's budget cuts it the same)
                rows = rows[: whole_batches(len(rows), len(window), batch_size)]
            kept = len(rows)
            in_progress = (index, rows, kept)
            totals.prompts += kept
            totals.tokens += sum(len(row["completion_ids"]) for row in rows)
            position = kept
            while position < len(window):
                if settings.max_prompts and totals.prompts >= settings.max_prompts:
                    progress.stopped = "max_prompts"
                elif settings.max_tokens and totals.tokens >= settings.max_tokens:
                    progress.stopped = "max_tokens"
                elif settings.deadline is not None and time.monotonic() + last_batch_s > settings.deadline:
                    progress.stopped = "deadline"
                if progress.stopped:
                    break
                end = min(position - position % batch_size + batch_size, len(window))
                if settings.max_prompts:
                    end = min(end, position + settings.max_prompts - totals.prompts)
                batch = window[position:end]
                for prompt in batch:
                    if not fits(len(prompt.ids), config.max_new_tokens, context):
                        raise SettingError(
                            f"{literal(prompt.origin)}: the prompt ({len(prompt.ids)} tokens) plus {{max_new_tokens}} "
                            f"does not fit the model's context of {context} tokens; lower {{max_new_tokens:name}}, or "
                            "{prompt_tokens:name} / shorten that prompt.",
                            max_new_tokens=config.max_new_tokens,
                            prompt_tokens=None,
                        )
                batch_start = time.monotonic()
                seeded = replace(config, seed=config.seed + first + position)
                if all(prompt.reply is not None for prompt in batch):  # given replies: nothing to decode
                    outputs = [prompt.reply for prompt in batch]
                else:
                    outputs, _ = generate(model, [prompt.ids for prompt in batch], Plan(seeded))
                new = [
                    completion_row(prompt, output, tokenizer, config, settings.end_ids, settings.end_text)
                    for prompt, output in zip(batch, outputs, strict=True)
                ]
                rows.extend(new)
                last_batch_s = time.monotonic() - batch_start
                added = sum(len(row["completion_ids"]) for row in new)
                totals.prompts, totals.tokens = totals.prompts + len(new), totals.tokens + added
                progress.prompts, progress.tokens = progress.prompts + len(new), progress.tokens + added
                progress.seconds = time.monotonic() - start
                position = end
                if on_batch is not None:
                    on_batch(progress)
            if len(rows) > kept:
                save(index, rows)
            in_progress = None
            if progress.stopped:
                break
            first += len(window)
        else:
            totals.finished = True
            progress.stopped = "all-prompts"
    except KeyboardInterrupt:
        progress.stopped = "interrupted"
        if in_progress is not None and len(in_progress[1]) > in_progress[2]:
            save(*in_progress[:2])
    progress.seconds = time.monotonic() - start
    this_run.update(
        prompts=progress.prompts, tokens=progress.tokens, seconds=round(progress.seconds, 3), stopped=progress.stopped
    )
    totals.seconds = earlier_seconds + progress.seconds
    if progress.prompts or folder.record["totals"].get("finished") != totals.finished:
        folder.write_totals(totals)  # a run that decoded nothing leaves a finished folder's file as it was
    return progress
