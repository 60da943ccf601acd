"""A step's profile: events split into categories exactly once each (a tree of events by hand), a real profile of a
tiny model adding up to its forward, the command's table and JSON; the threads a benchmark pins, and the sentence a
count it cannot pin gets."""

import json
import os
from dataclasses import dataclass, field

import pytest
import torch

from mtp.benchmarks.step_profile import CATEGORIES, OTHER, OUTSIDE, profile_step, split_events
from mtp.benchmarks.threads import cpu_ranges, described, pin_threads
from mtp.decode import GenerationConfig, HeadsSettings, Plan
from mtp.errors import SettingError, UserError
from mtp.model import MTPModel
from mtp.model.config import ModelConfig


@dataclass(eq=False)
class Event:
    """The fields of a profiler event that split_events reads: times in microseconds."""

    name: str
    self_cpu_time_total: float
    cpu_children: list = field(default_factory=list)
    cpu_parent: object = None

    @property
    def cpu_time_total(self) -> float:
        return self.self_cpu_time_total + sum(child.cpu_time_total for child in self.cpu_children)


def tree(name: str, own: float, *children: Event) -> Event:
    event = Event(name, own, list(children))
    for child in children:
        child.cpu_parent = event
    return event


def flatten(events):
    for event in events:
        yield event
        yield from flatten(event.cpu_children)


def test_each_event_is_counted_once_in_the_first_category_it_matches_its_children_included():
    norm = tree("aten::rms_norm", 2, tree("aten::pow", 3), tree("aten::mean", 4))  # 9 in all: a norm's
    compiled = tree(
        "Torch-Compiled Region: 0/1",
        5,  # dispatch
        tree("## Call CompiledFxGraph abc", 7, tree("aten::baddbmm", 100, tree("aten::copy_", 1))),  # 7 code, 101 mm
    )
    loose = tree("aten::cat", 6, tree("aten::mm", 50))  # 6 other, 50 products
    roots = [norm, compiled, loose, tree("aten::_index_put_impl_", 8), tree("aten::where", 2)]
    totals = split_events(list(flatten(roots)))
    assert totals == {
        "matrix products": 151,
        "attention": 0,
        "norms": 9,
        "cache writes": 8,
        "compiled code": 7,
        "compiled dispatch": 5,
        OTHER: 8,
    }
    assert sum(totals.values()) == sum(root.cpu_time_total for root in roots)  # nothing twice, nothing lost


def test_a_tiny_models_profile_adds_up_to_its_forward_and_counts_its_products_bytes():
    torch.manual_seed(0)
    model = MTPModel(ModelConfig(vocab_size=96, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, n_future=3)).eval()
    plan = Plan(GenerationConfig(max_new_tokens=6))
    measured = profile_step(model, [[1, 2, 3, 4]], plan)
    assert measured.forwards == 6 and measured.tokens == 6
    assert set(measured.ms) == {*(name for name, _ in CATEGORIES), OTHER, OUTSIDE}
    inside = sum(ms for name, ms in measured.ms.items() if name != OUTSIDE)
    assert 0 < inside <= measured.wall_ms * 1.01  # nothing counted twice
    assert measured.ms["matrix products"] > 0 and measured.ms["attention"] > 0 and measured.ms["norms"] > 0
    weights = sum(p.numel() for block in model.layers for p in block.parameters() if p.dim() == 2)
    assert measured.product_bytes == 4 * (weights + model.unembedding(1).weight.numel())
    assert measured.product_gb_per_s > 0
    drafting = profile_step(model, [[1, 2, 3, 4]], Plan(GenerationConfig(max_new_tokens=6), HeadsSettings(heads=3)))
    assert drafting.product_bytes == 0 and drafting.product_gb_per_s == 0  # drafts read more than one step's bytes


def test_the_command_prints_the_table_and_writes_the_profile(tiny_checkpoints, tmp_path, capsys):
    from mtp.commands import profile_step as command

    out = tmp_path / "profile.json"
    command.main([str(tiny_checkpoints["mtp4"]), "--max-new-tokens", "4", "--heads", "2", "--json", str(out)])
    printed = capsys.readouterr().out
    assert "2 heads, eager, quantize=none" in printed and "matrix products" in printed
    written = json.loads(out.read_text())
    assert written["forwards"] >= 2 and set(written["ms_per_forward"]) >= {"matrix products", OUTSIDE}


@pytest.fixture
def restored_threads():
    threads = torch.get_num_threads()
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    yield
    torch.set_num_threads(threads)
    if cpus is not None:
        os.sched_setaffinity(0, cpus)


def test_threads_are_set_and_pinned_to_as_many_cpus(restored_threads):
    first = min(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    pin_threads(1)
    assert torch.get_num_threads() == 1
    if hasattr(os, "sched_getaffinity"):
        assert os.sched_getaffinity(0) == {first}
    assert described() == f"1 thread on CPUs {first}"


def test_zero_threads_leaves_the_count_and_the_cpus(restored_threads):
    threads = torch.get_num_threads()
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    pin_threads(0)
    assert torch.get_num_threads() == threads
    assert cpus is None or os.sched_getaffinity(0) == cpus


@pytest.mark.parametrize("threads", [-1, 4096])
def test_a_count_it_cannot_pin_is_one_sentence_and_changes_nothing(restored_threads, threads):
    before = torch.get_num_threads()
    with pytest.raises(SettingError, match=rf"^threads={threads} is not a thread count this process can pin: it may "
                       r"run on \d+ CPU\(s\); give 1 to \d+, or 0 to leave PyTorch's count \(\d+\)\.$"):  # fmt: skip
        pin_threads(threads)
    assert torch.get_num_threads() == before


def test_the_commands_name_their_flag(tiny_checkpoints, restored_threads):
    from mtp.commands import decode

    with pytest.raises(UserError, match=r"^--threads 4096 is not a thread count this process can pin"):
        decode.main([str(tiny_checkpoints["mtp4"]), "--prompt", "x", "--threads", "4096"])


def test_cpus_are_written_as_ranges():
    assert cpu_ranges([5, 0, 1, 2]) == "0-2,5"
    assert cpu_ranges([3]) == "3"
    assert cpu_ranges([0, 2, 4, 5]) == "0,2,4-5"
