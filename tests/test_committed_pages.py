"""Every results page made from committed summaries is what its own command makes from them now, as in a fresh clone.

A page in docs/results whose last command is ``python scripts/results_page.py results/experiments/<experiment> --out
docs/results/<page>.md`` is regenerated from the committed folder into a scratch copy of the layout and compared line
by line: a summary committed without its page, a page edited by hand, or a page left behind by a change to how pages
are made fails here.
"""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMAND = re.compile(r"^python scripts/results_page\.py results/experiments/\S+ --out docs/results/\S+\.md$", re.M)


def committed_pages() -> list[tuple[Path, str]]:
    pages = []
    for path in sorted((ROOT / "docs" / "results").glob("*.md")):
        commands = COMMAND.findall(path.read_text())
        if commands:
            pages.append((path, commands[-1]))
    return pages


def test_the_committed_experiments_have_their_pages():
    made = {shlex.split(command)[2] for _, command in committed_pages()}
    kept = {
        f"results/experiments/{folder.name}"
        for folder in (ROOT / "results" / "experiments").iterdir()
        if folder.is_dir() and any(folder.glob("*/results.json"))
    }
    assert kept <= made, f"committed summaries without a page made from them: {sorted(kept - made)}"


@pytest.mark.slow
@pytest.mark.parametrize("path, command", committed_pages(), ids=lambda value: getattr(value, "name", ""))
def test_a_page_is_what_its_committed_summaries_make(tmp_path, path, command):
    (tmp_path / "results").symlink_to(ROOT / "results")
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")
    args = shlex.split(command)[1:]
    subprocess.run([sys.executable, *args], cwd=tmp_path, check=True, capture_output=True, text=True)
    made = (tmp_path / "docs" / "results" / path.name).read_text().splitlines()
    assert made == path.read_text().splitlines(), (
        f"{path.relative_to(ROOT)} differs from what `{command}` makes from the committed summaries: rerun it"
    )
