"""README's commands name things that exist: the files they read, the folders runs write to, and outputs that stay
out of git. (The commands themselves run in tests/test_scripts.py and the recipes' tests; these are the mistakes a new
user following README met.)"""

import re
import shlex
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
COMMANDS = [
    line.split("#")[0] for block in re.findall(r"```bash\n(.*?)```", README, re.S) for line in block.splitlines()
]


def arguments(script: str) -> list[list[str]]:
    """The arguments of every README command line that runs ``scripts/<script>``."""
    found = []
    for line in COMMANDS:
        words = shlex.split(line, posix=True) if "scripts/" + script in line else []
        if words:
            found.append(words[words.index(f"scripts/{script}") + 1 :])
    return found


def test_every_prompt_file_in_readme_exists():
    files = [words[i + 1] for words in arguments("decode.py") for i, w in enumerate(words) if w == "--prompt-file"]
    assert files, "README shows no --prompt-file"
    for name in files:
        assert (ROOT / name).is_file(), f"README decodes --prompt-file {name}, which is not in the repository"


def test_every_run_folder_in_readme_is_one_training_writes():
    tasks = {yaml.safe_load((ROOT / "conf/train.yaml").read_text())["task_name"]}
    for file in (ROOT / "conf").rglob("*.yaml"):
        task = (yaml.safe_load(file.read_text()) or {}).get("task_name")
        if isinstance(task, str):
            tasks.add(task)
    named = set(re.findall(r"logs/([\w<>-]+)/(?:multi)?runs", README))
    assert named and named <= tasks, f"README reads runs of {sorted(named - tasks)}; training writes {sorted(tasks)}"


def test_readme_exports_into_folders_git_ignores(tmp_path):
    outputs = [words[1] for words in arguments("export.py")]
    assert outputs, "README shows no export"
    for out in outputs:
        ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", out], cwd=ROOT).returncode == 0
        assert ignored, f"README exports into {out}, which git would list as untracked in the checkout"
