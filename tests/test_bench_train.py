import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}  # the script imports the mtp of this tree, not another install


pytestmark = pytest.mark.slow  # every test starts bench_train.py in a process (its --quick run: ~30 s)


@pytest.fixture(scope="module")
def quick_results(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_train.py"), "--quick", "--device", "cpu", "--out", str(out)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return out


def test_quick_mode_schema_and_ratios(quick_results):
    data = json.loads((quick_results / "results.json").read_text())
    assert {"device", "torch", "dtype", "d_model", "n_layers", "seq_len", "batch_size"} <= data["setup"].keys()
    rows = data["results"]
    assert {(r["n_future"], r["vocab_size"], r["loss"]) for r in rows} == {
        (n, v, mode) for n in (1, 2) for v in (256, 2048) for mode in ("sequential", "naive")
    }
    for row in rows:
        assert row["status"] == "ok"
        for key in ("peak_memory_bytes", "step_time_s", "tokens_per_s", "memory_ratio_to_n1", "time_ratio_to_n1"):
            assert isinstance(row[key], (int, float)) and row[key] > 0, (key, row)
        if row["n_future"] == 1:
            assert row["memory_ratio_to_n1"] == row["time_ratio_to_n1"] == 1.0
    # parameter-matched: every n has the same parameter count at one vocabulary
    for vocab in (256, 2048):
        assert len({r["parameters"] for r in rows if r["vocab_size"] == vocab}) == 1


def test_quick_mode_writes_table_and_plot(quick_results):
    table = (quick_results / "results.md").read_text()
    assert "| vocab | loss | n | peak memory (MiB) | memory / n=1 |" in table
    assert table.count("\n| 2048 |") == 4
    assert (quick_results / "memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--n", "1,x"], "not a comma-separated list"), (["--modes", "fast"], "must be sequential or naive")],
)
def test_bad_arguments_are_one_sentence(args, message):
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_train.py"), *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_a_split_step_reports_its_memory_per_process_beside_one_processs(tmp_path):
    """--tensor-parallel 1,2: every step also split across two gloo processes; the rows say the split, each split
    row's memory beside the same step's on one process, and the table gets their columns."""
    out = tmp_path / "tp"
    command = [sys.executable, str(ROOT / "scripts" / "bench_train.py"), "--tensor-parallel", "1,2", "--vocab", "512",
               "--n", "1,2", "--modes", "sequential", "--d-model", "64", "--n-layers", "4", "--n-heads", "4",
               "--n-kv-heads", "2", "--seq-len", "32", "--batch-size", "2", "--steps", "1", "--warmup", "1",
               "--out", str(out)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads((out / "results.json").read_text())["results"]
    assert sorted((r["tensor_parallel"], r["n_future"]) for r in rows) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    for row in rows:
        assert row["status"] == "ok" and row["memory_ratio_to_tp1"] > 0
        assert (row["memory_ratio_to_tp1"] == 1.0) == (row["tensor_parallel"] == 1)
    assert (
        "| vocab | loss | TP | n | peak memory (MiB) | memory / n=1 | memory / TP=1 |"
        in (out / "results.md").read_text()
    )


def test_a_model_the_processes_cannot_split_is_one_sentence():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_train.py"), "--tensor-parallel", "2", "--vocab", "513",
         "--quick"],
        capture_output=True, text=True, env=ENV, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0 and "model.vocab_size=513 is not divisible by" in result.stderr
    assert "Traceback" not in result.stderr
