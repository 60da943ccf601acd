"""Document sources, loaded with Hugging Face ``datasets``: each yields a train and a validation split of texts.

- ``stdlib``: the running Python's standard-library ``.py`` files (the embedded default; no network).
- ``files``: local globs of ``.txt``/``.md``/``.py`` (one document per file), ``.jsonl``/``.json``
  and ``.parquet`` (one document per row, text in ``text_field``).
- ``hub``: a dataset name (or local dataset folder) and its text field, optionally streamed.
- ``polynomial``: arithmetic problems in F7[X]/(X^5) generated from a seed, one per document
  (:mod:`mtp.data.polynomial`: the text format, the evaluation sets kept out of training).
- ``induction``: ``documents`` stories generated from ``seed`` for the induction task (:mod:`mtp.data.induction`).

The split is by document content: a document goes to validation when a hash of its text falls under
``val_fraction``. It is deterministic, independent of file order, and keeps duplicates on one side.
"""

from __future__ import annotations

import glob
import hashlib
import sys
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtp.data.induction import Story, generator_digest, training_stories
from mtp.data.polynomial import GENERATOR_VERSION, check_ops_range, training_problems
from mtp.errors import UserError

if TYPE_CHECKING:  # imported where documents are loaded: it costs about a second of every command's start
    import datasets

SOURCE_KINDS = ("stdlib", "files", "hub", "polynomial", "induction")
TEXT_SUFFIXES = {".txt", ".md", ".py", ".rst"}
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


@dataclass
class SourceConfig:
    kind: str = "stdlib"
    paths: list[str] = field(default_factory=list)
    """files: glob patterns (``**`` allowed)."""
    name: str = ""
    """hub: dataset name on the Hub, or a local dataset folder."""
    subset: str | None = None
    """hub: configuration name, if the dataset has several."""
    split: str = "train"
    """hub: the split to read; validation documents are carved out of it by hash."""
    text_field: str = "text"
    streaming: bool = False
    max_documents: int = 0
    """Read at most this many documents (0: all); needed to bound a streamed dataset."""
    seed: int = 0
    """polynomial, induction: the seed of the generated training problems or stories (the run's own ``seed`` sets the
    model's start and the data order)."""
    problems: int = 100_000
    """polynomial: training problems generated (before the validation split)."""
    min_ops: int = 1
    """polynomial: the fewest operations of a training problem."""
    max_ops: int = 5
    """polynomial: the most operations of a training problem."""
    eval_seed: int = 0
    """polynomial: the seed of the evaluation sets, which training problems never repeat."""
    eval_problems: int = 2000
    """polynomial: problems per operation count (1..10) in each evaluation set."""
    documents: int = 50_000
    """induction: how many stories to generate."""

    def __post_init__(self) -> None:
        if self.kind not in SOURCE_KINDS:
            raise UserError(f"data.source.kind={self.kind!r} is not one of {', '.join(SOURCE_KINDS)}.")
        if self.kind == "files" and not self.paths:
            raise UserError("data.source.kind=files needs data.source.paths=[glob, ...] naming local files.")
        if self.kind == "hub" and not self.name:
            raise UserError("data.source.kind=hub needs data.source.name=<dataset name or folder>.")
        if self.kind == "induction" and self.documents < 1:
            raise UserError(f"data.source.documents={self.documents} must be at least 1 (the stories to generate).")
        if self.max_documents < 0:
            raise UserError(f"data.source.max_documents={self.max_documents} must be 0 (all) or positive.")
        if self.kind == "polynomial":
            check_ops_range(self.min_ops, self.max_ops)
            if self.problems < 1 or self.eval_problems < 1:
                raise UserError(
                    f"data.source.problems={self.problems} and data.source.eval_problems={self.eval_problems} must "
                    "both be at least 1."
                )


def stdlib_root() -> Path:
    """The running Python's standard-library source folder."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files() -> list[Path]:
    """The standard library's .py files, sorted; third-party packages excluded."""
    root = stdlib_root()
    return sorted(
        p for p in root.rglob("*.py") if not {"site-packages", "dist-packages"} & set(p.relative_to(root).parts)
    )


TEST_SUITE_MIN = 100
"""Fewer top-level ``test/test_*.py`` files than this: the standard library came without its test suite (the full
install has over 400)."""


def stdlib_without_tests() -> str | None:
    """A warning when this Python's standard library lacks its test suite (Debian and Ubuntu ship it apart), else None.

    The suite is about two thirds of the default corpus's tokens: without it the default run, in 450 steps, learns
    little beyond token frequencies."""
    root = stdlib_root()
    if len(list((root / "test").glob("test_*.py"))) >= TEST_SUITE_MIN:
        return None
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return (
        f"this Python's standard library ({root}) has no test suite, so the default corpus is about a third of a full "
        f"install's and the default run learns much less from it than README's figures show; install the suite "
        f"(Debian/Ubuntu: apt install libpython{version}-testsuite) or train on more text (data=files)."
    )


def matching_files(patterns: list[str]) -> list[Path]:
    files = sorted(
        {Path(p) for pattern in patterns for p in glob.glob(str(Path(pattern).expanduser()), recursive=True)}
    )
    files = [f for f in files if f.is_file()]
    if not files:
        raise UserError(f"data.source.paths={list(patterns)} matches no file; check the path or glob pattern.")
    unknown = sorted({f.suffix for f in files} - TEXT_SUFFIXES - set(BUILDERS))
    if unknown:
        raise UserError(
            f"cannot read files ending in {', '.join(unknown)}; use .txt, .md, .py, .rst, .jsonl, .json or .parquet."
        )
    empty = [f for f in files if f.stat().st_size == 0]
    if len(empty) == len(files):
        raise UserError(
            f"every file matched by data.source.paths={list(patterns)} is empty; point it at files with text."
        )
    return files


def source_files(config: SourceConfig) -> list[Path]:
    if config.kind == "stdlib":
        return stdlib_files()
    if config.kind == "files":
        return matching_files(config.paths)
    return []


def source_identity(config: SourceConfig) -> dict[str, Any]:
    """Everything about the source that changes the documents; part of the data cache's fingerprint."""
    identity: dict[str, Any] = {
        "kind": config.kind,
        "text_field": config.text_field,
        "max_documents": config.max_documents,
    }
    files = source_files(config)
    if files:
        digest = hashlib.sha256()
        for f in files:
            stat = f.stat()
            digest.update(f"{f.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        identity["files"] = digest.hexdigest()
    if config.kind == "stdlib":
        identity["python"] = sys.version
    if config.kind == "hub":
        identity.update(name=config.name, subset=config.subset, split=config.split)
    if config.kind == "polynomial":
        identity.update(
            seed=config.seed, problems=config.problems, min_ops=config.min_ops, max_ops=config.max_ops,
            eval_seed=config.eval_seed, eval_problems=config.eval_problems, generator=GENERATOR_VERSION,
        )  # fmt: skip
    if config.kind == "induction":
        identity.update(documents=config.documents, seed=config.seed, generator=generator_digest())
    return identity


def load_documents(config: SourceConfig) -> datasets.Dataset | datasets.IterableDataset:
    """All documents of the source as one dataset with a single column ``text``."""
    if config.kind == "hub":
        dataset = _load_hub(config)
    elif config.kind == "polynomial":
        dataset = _polynomial_documents(config)
    elif config.kind == "induction":
        dataset = _generated(training_stories(config.documents, config.seed))
    else:
        dataset = _load_files(source_files(config), config.text_field)
    if config.max_documents:
        dataset = dataset.take(config.max_documents)
    return dataset


def _load_files(files: list[Path], text_field: str) -> datasets.Dataset:
    import datasets  # about a second to import: only where documents are loaded

    parts = []
    text_files = [str(f) for f in files if f.suffix in TEXT_SUFFIXES]
    with local_load_quiet():
        if text_files:
            parts.append(
                datasets.load_dataset(
                    "text", data_files=text_files, sample_by="document", encoding_errors="replace", split="train"
                )
            )
        for builder in sorted(set(BUILDERS.values())):
            data_files = [str(f) for f in files if BUILDERS.get(f.suffix) == builder and f.stat().st_size > 0]
            if data_files:
                loaded = datasets.load_dataset(builder, data_files=data_files, split="train")
                parts.append(_text_column(loaded, text_field, f"{builder} files {data_files[0]}..."))
    dataset = datasets.concatenate_datasets(parts)
    return dataset.filter(lambda batch: [bool(t and t.strip()) for t in batch["text"]], batched=True)


def _polynomial_documents(config: SourceConfig) -> datasets.Dataset:
    import datasets  # about a second to import: only where documents are loaded

    problems = training_problems(
        config.seed, config.problems, config.min_ops, config.max_ops, config.eval_seed, config.eval_problems
    )
    return datasets.Dataset.from_dict({"text": [problem.text for problem in problems]})


def _generated(stories: list[Story]) -> datasets.Dataset:
    import datasets  # about a second to import: only where documents are loaded

    return datasets.Dataset.from_dict({"text": [item.text for item in stories]})


@contextmanager
def local_load_quiet() -> Iterator[None]:
    """``datasets``' own progress bars off while it loads local files: over them it shows "Downloading data" (its copy
    into its cache) and "Generating train split", though nothing is downloaded; mtp's own bars (tokenizing, packing)
    are left as they are."""
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars  # slow import

    if are_progress_bars_disabled():
        yield
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()


def _load_hub(config: SourceConfig) -> datasets.Dataset | datasets.IterableDataset:
    import datasets  # about a second to import: only where documents are loaded

    try:
        dataset = datasets.load_dataset(config.name, config.subset, split=config.split, streaming=config.streaming)
    except FileNotFoundError as err:
        raise UserError(
            f"dataset {config.name!r} was not found locally and could not be downloaded ({err}); "
            "check data.source.name, or use data.source.kind=files for local files."
        ) from err
    except ValueError as err:
        raise UserError(f"dataset {config.name!r} could not be loaded: {err}") from err
    return _text_column(dataset, config.text_field, f"dataset {config.name!r}")


def _text_column(dataset, text_field: str, what: str):
    columns = dataset.column_names
    if columns is None:  # a streamed dataset whose features are unknown until read
        columns = list(next(iter(dataset)).keys())
    if text_field not in columns:
        raise UserError(
            f"{what} has no field {text_field!r} (fields: {', '.join(columns)}); "
            "set data.source.text_field to one of them."
        )
    dataset = dataset.select_columns([text_field])
    return dataset.rename_column(text_field, "text") if text_field != "text" else dataset


def in_validation(text: str, val_fraction: float) -> bool:
    bucket = int.from_bytes(hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=8).digest(), "little")
    return bucket % 1_000_000 < val_fraction * 1_000_000


def split_documents(dataset, val_fraction: float) -> dict[str, Any]:
    """{'train': ..., 'validation': ...} by content hash (datasets ``filter``, lazy for streamed datasets)."""

    def keep(want_val: bool):
        return lambda batch: [in_validation(t, val_fraction) == want_val for t in batch["text"]]

    return {"train": dataset.filter(keep(False), batched=True), "validation": dataset.filter(keep(True), batched=True)}


def iter_texts(dataset, batch_size: int = 256) -> Iterator[list[str]]:
    """Batches of document texts."""
    for batch in dataset.iter(batch_size=batch_size):
        yield batch["text"]
