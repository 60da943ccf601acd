"""A decoding method is one object in the decode layer's registry (:mod:`mtp.decode.methods`): a method defined here,
in the test file alone, with its own proposer and its own sweep values, gets decode's flags (and their errors), a
decode run whose greedy output equals autoregressive decoding's, and bench_decode's rows, one per value it sweeps,
without any change to the package; so does a variant of the heads' own drafting (a benchmark row)."""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from mtp.checkpoint.load import load_checkpoint
from mtp.commands import bench_decode, decode
from mtp.decode import GenerationConfig, generate
from mtp.decode.methods import REGISTRY, BenchRow, DecodingMethod, Target, register, unregister
from mtp.decode.methods.heads import Heads, HeadsBench
from mtp.decode.plan import Plan, Proposal, Proposer
from mtp.errors import SettingError, UserError


class RepeatLast(Proposer):
    """Drafts each row's last token, ``times`` over (a poor drafter, but an honest one: one-hot proposals)."""

    method = "repeat"

    def __init__(self, times: int, vocab_size: int, device: torch.device) -> None:
        self.times, self.vocab_size, self.device = times, vocab_size, device

    def params(self) -> dict[str, str]:
        return {"times": str(self.times)}

    def start(self, prompts, max_len, config=None) -> None:
        super().start(prompts, max_len, config)
        self.last = [p[-1] for p in prompts]

    def advance(self, accepted: list[int], emitted: list[list[int]]) -> None:
        self.last = [tokens[-1] for tokens in emitted]

    def keep_rows(self, rows: list[int], index: Tensor) -> None:
        self.last = [self.last[r] for r in rows]

    def propose(self, gamma: int, draws: Tensor | None) -> Proposal:
        count = min(gamma, self.times)
        drafts = torch.tensor([[t] * count for t in self.last], device=self.device).view(len(self.last), count)
        probs = F.one_hot(drafts, self.vocab_size).float() if self.sampled else None
        return Proposal(drafts, probs, counts=[count] * len(self.last))


@dataclass
class RepeatSettings:
    repeat_last: int | None = None
    """Draft each row's last token this many times."""

    def __post_init__(self) -> None:
        if self.repeat_last is not None and self.repeat_last < 1:
            raise SettingError("{repeat_last} must be at least 1.", repeat_last=self.repeat_last)


@dataclass
class RepeatSweep:
    repeat_counts: list[int] = field(default_factory=lambda: [1, 2])
    """How many times the last token is drafted, a benchmark row each."""

    def __post_init__(self) -> None:
        if min(self.repeat_counts) < 1:
            raise SettingError("{repeat_counts} must all be at least 1.", repeat_counts=self.repeat_counts)


class Repeat(DecodingMethod):
    """Repeat drafts each row's last token again."""

    name = "repeat"
    settings = RepeatSettings
    sweep = RepeatSweep
    selected_by = "repeat_last"

    def proposer(self, target: Target) -> Proposer:
        return RepeatLast(self.options.repeat_last, target.loaded.config.vocab_size, target.device)

    def rows(self, target: Target, mode: str, labels: list[str]) -> list[BenchRow]:
        """A row per count of the sweep's, each with its own proposer."""
        vocab = target.loaded.config.vocab_size
        return [
            BenchRow(self.name, target.drafting(RepeatLast(times, vocab, target.device).with_gamma(target.gamma)))
            for times in self.sweep_values.repeat_counts
        ]


@pytest.fixture
def repeat_method():
    register(Repeat)
    yield Repeat
    unregister(Repeat.name)


def stats_of(line: str) -> dict[str, str]:
    return dict(re.findall(r"(\S+)=(\S+)", line))


def test_a_method_of_a_test_file_gets_flags_a_decode_run_and_its_swept_benchmark_rows(
    repeat_method, tiny_checkpoints, tmp_path, capsys
):
    checkpoint = str(tiny_checkpoints["mtp4"])
    assert "--repeat-last" in decode.build_parser().format_help()
    argv = [checkpoint, "--compare", "--prompt", "def f(", "--max-new-tokens", "12", "--repeat-last", "2"]
    assert decode.main(argv) == 0
    out = capsys.readouterr().out
    stats = stats_of(next(line for line in out.splitlines() if line.startswith("tokens=")))
    assert "outputs_match=yes" in out and stats["method"] == "repeat" and stats["times"] == "2"
    assert decode.main([*argv, "--temperature", "0.8", "--batch-size", "2"]) == 0  # sampling: one-hot proposals
    capsys.readouterr()

    bench = tmp_path / "bench"
    help_text = bench_decode.build_parser().format_help()
    assert "--repeat-counts" in help_text and "How many times the last token is drafted" in help_text  # its sweep
    assert "--repeat-counts" not in decode.build_parser().format_help()  # a sweep is the benchmark's alone
    bench_decode.main(
        [checkpoint, "--methods", "repeat", "--repeat-last", "3", "--repeat-counts", "1,3", "--modes", "greedy"]
        + ["--batch-sizes", "1", "--heads", "2", "--prompts", "2", "--prompt-tokens", "8", "--max-new-tokens", "8"]
        + ["--repeats", "1", "--out", str(bench)]
    )
    rows = [r for r in json.loads((bench / "results.json").read_text())["results"] if r["method"] == "repeat"]
    assert [r["drafter"]["times"] for r in rows] == ["1", "3"]  # a row per value swept, the method's own proposers
    assert all(r["gamma"] == 4 and r["identical_outputs"] == r["prompts"] == 2 for r in rows)  # bench's --gamma
    assert "repeat (gamma 4, times 3)" in (bench / "results.md").read_text()

    # the registry alone, without the commands: its proposer keeps greedy decoding's tokens
    loaded = load_checkpoint(tiny_checkpoints["mtp4"], torch.device("cpu"))
    prompts = [[1, 2, 3, 1, 2], [5, 6, 7]]
    target = Target(loaded, torch.device("cpu"), GenerationConfig(max_new_tokens=10), gamma=3)
    drafter = REGISTRY["repeat"](RepeatSettings(repeat_last=2)).drafter(target)
    assert drafter.gamma == 3
    reference, _ = generate(loaded.model, prompts, Plan(GenerationConfig(max_new_tokens=10)))
    outputs, stats = generate(loaded.model, prompts, Plan(GenerationConfig(max_new_tokens=10), drafter=drafter))
    assert outputs == reference and stats.method == "repeat"


def test_a_methods_bad_settings_are_one_sentence_naming_its_flag(repeat_method, tiny_checkpoints, capsys):
    checkpoint = str(tiny_checkpoints["mtp4"])
    with pytest.raises(UserError, match=r"^--repeat-last 0 must be at least 1\.$"):
        decode.main([checkpoint, "--prompt", "x", "--repeat-last", "0"])
    with pytest.raises(UserError, match=r"--repeat-last drafts without the heads, .* drop --self-speculative"):
        decode.main([checkpoint, "--prompt", "x", "--repeat-last", "2", "--self-speculative"])
    needs = "--methods repeat needs --repeat-last: Draft each row's last token this many times."
    with pytest.raises(UserError, match=re.escape(needs)):
        bench_decode.checked_args([checkpoint, "--methods", "repeat"])
    node = {"methods": "repeat", "repeat_last": 2, "repeat_counts": [0, 2]}  # a training run's bench_decode node
    with pytest.raises(UserError, match=r"^--repeat-counts \[0, 2\] must all be at least 1\.$"):
        bench_decode.settings_of_config(checkpoint, node)


def test_two_drafting_methods_at_once_are_refused_before_anything_loads(repeat_method):
    parser = decode.build_parser()
    for flags, named in (
        (["--repeat-last", "2", "--prompt-lookup", "2"], "--prompt-lookup and --repeat-last"),
        (["--draft", "d.ckpt", "--skip-layers", "1"], "--draft and --skip-layers"),
    ):
        with pytest.raises(UserError, match=rf"^{named} each choose who drafts; give one of them\.$"):
            decode.check_flags(parser.parse_args(["missing.ckpt", "--prompt", "x", *flags]))
    decode.check_flags(parser.parse_args(["missing.ckpt", "--prompt", "x", "--repeat-last", "2"]))


def test_a_method_whose_name_or_flags_clash_is_refused(repeat_method):
    with pytest.raises(ValueError, match="named 'repeat' is registered already"):
        register(type("Other", (Repeat,), {}))

    @dataclass
    class Clashing:
        prompt_lookup: int | None = None
        """Clashes with prompt lookup's flag."""

    with pytest.raises(ValueError, match="prompt_lookup are lookup's flags already"):
        clash = {"name": "clash", "settings": Clashing, "selected_by": "prompt_lookup"}
        register(type("Clash", (DecodingMethod,), clash))
    assert "clash" not in REGISTRY


def test_every_built_in_method_is_registered_and_answers_for_its_benchmark_entries():
    assert list(REGISTRY) == ["heads", "draft", "layerskip", "lookup"]
    assert bench_decode.methods() == (
        "chain", "tree", "typical", "adaptive", "spectr", "draft", "draft-spectr", "hybrid", "staged", "layerskip",
        "lookup", "lookup+heads",
    )  # fmt: skip
    parser = decode.build_parser()
    args = parser.parse_args(["x.ckpt", "--skip-layers", "1"])
    assert isinstance(args, argparse.Namespace) and [m.name for m in decode.chosen_methods(args)] == ["layerskip"]


def first_draft_only(bench: HeadsBench) -> list[BenchRow]:
    """The heads' chain cut to its first draft: a variant of the heads' drafting defined in this file alone."""
    return [BenchRow("first-draft", bench.chain.changed(heads=2))]


@pytest.fixture
def first_draft_variant():
    Heads.add_variant("first-draft", first_draft_only)
    yield first_draft_only
    Heads.remove_variant("first-draft")


def test_a_variant_of_the_heads_drafting_from_a_test_file_gets_a_benchmark_row(
    first_draft_variant, tiny_checkpoints, tmp_path
):
    assert "first-draft" in bench_decode.build_parser().format_help()
    bench = tmp_path / "bench"
    bench_decode.main(
        [str(tiny_checkpoints["mtp4"]), "--methods", "first-draft", "--modes", "greedy", "--batch-sizes", "1"]
        + ["--heads", "1,4", "--prompts", "2", "--prompt-tokens", "8", "--max-new-tokens", "8", "--repeats", "1"]
        + ["--out", str(bench)]
    )
    rows = json.loads((bench / "results.json").read_text())["results"]
    row = next(r for r in rows if r["method"] == "first-draft")
    assert row["heads"] == 2 and len(row["acceptance"]) == 1 and row["identical_outputs"] == row["prompts"] == 2
    assert "first-draft" in (bench / "results.md").read_text() and (bench / "decode.png").is_file()
