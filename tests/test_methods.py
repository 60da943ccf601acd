"""A decoding method is two parts, one per layer, registered under one name: its decoding part in the decode layer's
registry (:mod:`mtp.decode.methods`) and its benchmark part in the benchmarks' (:mod:`mtp.benchmarks.methods`). A
method defined here, in the test file alone, with its own proposer, its own sweep values and its own plot marker, gets
decode's flags (and their errors), a decode run whose greedy output equals autoregressive decoding's, and
bench_decode's rows, one per value it sweeps, drawn with its marker, without any change to the package; so does a
variant of the heads' own drafting (a benchmark row of the heads' benchmark part)."""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from mtp.benchmarks import report
from mtp.benchmarks.methods import (
    BENCH_REGISTRY,
    BenchRow,
    BenchTarget,
    MethodBench,
    register_bench,
    row_markers,
    unregister_bench,
)
from mtp.benchmarks.methods.heads import HeadsBench, HeadsRows
from mtp.checkpoint.load import load_checkpoint
from mtp.commands import bench_decode, decode
from mtp.decode import GenerationConfig, generate
from mtp.decode.methods import REGISTRY, DecodingMethod, Target, register, unregister
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
    selected_by = "repeat_last"

    def proposer(self, target: Target) -> Proposer:
        return RepeatLast(self.options.repeat_last, target.loaded.config.vocab_size, target.device)


REPEAT_MARKER = "$r$"
"""Its rows' marker in bench_decode's plot (a mathtext letter: no built-in method's, no spare)."""


class RepeatBench(MethodBench):
    """Its benchmark part: a row per count swept, each with its own proposer."""

    method = Repeat
    sweep = RepeatSweep
    markers = {"repeat": REPEAT_MARKER}

    def rows(self, target: BenchTarget, mode: str, labels: list[str]) -> list[BenchRow]:
        """A row per count of the sweep's, each with its own proposer."""
        vocab = target.loaded.config.vocab_size
        return [
            self.row(self.name, target.drafting(RepeatLast(times, vocab, target.device).with_gamma(target.gamma)))
            for times in self.sweep_values.repeat_counts
        ]


@pytest.fixture
def repeat_method():
    """Both parts registered, from this file alone: the decoding part first, then its benchmark part."""
    register(Repeat)
    register_bench(RepeatBench)
    yield Repeat
    unregister_bench(Repeat.name)
    unregister(Repeat.name)


def stats_of(line: str) -> dict[str, str]:
    return dict(re.findall(r"(\S+)=(\S+)", line))


def legend_markers(monkeypatch) -> dict[str, str]:
    """The decoding plot's legend, label -> marker, as :func:`~mtp.benchmarks.report.plot_decode` saves it."""
    legend, save_figure = {}, report.save_figure

    def recording(figure, title, path, **kwargs):
        legend.update({h.get_label(): h.get_marker() for h in figure.legends[0].legend_handles})
        save_figure(figure, title, path, **kwargs)

    monkeypatch.setattr(report, "save_figure", recording)
    return legend


def test_a_method_of_a_test_file_gets_flags_a_decode_run_and_its_swept_benchmark_rows(
    repeat_method, tiny_checkpoints, tmp_path, capsys, monkeypatch
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
    legend = legend_markers(monkeypatch)
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
    assert row_markers()["repeat"] == REPEAT_MARKER and legend["repeat"] == REPEAT_MARKER  # its marker, in the plot

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


def test_a_benchmark_part_needs_its_method_and_must_not_clash(repeat_method):
    with pytest.raises(ValueError, match="a benchmark part of the method 'repeat' is registered already"):
        register_bench(type("Other", (RepeatBench,), {"method": Repeat}))

    @dataclass
    class Gammas:
        gammas: list[int] = field(default_factory=lambda: [1])
        """Clashes with the draft model's sweep."""

    unregistered = type("Unregistered", (Repeat,), {"name": "unregistered"})
    with pytest.raises(ValueError, match="its method 'unregistered' is not registered"):
        register_bench(type("UnregisteredBench", (MethodBench,), {"method": unregistered}))
    unregister_bench(Repeat.name)  # the fixture's, so that the next ones are refused for their clashes alone
    with pytest.raises(ValueError, match="gammas are draft's flags already"):
        register_bench(type("ClashBench", (RepeatBench,), {"method": Repeat, "sweep": Gammas}))
    with pytest.raises(ValueError, match="--methods entries hybrid are draft's already"):
        register_bench(type("EntryBench", (RepeatBench,), {"method": Repeat, "labels": ("repeat", "hybrid")}))
    assert "repeat" not in BENCH_REGISTRY


def test_every_built_in_method_is_registered_and_answers_for_its_benchmark_entries():
    assert list(REGISTRY) == ["heads", "draft", "layerskip", "lookup"]
    assert list(BENCH_REGISTRY) == list(REGISTRY)  # each benchmark part under its method's name
    assert all(bench.method is REGISTRY[name] for name, bench in BENCH_REGISTRY.items())
    assert bench_decode.methods() == (
        "chain", "tree", "typical", "adaptive", "spectr", "draft", "draft-spectr", "hybrid", "staged", "layerskip",
        "lookup", "lookup+heads",
    )  # fmt: skip
    parser = decode.build_parser()
    args = parser.parse_args(["x.ckpt", "--skip-layers", "1"])
    assert isinstance(args, argparse.Namespace) and [m.name for m in decode.chosen_methods(args)] == ["layerskip"]


def first_draft_only(bench: HeadsRows) -> list[BenchRow]:
    """The heads' chain cut to its first draft: a variant of the heads' drafting defined in this file alone."""
    return [BenchRow("first-draft", bench.chain.changed(heads=2))]


@pytest.fixture
def first_draft_variant():
    HeadsBench.add_variant("first-draft", first_draft_only, marker="$f$")
    yield first_draft_only
    HeadsBench.remove_variant("first-draft")


def test_a_variant_of_the_heads_drafting_from_a_test_file_gets_a_benchmark_row(
    first_draft_variant, tiny_checkpoints, tmp_path, monkeypatch
):
    assert "first-draft" in bench_decode.build_parser().format_help()
    bench = tmp_path / "bench"
    legend = legend_markers(monkeypatch)
    bench_decode.main(
        [str(tiny_checkpoints["mtp4"]), "--methods", "first-draft", "--modes", "greedy", "--batch-sizes", "1"]
        + ["--heads", "1,4", "--prompts", "2", "--prompt-tokens", "8", "--max-new-tokens", "8", "--repeats", "1"]
        + ["--out", str(bench)]
    )
    rows = json.loads((bench / "results.json").read_text())["results"]
    row = next(r for r in rows if r["method"] == "first-draft")
    assert row["heads"] == 2 and len(row["acceptance"]) == 1 and row["identical_outputs"] == row["prompts"] == 2
    assert "first-draft" in (bench / "results.md").read_text() and (bench / "decode.png").is_file()
    assert legend["first-draft"] == "$f$"
