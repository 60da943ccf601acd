"""scripts/distill.py's one schema (mtp.commands.distill.SCHEMA): its flags and a training config's distill node are the
same settings, with the same defaults, and a node's bad key or value is one sentence naming it as the config does."""

from pathlib import Path

import pytest

from mtp.commands import distill
from mtp.commands.schema import node_values
from mtp.errors import UserError


def test_the_flags_defaults_are_the_nodes_defaults():
    """Every flag left out on the command line and every key a node leaves out read the same value."""
    flags = vars(distill.build_parser().parse_args(["m.ckpt", "--out", "d"]))
    flags = {key: value for key, value in flags.items() if not key.startswith("_")}
    node = node_values(distill.SCHEMA, {"out": "d"}, "distill", checkpoint=Path("m.ckpt"))
    assert set(flags) == set(node)
    for key, value in flags.items():
        assert node[key] == value and type(node[key]) is type(value), key
    assert distill.settings_of(flags) == distill.settings_of_config("m.ckpt", {"out": "d"})


def test_a_node_is_typed_as_the_flags_are():
    """A config's values become what the flags would give: paths as Paths, one glob as a list of one, a span written
    as a list as its MIN,MAX text, a whole number of minutes as a float, a null time budget as none."""
    node = {"out": "d", "paths": "src/*.py", "prompts": "q.jsonl", "prompt_tokens": [8, 32], "max_minutes": 8}
    run = distill.settings_of_config("m.ckpt", node)
    assert (run.checkpoint, run.out, run.prompts) == (Path("m.ckpt"), Path("d"), Path("q.jsonl"))
    assert (run.paths, run.prompt_tokens, run.max_minutes) == (["src/*.py"], "8,32", 8.0)
    assert distill.settings_of_config("m.ckpt", {"out": "d", "max_minutes": None}).max_minutes == 0.0


@pytest.mark.parametrize(
    ("key", "value", "sentence"),
    [
        (
            "max_tokens",
            "x",
            r"^distill\.max_tokens=x is not a whole number; give one, such as distill\.max_tokens=8\.$",
        ),
        ("source", "nope", r"^distill\.source=nope is not one of stdlib, .*, tasks; choose one of them\.$"),
        ("force", "yes", r"^distill\.force=yes is not true or false; .*\.$"),
        (
            "checkpoint",
            "other.ckpt",
            r"^distill\.checkpoint is not a setting of distill; its keys are batch_size, .*, val_fraction\.$",
        ),
    ],
)
def test_a_bad_node_value_is_one_sentence_naming_its_key(key, value, sentence):
    with pytest.raises(UserError, match=sentence):
        distill.settings_of_config("m.ckpt", {"out": "d", key: value})


def test_a_node_without_out_names_the_missing_folder():
    with pytest.raises(UserError, match=r"^distill\.out names no folder; set distill\.out=DIR"):
        distill.settings_of_config("m.ckpt", {"max_tokens": 5})
