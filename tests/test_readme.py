"""README's and the docs' commands name things that exist: the scripts and their flags, the Hydra config groups and
options, the files they read, the folders runs write to, and outputs that stay out of git. Every shell and Python
block is either run by a test or marked ``<!-- not run: reason -->`` on the line before it."""

import contextlib
import functools
import io
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TEXT = "\n".join(page.read_text() for page in PAGES)
BLOCK = re.compile(r"^(?P<before>[^\n]*)\n```(?P<lang>bash|python|sh)\n(?P<body>.*?)^```", re.M | re.S)
NOT_RUN = re.compile(r"<!-- not run: \S.* -->")


def blocks(lang: str) -> list[str]:
    return [m["body"] for page in PAGES for m in BLOCK.finditer("\n" + page.read_text()) if m["lang"] == lang]


def command_lines() -> list[str]:
    """Every bash line, continuation lines joined and comments dropped."""
    lines = []
    for body in blocks("bash") + blocks("sh"):
        for line in body.replace("\\\n", " ").splitlines():
            lines.append(line.split(" #")[0] if not line.lstrip().startswith("#") else "")
    return [line for line in lines if line.strip()]


COMMANDS = command_lines()


def arguments(script: str) -> list[list[str]]:
    """The arguments of every documented command line that runs ``scripts/<script>``, up to the next shell operator."""
    found = []
    for line in COMMANDS:
        if "scripts/" + script not in line:
            continue
        words = shlex.split(line, posix=True)
        words = words[words.index(f"scripts/{script}") + 1 :]
        for i, word in enumerate(words):
            if word in ("&&", "||", "|", ";", ">", "2>&1"):
                words = words[:i]
                break
        found.append(words)
    return found


@functools.cache
def help_text(script: str) -> str:
    """``scripts/<script> --help``, run in this process (the scripts are two-line wrappers; torch is imported once)."""
    out = io.StringIO()
    with mock.patch.object(sys, "argv", [script, "--help"]), contextlib.redirect_stdout(out):
        with pytest.raises(SystemExit) as exit_:
            runpy.run_path(str(ROOT / "scripts" / script), run_name="__main__")
    assert exit_.value.code in (0, None), out.getvalue()[-2000:]
    return out.getvalue()


def test_every_code_block_is_run_or_marked_not_run_with_a_reason():
    unmarked = [
        f"{page.relative_to(ROOT)}: {m['body'].splitlines()[0][:60]}"
        for page in PAGES
        for m in BLOCK.finditer("\n" + page.read_text())
        if not NOT_RUN.search(m["before"])
    ]
    assert not unmarked, f"blocks with no '<!-- not run: reason -->' before them: {unmarked}"


def test_every_python_block_parses():
    for body in blocks("python"):
        compile(body, "<docs>", "exec")


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "scripts").glob("*.py") if p.name != "pretrain.py"))
def test_every_documented_flag_is_one_the_script_takes(script):
    documented = {word.split("=")[0] for words in arguments(script) for word in words if word.startswith("--")}
    if not documented:
        pytest.skip(f"the docs pass no flag to {script}")
    flags = set(re.findall(r"--[\w-]+", help_text(script)))
    assert documented <= flags, f"{script} takes no {sorted(documented - flags)}"


def test_every_documented_script_exists():
    named = set(re.findall(r"scripts/(\w+\.py)", TEXT))
    assert named and all((ROOT / "scripts" / name).is_file() for name in named), sorted(named)


def test_every_hydra_config_choice_in_the_docs_exists():
    conf = ROOT / "conf"
    groups = {p.relative_to(conf).as_posix() for p in conf.rglob("*") if p.is_dir()}
    checked = 0
    for words in arguments("pretrain.py"):
        for word in words:
            group, _, options = word.lstrip("+").partition("=")
            if group not in groups or not options or options.startswith(("<", "$")):
                continue
            for option in options.split(","):
                assert (conf / group / f"{option}.yaml").is_file() or option == "null", f"no conf/{group}/{option}.yaml"
                checked += 1
    assert checked, "the docs choose no config option"


def test_every_prompt_file_in_the_docs_exists():
    files = [words[i + 1] for words in arguments("decode.py") for i, w in enumerate(words) if w == "--prompt-file"]
    assert files, "the docs show no --prompt-file"
    for name in files:
        assert (ROOT / name).is_file(), f"the docs decode --prompt-file {name}, which is not in the repository"


def test_every_run_folder_in_the_docs_is_one_training_writes():
    tasks = {yaml.safe_load((ROOT / "conf/train.yaml").read_text())["task_name"]}
    for file in (ROOT / "conf").rglob("*.yaml"):
        task = (yaml.safe_load(file.read_text()) or {}).get("task_name")
        if isinstance(task, str):
            tasks.add(task)
    named = set(re.findall(r"logs/([\w<>-]+)/(?:multi)?runs", TEXT))
    assert named and named <= tasks, f"the docs read runs of {sorted(named - tasks)}; training writes {sorted(tasks)}"


def test_docs_export_into_folders_git_ignores():
    outputs = [words[1] for words in arguments("export.py")]
    assert outputs, "the docs show no export"
    for out in outputs:
        ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", out], cwd=ROOT).returncode == 0
        assert ignored, f"the docs export into {out}, which git would list as untracked in the checkout"


def test_readme_is_short_and_free_of_history():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    results = (ROOT / "docs/results").glob("*.md")
    generated = {page for page in results if "generated by scripts/results_page.py" in page.read_text()}
    for page in PAGES:
        if page in generated:
            continue
        found = re.findall(r"Issue [0-9]|this round|session script|\b[0-9a-f]{7}\b", page.read_text())
        assert not found, f"{page.relative_to(ROOT)} carries history: {found}"
