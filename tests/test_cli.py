"""The one command-line layer (mtp/commands/cli.py, mtp/commands/): one error handler, one device and dtype choice,
decoding settings checked by GenerationConfig alone and reported under their flags, installed entry points."""

import argparse
import errno
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra

from mtp.commands import bench_decode, bench_train, cli, compare_heads, decode, fit_tree, pretrain
from mtp.data.packing import TokenizerConfig
from mtp.decode import GenerationConfig
from mtp.decode.methods.prompt_lookup import LookupDrafter
from mtp.decode.plan import Plan
from mtp.decode.settings import HeadsSettings
from mtp.errors import SettingError, Trained, UserError
from mtp.model.config import ModelConfig

ROOT = Path(__file__).resolve().parents[1]
ENTRY_POINTS = {
    "mtp-pretrain": "pretrain",
    "mtp-decode": "decode",
    "mtp-export": "export",
    "mtp-bench-decode": "bench_decode",
    "mtp-bench-train": "bench_train",
    "mtp-fit-tree": "fit_tree",
    "mtp-compare-heads": "compare_heads",
}
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


def test_a_user_error_is_one_line_on_stderr_and_exit_2(capsys):
    def main(argv):
        raise UserError(f"--thing {argv[0]} is wrong; use another.")

    with pytest.raises(SystemExit) as exit_:
        cli.run_script(main, ["7"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "error: --thing 7 is wrong; use another.\n"


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (
            OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/data/out/results.json"),
            "error: /data/out/results.json: No space left on device; free some disk space or choose another path.",
        ),
        (
            PermissionError(errno.EACCES, os.strerror(errno.EACCES), "/data/out"),
            "error: /data/out: Permission denied; check the path and its permissions, or choose another path.",
        ),
        (
            OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
            "error: No space left on device; free some disk space or choose another path.",
        ),
    ],
)
def test_an_os_error_is_one_line_naming_the_path_and_the_cause(capsys, error, line):
    def main(argv):
        raise error

    with pytest.raises(SystemExit) as exit_:
        cli.run_script(main, [])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == line + "\n"


def test_an_unwritable_output_is_one_line_from_a_real_command(tmp_path, capsys):
    """fit_tree makes its output's folder before loading anything: a file where a folder should be fails at once."""
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    with pytest.raises(SystemExit) as exit_:
        cli.run_script(fit_tree.main, [str(tmp_path / "missing.ckpt"), "--out", str(blocker / "trees" / "tree.json")])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        f"error: {blocker}/trees: Not a directory; check the path and its permissions, or choose another path.\n"
    )


def test_the_handler_lets_other_errors_through():
    def main(argv):
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        cli.run_script(main, [])


# every bad decoding setting comes from GenerationConfig, named by its flag; the checkpoint does not exist, so each
# of these also shows that the flags are checked before anything is loaded
BAD_SETTINGS = [
    (decode, ["--top-p", "0"], "--top-p 0 must lie in (0, 1]; 1 turns nucleus sampling off."),
    (decode, ["--top-p", "1.5"], "--top-p 1.5 must lie in (0, 1]; 1 turns nucleus sampling off."),
    (decode, ["--temperature", "-1"], "--temperature -1 must be 0 (greedy) or positive."),
    (decode, ["--max-new-tokens", "0"], "--max-new-tokens 0 must be at least 1."),
    (decode, ["--self-speculative", "--heads", "0"], "--heads 0 must be at least 1."),
    (decode, ["--top-k", "-1"], "--top-k -1 must be 0 (off) or positive."),
    (decode, ["--self-speculative", "--draft-p-min", "1.5"], "--draft-p-min 1.5 must lie in [0, 1]; 0 turns it off."),
    (decode, ["--typical-epsilon", "2"], "--typical-epsilon 2 must lie in [0, 1]."),
    (decode, ["--typical-delta", "-0.5"], "--typical-delta -0.5 must be at least 0."),
    (fit_tree, ["--top-p", "0"], "--top-p 0 must lie in (0, 1]; 1 turns nucleus sampling off."),
    (fit_tree, ["--top-k", "-3"], "--top-k -3 must be 0 (off) or positive."),
    (fit_tree, ["--max-new-tokens", "0"], "--max-new-tokens 0 must be at least 1."),
    (bench_decode, ["--temperature", "-1"], "--temperature -1 must be 0 (greedy) or positive."),
    (bench_decode, ["--max-new-tokens", "0"], "--max-new-tokens 0 must be at least 1."),
    (bench_decode, ["--draft-p-min", "2"], "--draft-p-min 2 must lie in [0, 1]; 0 turns it off."),
    (
        decode,
        ["--self-speculative", "--draft-first-ids", "-1"],
        "--draft-first-ids -1 must be 0 (every token) or positive.",
    ),
    (decode, ["--draft-vocab", "8"], "--draft-vocab is now --draft-first-ids; use --draft-first-ids 8."),
    (bench_decode, ["--draft-vocabs", "0,8"], "--draft-vocabs is now --draft-first-ids; use --draft-first-ids 0,8."),
    (compare_heads, ["--top-p", "1.5"], "--top-p 1.5 must lie in (0, 1]; 1 turns nucleus sampling off."),
    (compare_heads, ["--max-new-tokens", "0"], "--max-new-tokens 0 must be at least 1."),
]


@pytest.mark.parametrize(("command", "args", "message"), BAD_SETTINGS)
def test_a_bad_decoding_setting_is_reported_under_its_flag(tmp_path, command, args, message):
    argv = [str(tmp_path / "missing.ckpt"), *args, "--out", str(tmp_path / "out")]
    if command is decode:
        argv = [*argv[:-2], "--prompt", "x"]
    with pytest.raises(UserError) as err:
        command.main(argv)
    assert str(err.value) == message


def test_the_benchmark_names_a_setting_a_model_cannot_decode_by_its_flag_or_by_its_training_runs_key(
    tiny_checkpoints, tmp_path
):
    """The library names the fields (the data's prompt_tokens, the heads); bench_decode spells them as its flags, and
    as the keys of the bench_decode node of a training run that benchmarks its checkpoint."""
    checkpoint = str(tiny_checkpoints["mtp4"])
    long = {"prompts": 1, "prompt_tokens": 100000, "modes": "greedy", "batch_sizes": "1", "out": str(tmp_path)}
    argv = [checkpoint, "--prompts", "1", "--prompt-tokens", "100000", "--modes", "greedy", "--out", str(tmp_path)]
    with pytest.raises(UserError, match=r"^no validation document has 100000 tokens; lower --prompt-tokens\.$"):
        bench_decode.main(argv)
    with pytest.raises(UserError, match=r"^no validation document has 100000 tokens; lower bench_decode\.prompt_"):
        bench_decode.run(bench_decode.settings_of_config(checkpoint, long), node="bench_decode")
    heads = {**long, "prompt_tokens": 8, "heads": "5"}
    with pytest.raises(UserError) as refused:
        bench_decode.run(bench_decode.settings_of_config(checkpoint, heads), node="bench_decode")
    assert str(refused.value) == (
        "bench_decode.heads=5 exceeds this checkpoint's 4 head(s); only eagle3 heads and causal heads trained with "
        "model.share_depth=true draft beyond them; use bench_decode.heads=1..4."
    )


def test_generation_config_names_its_fields():
    with pytest.raises(ValueError, match=re.escape("top_p=1.5 must lie in (0, 1]; 1 turns nucleus sampling off.")):
        GenerationConfig(top_p=1.5)
    with pytest.raises(ValueError, match=re.escape("typical_delta=-1 must be at least 0.")):
        GenerationConfig(typical_delta=-1.0)
    with pytest.raises(SettingError) as err:
        drafter = LookupDrafter(2, 40, "cpu", gamma=2)
        Plan(GenerationConfig(max_new_tokens=4), heads=HeadsSettings(heads=3, draft_p_min=0.3), drafter=drafter)
    assert err.value.fields == ("gamma", "tree", "draft_p_min")
    assert "draft_p_min" in str(err.value)
    assert err.value.render(cli.flag_of, " ").startswith("--gamma 2 drafts come from a drafter")


def test_a_setting_of_training_is_named_as_its_field_by_the_library_and_as_its_override_by_the_commands():
    """A fix that retrains names the training config's field (:class:`mtp.errors.Trained`): ``str()`` spells it as the
    field, a command line and a training run's node as the training run's override, beside their own settings."""
    err = SettingError(
        "{draft} has {vocab_size:100} tokens; train it with {vocab_size} on {path}, or use {heads:1}.",
        draft="d.ckpt",
        heads=2,
        vocab_size=Trained(ModelConfig, 320),
        path=Trained(TokenizerConfig, "TARGET.ckpt"),
    )
    assert (
        str(err)
        == "draft=d.ckpt has vocab_size=100 tokens; train it with vocab_size=320 on path=TARGET.ckpt, or use heads=1."
    )
    with pytest.raises(UserError) as flags, cli.settings_named_by_flags():
        raise err
    assert str(flags.value) == (
        "--draft d.ckpt has model.vocab_size=100 tokens; train it with model.vocab_size=320 on "
        "data.tokenizer.path=TARGET.ckpt, or use --heads 1."
    )
    with pytest.raises(UserError) as keys, cli.settings_named_by_config("bench_decode"):
        raise err
    assert str(keys.value).startswith("bench_decode.draft=d.ckpt has model.vocab_size=100 tokens;")
    assert str(keys.value).endswith("or use bench_decode.heads=1.")


def test_every_decoding_setting_is_a_flag_of_decode_with_its_docstring_as_help():
    """No list of flags beside GenerationConfig: each field is decode's --field-name, helped by its docstring (tree is
    decode's own --tree, a file or auto; eos_id comes from the tokenizer)."""
    options = decode.build_parser()._option_string_actions
    docs = cli.attribute_docs(GenerationConfig)
    for setting in fields(GenerationConfig):
        if not setting.metadata.get("flag", True):  # step_tree: derived from the others, not a setting
            continue
        flag = cli.flag_of(setting.name)
        if setting.name == "eos_id":
            assert flag not in options
        elif setting.name != "tree":
            assert options[flag].dest == setting.name
            assert options[flag].help.startswith(" ".join(docs[setting.name].split()[:3]).replace("``", "")), flag
    assert options["--adaptive-drafts"].default is False and "--no-adaptive-drafts" in options
    assert options["--acceptance"].choices == ("exact", "typical", "spectr")


@dataclass
class Toy:
    """A settings class the way GenerationConfig is written: typed fields, each with its docstring below it."""

    depth: int = 2
    """How deep to go. More is slower."""
    mode: Literal["fast", "exact"] = "exact"
    """fast or exact (100% of the time)."""
    verbose: bool = False
    """Say more."""
    limit: float | None = None
    """Stop at this much (None: never)."""
    secret: object = field(default=None, metadata={"flag": False})
    """Set by the program, never a flag."""

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise SettingError("{depth} must be at least 1; go deeper.", depth=self.depth)


def test_a_settings_field_becomes_a_flag_with_help_and_a_field_named_error():
    parser = argparse.ArgumentParser()
    cli.add_settings(parser, Toy, notes={"limit": "in seconds"}, depth=3)
    options = parser._option_string_actions
    assert set(options) >= {"--depth", "--mode", "--verbose", "--no-verbose", "--limit"} and "--secret" not in options
    assert options["--depth"].help == "How deep to go (default: 3)" and options["--depth"].type is int
    assert (
        options["--mode"].choices == ("fast", "exact")
        and options["--mode"].help == "fast or exact (100%% of the time) (default: exact)"
    )
    assert options["--limit"].type is float and options["--limit"].help == "Stop at this much (None: never); in seconds"
    args = parser.parse_args(["--verbose", "--limit", "2.5"])
    assert cli.settings_from(args, Toy, secret=7) == Toy(3, "exact", True, 2.5, 7)
    with pytest.raises(UserError, match=re.escape("--depth 0 must be at least 1; go deeper.")):
        cli.settings_from(parser.parse_args(["--depth", "0"]), Toy)
    with pytest.raises(SystemExit):
        parser.parse_args(["--mode", "slow"])
    renamed = {"max_new_tokens": "--new-tokens"}  # a setting whose flag has another name
    with pytest.raises(UserError, match=re.escape("--new-tokens 0 must be at least 1; go longer (--depth).")):
        with cli.settings_named_by_flags(renamed):
            raise SettingError(
                "{max_new_tokens} must be at least 1; go longer ({depth:name}).", max_new_tokens=0, depth=2
            )


@NO_CUDA
@pytest.mark.parametrize("command", [decode, bench_decode, fit_tree, bench_train, compare_heads])
def test_device_cuda_without_cuda_is_one_sentence(tmp_path, command):
    argv = ([] if command is bench_train else [str(tmp_path / "missing.ckpt")]) + ["--device", "cuda"]
    argv += ["--prompt", "x"] if command is decode else ["--out", str(tmp_path / "out")]
    with pytest.raises(UserError) as err:
        command.main(argv)
    assert str(err.value) == "--device cuda was asked for but PyTorch sees no CUDA device; use --device cpu or auto."


def test_device_choice():
    assert cli.pick_device("cpu") == torch.device("cpu")
    assert cli.pick_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")


def test_plots_without_matplotlib_are_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(UserError, match=re.escape("pip install -e '.[benchmarks]'")):
        bench_decode.main([str(tmp_path / "missing.ckpt"), "--out", str(tmp_path / "out")])


def test_pretrain_without_its_configs_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(cli, "PACKAGE_DIR", tmp_path / "site-packages" / "mtp")
    monkeypatch.setattr(sys, "argv", ["pretrain.py", "model=mtp1"])  # Hydra's entry point reads the command line
    with pytest.raises(UserError, match=re.escape("install it with pip install -e . from a checkout")):
        pretrain.main()


def test_pretrain_refuses_arguments_other_than_the_command_lines(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["pretrain.py", "model=mtp1"])
    with pytest.raises(ValueError, match="reads its overrides from sys.argv"):
        pretrain.main(["model=mtp2"])


def test_pretrain_os_error_is_one_line_and_leaves_no_run_folder(monkeypatch, tmp_path, capsys):
    def no_space(cfg):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "logs" / "x.ckpt"))

    monkeypatch.setattr(pretrain, "train", no_space)
    run_dir = tmp_path / "logs" / "run"
    monkeypatch.setattr(sys, "argv", ["pretrain.py", f"hydra.run.dir={run_dir}", f"paths.log_dir={tmp_path / 'logs'}"])
    try:
        with pytest.raises(SystemExit) as exit_:
            cli.run_script(pretrain.main)
    finally:
        GlobalHydra.instance().clear()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.endswith(
        f"error: {tmp_path}/logs/x.ckpt: No space left on device; free some disk space or choose another path.\n"
    )
    assert len(err.splitlines()) == 1, err
    assert not run_dir.exists()


def test_every_constant_of_a_command_is_used():
    """A module-level constant of mtp/commands/ that nothing in mtp/ reads is dead code (bench_decode had one)."""
    package = [path.read_text() for path in (ROOT / "mtp").rglob("*.py")]
    for path in (ROOT / "mtp" / "commands").glob("*.py"):
        for name in re.findall(r"^([A-Z][A-Z0-9_]+)(?::[^=]*)? =", path.read_text(), flags=re.M):
            uses = sum(len(re.findall(rf"\b{name}\b", text)) for text in package)
            assert uses > 1, f"{path.name}: {name} is defined but never used; delete it"


def test_no_script_edits_sys_path():
    for path in [*(ROOT / "scripts").glob("*.py"), *(ROOT / "mtp" / "commands").glob("*.py")]:
        assert "sys.path" not in path.read_text(), f"{path} edits sys.path; install with pip install -e . instead"


def test_scripts_are_thin_wrappers_of_the_commands():
    """Every script but the GPU check kit, a tool of the repository (it runs its tests), not of the package."""
    for path in (ROOT / "scripts").glob("*.py"):
        if path.name == "gpu_check.py":
            continue
        assert f"from mtp.commands.{path.stem} import entry_point" in path.read_text(), path


def test_entry_points_are_installed():
    installed = {
        ep.name: ep for ep in importlib.metadata.entry_points(group="console_scripts") if ep.name in ENTRY_POINTS
    }
    assert set(installed) == set(ENTRY_POINTS), "reinstall: pip install -e ."
    for name, module in ENTRY_POINTS.items():
        assert installed[name].value == f"mtp.commands.{module}:entry_point"
        assert shutil.which(name), f"{name} is not on PATH"


@pytest.mark.slow  # ~4 s: a fresh interpreter runs an installed entry point
def test_an_entry_point_runs(tmp_path):
    result = subprocess.run(
        [shutil.which("mtp-decode") or "mtp-decode", "--help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "--self-speculative" in result.stdout and result.stdout.startswith("usage: mtp-decode")


def test_pretrain_silences_two_library_notices_and_nothing_else(caplog):
    """Lightning's litlogger tip and torch's LeafSpec deprecation, each by its own message."""
    import logging
    import warnings

    from mtp.commands.pretrain import LITLOGGER_TIP, quiet_library_notices

    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        quiet_library_notices()
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning, stacklevel=1)
        warnings.warn("another deprecation", FutureWarning, stacklevel=1)
        with caplog.at_level(logging.INFO, logger=rank_zero.name):
            rank_zero.info(LITLOGGER_TIP + "(https://pypi.org/project/litlogger/) to enable LitLogger, ...")
            rank_zero.info("GPU available: False, used: False")
    assert [str(w.message) for w in shown] == ["another deprecation"]
    assert [r.getMessage() for r in caplog.records] == ["GPU available: False, used: False"]
