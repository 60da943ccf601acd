"""One schema for a command's settings (mtp/commands/schema.py): a dataclass's fields are both the command's flags and
the keys of the training config's node that runs it, read the same way and defaulting the same."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from mtp.commands import bench_decode, distill, eval_task
from mtp.commands.schema import Part, add_parts, node_values
from mtp.errors import UserError


@dataclass
class Example:
    """Settings of a command in a test."""

    model: str = field(metadata={"positional": True})
    """The model."""
    count: int = 3
    """How many."""
    scale: float = 0.5
    """How much."""
    limit: int | None = None
    """At most this many; default: none."""
    sizes: list[int] = field(default_factory=lambda: [1, 8])
    """Batch sizes."""
    modes: list[str] = field(default_factory=lambda: ["greedy", "sampling"], metadata={"separator": ","})
    """Modes."""
    paths: list[str] = field(default_factory=list, metadata={"metavar": "GLOB"})
    """Paths."""
    kind: Literal["a", "b"] = "a"
    """The kind."""
    source: str | None = field(default=None, metadata={"choices": ("files", "hub")})
    """The source."""
    fast: bool = False
    """Go fast."""
    out: Path = Path("results")
    """Where to write."""
    span: str = "32,192"
    """MIN,MAX tokens."""


SCHEMA = (Part(Example, defaults={"count": 4}, title="example"),)


def flags(*argv: str) -> dict:
    import argparse

    parser = argparse.ArgumentParser()
    add_parts(parser, SCHEMA)
    return {k: v for k, v in vars(parser.parse_args(list(argv))).items() if not k.startswith("_")}


def test_a_node_and_the_flags_read_the_same_settings_and_default_the_same():
    assert node_values(SCHEMA, {}, "example", model="m") == flags("m")
    assert flags("m")["count"] == 4  # the part's default over the field's
    argv = "--count 5 --scale 2 --limit 7 --sizes 1,2 --modes greedy --paths a b --kind b --source hub --fast --out o"
    typed = flags("m", *argv.split(), "--span", "8,32")
    node = {"count": 5, "scale": 2, "limit": 7, "sizes": "1,2", "modes": ["greedy"], "paths": ["a", "b"], "kind": "b",
            "source": "hub", "fast": True, "out": "o", "span": [8, 32]}  # fmt: skip
    assert node_values(SCHEMA, node, "example", model="m") == typed
    assert node_values(SCHEMA, {"sizes": [1, 2], "modes": "greedy,sampling"}, "example", model="m")["modes"] == [
        "greedy",
        "sampling",
    ]
    assert isinstance(node_values(SCHEMA, {"scale": 2}, "example", model="m")["scale"], float)


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"cont": 1}, r"^example\.cont is not a setting of example; did you mean example\.count\?$"),
        ({"zzz": 1}, r"^example\.zzz is not a setting of example; its keys are count, fast, kind, "),
        ({"model": "x"}, r"^example\.model is not a setting of example; "),  # the run gives it, not the config
        ({"count": "x"}, r"^example\.count=x is not a whole number; give one, such as example\.count=8\.$"),
        ({"count": True}, r"^example\.count=True is not a whole number"),
        ({"scale": "big"}, r"^example\.scale=big is not a number; give one, such as example\.scale=0\.5\.$"),
        ({"fast": "yes"}, r"^example\.fast=yes is not true or false; write example\.fast=true or example\.fast=false"),
        ({"kind": "c"}, r"^example\.kind=c is not one of a, b; choose one of them\.$"),
        ({"source": "web"}, r"^example\.source=web is not one of files, hub; choose one of them\.$"),
        ({"sizes": "1,x"}, r"^example\.sizes=1,x: '1,x' is not a comma-separated list of integers, e\.g\. 1,2,4,8\.$"),
        ({"count": None}, r"^example\.count cannot be null; give it a value or leave it out for its default\.$"),
        ({"out": 3}, r"^example\.out=3 is not a path; give a file or folder name\.$"),
    ],
)
def test_a_bad_key_or_value_of_a_node_is_one_sentence_naming_its_key(node, message):
    with pytest.raises(UserError, match=message):
        node_values(SCHEMA, node, "example", model="m")


def test_a_setting_the_run_must_give_is_named_when_missing():
    with pytest.raises(UserError, match=r"^example\.model is not set; set example\.model=VALUE in the config\.$"):
        node_values(SCHEMA, {}, "example")


def test_eval_task_reads_its_node_without_a_parser(monkeypatch):
    """The training run's eval_task node reaches the command's settings through the schema alone: with argparse's
    parsing broken, the node still reads; its flags and its node's defaults agree."""
    parsed = {k: v for k, v in vars(eval_task.build_parser().parse_args(["c.ckpt"])).items() if not k.startswith("_")}
    assert parsed == node_values(eval_task.SCHEMA, {}, "eval_task", checkpoint="c.ckpt")

    def refuse(*args, **kwargs):
        raise AssertionError("a config node went through argparse")

    monkeypatch.setattr("argparse.ArgumentParser.parse_args", refuse)
    evaluation = eval_task.settings_of_config("c.ckpt", {"ops": [1, 6], "problems": 5, "out": "o"})
    assert (evaluation.task.ops, evaluation.task.problems, evaluation.out) == ([1, 6], 5, Path("o"))
    with pytest.raises(UserError, match=r"^eval_task\.problem is not a setting of eval_task; did you mean eval_task"):
        eval_task.settings_of_config("c.ckpt", {"problem": 5})


def test_a_nodes_device_is_named_by_its_key_where_no_cuda_is_seen(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    message = r"^eval_task\.device=cuda was asked for but PyTorch sees no CUDA device; use eval_task\.device=cpu or "
    with pytest.raises(UserError, match=message):
        eval_task.settings_of_config("c.ckpt", {"device": "cuda"})


NODES = {  # each command a training run's config runs, with a node of it
    "eval_task": (eval_task, {"ops": [1, 6], "problems": 5, "heads": 2, "out": "o"}),
    "distill": (distill, {"out": "d", "paths": ["a", "b"], "prompt_tokens": [8, 32], "max_minutes": 2}),
    "bench_decode": (bench_decode, {"prompts": 3, "heads": [1, 2], "batch_sizes": "1", "modes": "greedy"}),
}


@pytest.mark.parametrize("name", sorted(NODES))
def test_no_training_node_reaches_its_command_through_argparse(monkeypatch, name):
    """A training run's node becomes the command's settings by the schema alone: with argparse unable to build a
    parser, each command still reads its node."""
    command, node = NODES[name]
    expected = command.settings_of_config("m.ckpt", node)

    def refuse(*args, **kwargs):
        raise AssertionError("a config node went through argparse")

    monkeypatch.setattr("argparse.ArgumentParser.__init__", refuse)
    assert command.settings_of_config("m.ckpt", node) == expected
