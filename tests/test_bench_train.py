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
