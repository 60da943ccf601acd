"""mkdocs hook: the reference pages, generated from the code at every build and never written by hand.

``reference/commands.md`` holds every script's ``--help`` (the flags' help texts come from the settings dataclasses'
attribute docstrings); ``reference/configs.md`` holds every Hydra config group and its options, read from ``conf/``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def script_help(script: Path) -> str:
    """What ``python scripts/NAME.py --help`` prints (Hydra's help for pretrain.py)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's mtp, whatever is installed
    done = subprocess.run(
        [sys.executable, str(script), "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        raise RuntimeError(f"{script.name} --help failed:\n{done.stderr}")
    return done.stdout.rstrip()


def commands_page() -> str:
    parts = ["# Commands", "Generated at build time from each script's `--help`."]
    for script in sorted((ROOT / "scripts").glob("*.py")):
        parts.append(f"## {script.stem}\n\n```text\n{script_help(script)}\n```")
    return "\n\n".join(parts) + "\n"


def configs_page() -> str:
    conf = ROOT / "conf"
    parts = [
        "# Configuration groups",
        "Generated at build time from `conf/`. Choose an option with `group=option` "
        "(e.g. `model=causal4`), override a key with `group.key=value`.",
        f"## train.yaml (the root config)\n\n```yaml\n{(conf / 'train.yaml').read_text().rstrip()}\n```",
    ]
    for group in sorted(p for p in conf.rglob("*") if p.is_dir() and any(p.glob("*.yaml"))):
        name = group.relative_to(conf).as_posix()
        parts.append(f"## {name}")
        for option in sorted(group.glob("*.yaml")):
            parts.append(f"### {name}={option.stem}\n\n```yaml\n{option.read_text().rstrip()}\n```")
    return "\n\n".join(parts) + "\n"


def on_files(files, config):  # noqa: ANN001, ANN201 (mkdocs' hook signature)
    from mkdocs.structure.files import File  # mkdocs is the docs extra's; this module only runs inside it

    for uri, content in (("reference/commands.md", commands_page()), ("reference/configs.md", configs_page())):
        files.append(File.generated(config, uri, content=content))
    return files
