"""bench_decode's one schema: its flags and a training run's bench_decode node are the same settings, at the same
defaults, and a node's bad key or value is one sentence naming it as the config spells it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mtp.benchmarks.humaneval import WEAKER_SANDBOX_FLAG
from mtp.commands import bench_decode, compare_heads
from mtp.commands.schema import node_values
from mtp.errors import UserError


def test_the_flags_defaults_are_the_nodes_name_by_name():
    flags = {k: v for k, v in vars(bench_decode.parse_args(["c.ckpt"])).items() if not k.startswith("_")}
    node = node_values(bench_decode.schema(), {}, "bench_decode", checkpoint=Path("c.ckpt"))
    assert sorted(flags) == sorted(node)
    for name, value in flags.items():
        assert node[name] == value, name


def test_the_flags_keep_their_spellings(capsys):
    help_text = bench_decode.build_parser().format_help()
    spellings = (
        "--batch-sizes",
        "--draft-first-ids",
        "--prompt-set",
        "--llama-cpp DIR",
        "--llama-cpp-target GGUF",
        "--llama-cpp-types TYPES",
        "--vllm-python PYTHON",
        WEAKER_SANDBOX_FLAG,
        "--hf-static",
        "--no-fixed-length",
        "--gammas",
    )
    for spelling in spellings:
        assert spelling in help_text, spelling
    assert WEAKER_SANDBOX_FLAG == "--weaker-sandbox"
    with pytest.raises(UserError, match=r"^--draft-vocabs is now --draft-first-ids; use --draft-first-ids 0,8\.$"):
        bench_decode.parse_args(["c.ckpt", "--draft-vocabs", "0,8"])
    args = bench_decode.parse_args(["c.ckpt", "--heads", "1,2", "--modes", "greedy", "--hf", "--no-hf-static"])
    assert (args.heads, args.modes, args.hf, args.hf_static) == ([1, 2], "greedy", True, False)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        compare_heads.parse_args(["--help"])
    assert "--prompts PROMPTS" in capsys.readouterr().out  # compare_heads' prompt set: the same part


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"repeats": "x"}, "bench_decode.repeats=x is not a whole number; give one, such as bench_decode.repeats=8."),
        ({"prompt_set": "nope"}, "bench_decode.prompt_set=nope is not one of heldout, humaneval; choose one of them."),
        ({"prompt": 3}, "bench_decode.prompt is not a setting of bench_decode; did you mean bench_decode.prompts?"),
        ({"heads": "x"}, "bench_decode.heads=x: 'x' is not a comma-separated list of integers, e.g. 1,2,4,8."),
    ],
)
def test_a_nodes_bad_key_or_value_is_one_sentence_naming_it(node, message):
    with pytest.raises(UserError) as err:
        bench_decode.settings_of_config("c.ckpt", node)
    assert str(err.value) == message
    assert re.fullmatch(r"[^\n]+[.?]", str(err.value))


def test_a_nodes_values_are_read_as_the_fields_are_typed():
    values = node_values(
        bench_decode.schema(),
        {"heads": "2", "batch_sizes": [1], "modes": ["greedy"], "draft_first_ids": [0, 1024], "hf_static": None},
        "bench_decode",
        checkpoint=Path("c.ckpt"),
    )
    assert (values["heads"], values["batch_sizes"], values["modes"]) == ([2], [1], "greedy")
    assert (values["draft_first_ids"], values["hf_static"]) == ("0,1024", None)


@pytest.mark.compiled_by_default
def test_the_benchmark_compiles_a_cpus_step_unless_told_not_to():
    assert bench_decode.settings_of_config("c.ckpt", {"device": "cpu"}).step.compile
    assert not bench_decode.settings_of_config("c.ckpt", {"device": "cpu", "compile": False}).step.compile
    assert bench_decode.checked_args(["c.ckpt", "--device", "cpu"]).step.compile
    assert not bench_decode.checked_args(["c.ckpt", "--device", "cpu", "--no-compile"]).step.compile
