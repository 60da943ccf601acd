"""A benchmark's output becomes a results page headed by its provenance; a rerun replaces the page."""

import json

import pytest

from mtp.benchmarks.memory import peak_resident_bytes
from mtp.benchmarks.results_page import (
    HEADER_FIELDS,
    HEADING_LENGTH,
    OPTIONAL_FIELDS,
    git_commit,
    header,
    page,
    provenance,
)
from mtp.commands.results_page import main
from mtp.errors import UserError

RUN = {
    "date": "2026-01-02 03:04 UTC",
    "commit": "0123456789ab",
    "machine": "Some CPU, 2 cores",
    "torch": "2.13.0",
    "command": "python scripts/bench_decode.py model.gguf --hf",
}


def write_run(folder, provenance_fields=RUN):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps({"provenance": provenance_fields, "results": []}))
    table = "| method | tokens/s |\n|---|---|\n| ar | 10.0 |\n"
    (folder / "results.md").write_text(f"Decoding model.gguf on CPU\n\n{table}")
    (folder / "decode.png").write_bytes(b"\x89PNG")
    return folder / "results.json"


def test_page_is_headed_once_by_date_commit_machine_torch_and_command(tmp_path):
    results = write_run(tmp_path / "run")
    out = tmp_path / "docs/results/decode.md"
    main([str(results), "--out", str(out)])
    text = out.read_text()
    assert text.startswith("# Decoding model.gguf on CPU\n")
    for field in HEADER_FIELDS:
        assert text.count(RUN[field]) == 1, field
    assert "| ar | 10.0 |" in text
    assert "![Decoding model.gguf on CPU](decode.png)" in text
    assert (out.parent / "decode.png").read_bytes() == b"\x89PNG"


def test_a_long_title_is_a_short_heading_over_a_paragraph_of_the_rest():
    setting = "Decoding last.ckpt (n=4, float32) on CPU (2 threads)"
    rest = "16 HumanEval prompts in the model's chat format, up to 128 new tokens each, best of 1 rounds"
    assert len(f"{setting}: {rest}") > HEADING_LENGTH
    text = page({"provenance": RUN}, f"{setting}: {rest}", "| a |", "decode.png")
    assert text.startswith(f"# {setting}\n")
    assert "\n16 HumanEval prompts in the model's chat format, up to 128 new tokens each, best of 1 rounds.\n" in text
    assert f"![{setting}](decode.png)" in text


def test_rerun_replaces_the_page(tmp_path):
    out = tmp_path / "page.md"
    main([str(write_run(tmp_path / "a")), "--out", str(out)])
    main([str(write_run(tmp_path / "b", {**RUN, "commit": "fedcba987654"})), "--out", str(out)])
    text = out.read_text()
    assert "fedcba987654" in text and "0123456789ab" not in text


def test_a_title_written_as_a_heading_heads_the_page_once(tmp_path):
    """mtp eval-task writes its results.md title as a Markdown heading: the page has one heading, not '# #'."""
    results = write_run(tmp_path / "run")
    (tmp_path / "run" / "results.md").write_text("# polynomial: last.ckpt, step 3\n\n| ops |\n|---|\n| 1 |\n")
    main([str(results), "--out", str(tmp_path / "page.md")])
    assert (tmp_path / "page.md").read_text().startswith("# polynomial: last.ckpt, step 3\n")


def test_results_without_provenance_are_refused():
    with pytest.raises(ValueError, match="lacks date, commit"):
        page({"results": []}, "t", "")


def test_missing_results_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="is not a file"):
        main([str(tmp_path / "none.json"), "--out", str(tmp_path / "p.md")])


def test_provenance_records_every_header_field():
    run = provenance(["model.gguf", "--hf"])
    assert set(run) == set(HEADER_FIELDS) | set(OPTIONAL_FIELDS) and all(run.values())
    assert run["command"].endswith("model.gguf --hf")


def test_the_header_shows_the_runs_peak_resident_memory_where_recorded():
    """The kernel's high-water mark when the results are written: it grows with what the process held, and a page of
    results recorded before it existed has no such row."""
    before = peak_resident_bytes()
    held = bytearray(256 * 2**20)  # 256 MiB touched
    held[::4096] = b"x" * len(held[::4096])
    assert peak_resident_bytes() >= before and peak_resident_bytes() >= 256 * 2**20
    run = provenance(["m"])
    gib = float(run["peak memory"].split()[0])
    assert gib >= 0.25 and run["peak memory"].endswith("GiB resident (the kernel's high-water mark)")
    assert f"| peak memory | {run['peak memory']} |" in header(run)
    assert "peak memory" not in header(RUN)
    del held


def test_the_commit_is_dirty_when_the_code_a_benchmark_runs_differs_not_the_docs(tmp_path, monkeypatch):
    """A page's commit names the code its figures came from: an edited doc leaves it clean, an edited module (or a
    config, or a script) marks it ``+dirty``; outside git it is ``unknown``."""
    import subprocess  # git itself, only here

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    for name in ("mtp/decode.py", "conf/train.yaml", "docs/page.md", "tests/test_x.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("a\n")
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "start")
    clean = git_commit(tmp_path)
    assert len(clean) == 12 and "+" not in clean
    (tmp_path / "docs/page.md").write_text("b\n")
    (tmp_path / "tests/test_x.py").write_text("b\n")
    assert git_commit(tmp_path) == clean
    for name in ("conf/train.yaml", "mtp/decode.py"):
        (tmp_path / name).write_text("b\n")
        assert git_commit(tmp_path) == git_commit(tmp_path / "docs") == clean + "+dirty"  # from a subfolder too
        (tmp_path / name).write_text("a\n")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # no checkout above it either
    assert git_commit(outside) == "unknown"


def test_results_name_the_commit_the_process_started_with(monkeypatch):
    """A long run's results name the code it imported: the commit read at the first call, not a later checkout."""
    from mtp.benchmarks import results_page

    results_page.code_commit.cache_clear()
    monkeypatch.setattr(results_page, "git_commit", lambda root: "0123456789ab")
    assert provenance([])["commit"] == "0123456789ab"
    monkeypatch.setattr(results_page, "git_commit", lambda root: "ba9876543210")  # the checkout moved on meanwhile
    assert provenance([])["commit"] == "0123456789ab"
    results_page.code_commit.cache_clear()


def test_a_sweeps_page_shows_the_largest_peak_of_its_runs():
    from pathlib import Path

    from mtp.benchmarks.sweep_runs import SweepRun
    from mtp.benchmarks.task_sweep import sweep_provenance

    def run(peak):
        recorded = {**RUN, **({"peak memory": peak} if peak else {})}
        return SweepRun(Path("j"), "s", 0, (), 1, {"provenance": recorded})

    mark = " GiB resident (the kernel's high-water mark)"
    runs = [run("0.9" + mark), run("10.2" + mark), run("2.5" + mark), run(None)]
    assert sweep_provenance(runs, "page")["peak memory"] == (
        "10.2 GiB resident (the kernel's high-water mark): the largest of the 3 of 4 runs that record it"
    )
    assert "peak memory" not in sweep_provenance([run(None)], "page")
