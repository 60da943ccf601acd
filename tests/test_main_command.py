"""The mtp command: every script as a subcommand, each taking its script's arguments."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from mtp.commands import main as mtp_command

ROOT = Path(__file__).resolve().parents[1]


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        mtp_command.main(argv)
    out = capsys.readouterr()
    return exit_.value.code, out.out, out.err


def test_every_script_and_mtp_command_is_a_subcommand():
    """Every script but the GPU check kit, a tool of the repository (it runs its tests), not of the package."""
    scripts = {path.stem.replace("_", "-") for path in (ROOT / "scripts").glob("*.py")}
    section = (ROOT / "pyproject.toml").read_text().split("[project.scripts]\n")[1].split("\n[")[0]
    commands = dict(re.findall(r'^([\w-]+) = "([\w.:]+)"$', section, re.M))  # (tomllib is Python 3.11's)
    dashed = {name.removeprefix("mtp-") for name in commands if name != "mtp"}
    assert scripts == dashed | {"gpu-check"} and set(mtp_command.SUBCOMMANDS) == dashed
    assert commands["mtp"] == "mtp.commands.main:entry_point"


def test_help_lists_every_subcommand_and_no_subcommand_is_an_error(capsys):
    status, out, _ = run(["--help"], capsys)
    assert status == 0 and all(re.search(rf"^  {name} +\S", out, re.M) for name in mtp_command.SUBCOMMANDS)
    status, _, err = run([], capsys)
    assert status == 2 and err.startswith("usage: mtp SUBCOMMAND")


def test_an_unknown_subcommand_is_one_sentence_with_the_nearest(capsys):
    status, _, err = run(["bench-decod", "CKPT"], capsys)
    assert status == 2
    assert err == (
        "mtp: no subcommand 'bench-decod' (did you mean bench-decode?); choose one of pretrain, decode, distill, "
        "bench-decode, bench-train, compare-heads, fit-tree, export, results-page, heads-curve, eval-task\n"
    )


def test_a_subcommand_takes_its_scripts_arguments_and_errors(capsys):
    status, out, _ = run(["decode", "--help"], capsys)
    assert status == 0 and out.startswith("usage: mtp decode ") and "--cuda-graphs" in out
    status, _, err = run(["pretrain", "model=nope"], capsys)
    assert status == 2 and "model=nope names no config in conf/model/" in err


def test_pretrain_help_lists_the_config_groups_to_choose_from_and_not_the_internal_ones(capsys):
    status, out, _ = run(["pretrain", "--help"], capsys)
    assert status == 0 and re.search(r"^model: .*\bmtp4\b", out, re.M) and re.search(r"^size: ", out, re.M)
    assert not re.search(r"^(\S+/)+_\S*: ", out, re.M), "--help lists an internal group (conf/model/_base)"


@pytest.mark.slow
def test_the_installed_mtp_command_runs_a_subcommand():
    mtp = shutil.which("mtp")
    if mtp is None:
        pytest.skip("the mtp command is not installed here (pip install -e . installs it)")
    result = subprocess.run([mtp, "fit-tree", "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("usage: mtp fit-tree ")
