"""Where the distillation command's prompts come from (:mod:`mtp.commands.distill`), checked before the model loads:
a document source (the training split of --source, as data= describes it), HumanEval-style tasks of Python source
(--source tasks: --paths, --packages), or a prompt file (--prompts); and the held-out split a model's training kept,
which no distillation may read. Each error is one sentence naming the flags."""

from __future__ import annotations

import glob
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mtp.commands.distill_run import TASKS, DistillRun
from mtp.data.sources import SourceConfig, source_files, stdlib_root
from mtp.data.tasks import Extraction, benchmark_match, extract_tasks, package_roots
from mtp.errors import UserError
from mtp.pretrained.distill import Prompt, file_prompts, fits

SOURCE_FLAGS = {
    "data.source.kind": "--source",
    "data.source.paths": "--paths",
    "data.source.name": "--name",
    "data.source.subset": "--subset",
    "data.source.split": "--split",
    "data.source.text_field": "--text-field",
}
"""The flag of each source setting: mtp.data.sources names them as data= does."""


def prompt_span(text: str) -> tuple[int, int]:
    """--prompt-tokens MIN,MAX (or one number for both)."""
    try:
        low, high = (int(part) for part in (text.split(",") if "," in text else [text, text]))
    except ValueError:
        raise UserError(f"--prompt-tokens {text} is not MIN,MAX; pass two token counts, e.g. 32,192.") from None
    if not 1 <= low <= high:
        raise UserError(f"--prompt-tokens {text} needs 1 <= MIN <= MAX; pass e.g. 32,192.")
    return low, high


def source_config(args: DistillRun) -> SourceConfig | None:
    """The document source of the flags (checked: a files source's globs must match files), or None with --prompts or
    --source tasks."""
    if args.prompts is not None or args.source == TASKS:
        return None
    config = SourceConfig(
        kind=args.source or "stdlib",
        paths=list(args.paths),
        name=args.name or "",  # --name's None: no dataset name
        subset=args.subset,
        split=args.split,
        text_field=args.text_field,
        streaming=args.streaming,
    )
    source_files(config)  # files: no match, or only empty files, is one sentence now, not after loading the model
    return config


def task_roots(args: DistillRun) -> list[Path]:
    """The folders and files --source tasks reads: --paths (each an existing folder or .py file, or a glob), then the
    source of each of --packages; the standard library when neither is given."""
    roots: list[Path] = []
    for pattern in args.paths:
        path = Path(pattern).expanduser()
        found = [path] if path.exists() else sorted(Path(p) for p in glob.glob(str(path), recursive=True))
        found = [p for p in found if p.is_dir() or (p.is_file() and p.suffix == ".py")]
        if not found:
            raise UserError(f"--paths {pattern} matches no folder or .py file; check the path or glob pattern.")
        roots += found
    for name in args.packages:
        if not name.isidentifier():
            raise UserError(
                f"--packages {name}: name an installed top-level package (its subpackages come with it), or pass the "
                "folder you want to --paths."
            )
        found = package_roots(name)
        if not found:
            raise UserError(
                f"--packages {name}: no installed package or module of that name has Python source; install it, or "
                "pass its source folder to --paths."
            )
        roots += found
    return roots or [stdlib_root()]


def task_extraction(args: DistillRun) -> Extraction:
    """The tasks of --source tasks, checked: at least one, and none that holds a HumanEval problem. The standard
    library's are dropped and counted (a user cannot edit it; it has none at present); a source the user names is
    refused in one sentence naming the function."""
    roots = task_roots(args)
    extraction = extract_tasks(roots, args.val_fraction)
    named = bool(args.paths or args.packages)
    where = ", ".join([*args.paths, *(f"package {name}" for name in args.packages)])
    where = where or f"the standard library ({roots[0]})"
    if named and extraction.benchmark:
        task, problem = extraction.benchmark[0]
        raise UserError(
            f"{task.path} line {task.line}: function {task.name} is {problem}, a benchmark problem that must not be "
            "among the distillation prompts; remove it from that file, or narrow --paths/--packages to leave the file "
            "out."
        )
    if not extraction.tasks:
        raise UserError(
            f"no function with a docstring under {where} makes a task ({extraction.describe()}); point --paths at "
            "Python source whose top-level functions have docstrings and bodies."
        )
    print(f"tasks from {where}: {extraction.describe()} ({extraction.seconds:.1f} s)")
    return extraction


def fitting_tasks(prompts: Iterable[Prompt], context: int, new_tokens: int) -> list[Prompt]:
    """The tasks that leave --new-tokens of room in the model's context; the others are left out with a note (a task
    cannot be shortened as a prompt of one's own file can, and a long docstring should not end the run)."""
    kept, left_out = [], 0
    for prompt in prompts:
        if fits(len(prompt.ids), new_tokens, context):
            kept.append(prompt)
        else:
            left_out += 1
    if left_out:
        print(
            f"note: {left_out} tasks left out, too long for the model's context of {context} tokens with --new-tokens "
            f"{new_tokens}"
        )
    return kept


def check_prompt_file(path: Path, field_name: str) -> None:
    """A prompt file holds no HumanEval problem (read once before the model loads: its other faults show early too)."""
    for text, origin in file_prompts(path, field_name):
        problem = benchmark_match(text)
        if problem is not None:
            raise UserError(
                f"{origin} holds {problem}, a benchmark problem that must not be among the distillation prompts; "
                f"remove that prompt from {path}."
            )


def flags_for_sources(message: str) -> str:
    """A sentence of mtp.data.sources (written for data=) with the flags of this command instead."""
    for setting, flag in SOURCE_FLAGS.items():
        message = message.replace(f"{setting}=", f"{flag} ").replace(setting, flag)
    return message


def check_held_out(args: DistillRun, source: SourceConfig | None, trained_on: dict[str, Any]) -> None:
    """Refuse to distill documents the model held out: its training recorded (mtp checkpoints do) the source and
    validation fraction the benchmarks take their prompts from; a smaller --val-fraction on that source would
    distill some of them (the split keeps a document out when a hash of it falls under the fraction)."""
    if source is None or not trained_on:
        return
    same_source = all(
        trained_on["source"].get(key) == value
        for key, value in asdict(source).items()
        if key in ("kind", "paths", "name", "subset", "split", "text_field")
    )
    if same_source and args.val_fraction < trained_on["val_fraction"]:
        raise UserError(
            f"--val-fraction {args.val_fraction} is below the {trained_on['val_fraction']} the model held out of this "
            f"source, so the benchmarks' held-out prompts would be distilled; pass --val-fraction "
            f"{trained_on['val_fraction']}."
        )
