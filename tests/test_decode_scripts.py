"""scripts/decode.py and scripts/bench_decode.py as a user runs them, on tiny checkpoints made by the framework."""

import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mtp.benchmarks.decode_bench import benchmarked
from mtp.benchmarks.methods import BenchTarget
from mtp.checkpoint.format import read_checkpoint
from mtp.checkpoint.load import load_checkpoint
from mtp.decode.methods import heads, layer_skip
from mtp.decode.plan import Plan
from mtp.decode.settings import GenerationConfig, HeadsSettings
from mtp.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str):
    """The program behind scripts/<name>.py (its main(argv) raises UserError where the script prints one line)."""
    return importlib.import_module(f"mtp.commands.{name}")


def run_env() -> dict[str, str]:
    """The environment of a script run by a test: offline, importing the mtp of this tree (not another install)."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


decode = load_script("decode")


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "decode.py"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=run_env(),
        timeout=300,
    )


def stats_of(stdout: str) -> dict[str, str]:
    line = next(line for line in stdout.splitlines() if line.startswith("tokens="))
    return dict(item.split("=", 1) for item in line.split())


@pytest.mark.parametrize("preset", ["mtp4", "byte8"])
def test_greedy_compare_matches_and_prints_parseable_stats(tiny_checkpoints, preset, capsys):
    n = 4 if preset == "mtp4" else 8
    argv = [
        str(tiny_checkpoints[preset]),
        "--self-speculative",
        "--heads",
        str(n),
        "--compare",
        "--prompt",
        "def parse(",
    ]
    code = decode.main([*argv, "--max-new-tokens", "24"])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("def parse(")
    stats = stats_of(out)
    assert stats["heads"] == str(n) and len(stats["accept"].split(",")) == n - 1
    assert float(stats["tokens/forward"]) >= 1.0 and int(stats["forwards"]) >= 1 and float(stats["tokens/s"]) > 0
    assert float(stats["ms/forward"]) > 0 and float(stats["prefill_ms"]) > 0
    assert "outputs_match=yes" in out and "speedup=" in out


@pytest.mark.parametrize("fastest", [1, 3])
def test_without_heads_the_count_measured_fastest_drafts_and_says_so(
    tiny_checkpoints, tmp_path, capsys, monkeypatch, fastest
):
    """--self-speculative without --heads drafts with the count of heads of the most expected tokens per ms (the step
    times made up here, so that the choice does not hang on this machine's speed), says so on one stderr line, and
    decodes what autoregressive decoding does; --heads skips the choice; a stream chooses once."""
    timed = []

    def made_up(model, prompts, config, counts):
        timed.append(counts)
        return {k: 1.0 if k == fastest else 1000.0 for k in counts}

    monkeypatch.setattr(heads, "time_heads", made_up)
    checkpoint = str(tiny_checkpoints["mtp4"])
    argv = [checkpoint, "--self-speculative", "--compare", "--prompt", "def parse(", "--max-new-tokens", "24"]
    assert decode.main(argv) == 0
    out = capsys.readouterr()
    notes = [line for line in out.err.splitlines() if line.startswith("note: ")]
    assert timed == [[1, 2, 3, 4]] and len(notes) == 1
    assert f"(k={fastest})" in notes[0] and all(f"k={k} 1" in notes[0] for k in (1, 2, 3, 4))
    assert ("decoding autoregressively" in notes[0]) == (fastest == 1)
    stats = stats_of(out.out)
    assert stats["heads"] == str(fastest) and stats["method"] == ("none" if fastest == 1 else "heads")
    assert "outputs_match=yes" in out.out
    assert decode.main([*argv, "--heads", "2"]) == 0  # named: no choice
    out = capsys.readouterr()
    assert len(timed) == 1 and "note: " not in out.err and stats_of(out.out)["heads"] == "2"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def f("}\n{"prompt": "import "}\n')
    assert decode.main([checkpoint, "--self-speculative", "--prompts", str(prompts), "--max-new-tokens", "8"]) == 0
    err = capsys.readouterr().err
    assert len(timed) == 2 and err.count("note: ") == 1 and "measured on the stream's first prompt" in err


def test_the_count_measured_fastest_is_the_one_that_decodes(tiny_checkpoints, capsys):
    argv = [str(tiny_checkpoints["mtp4"]), "--self-speculative", "--compare", "--prompt", "def f(", "--max-new-tokens"]
    assert decode.main([*argv, "16"]) == 0
    out = capsys.readouterr()
    chosen = re.search(r"^note: .*\(k=(\d+)\)", out.err, re.MULTILINE)
    assert chosen and stats_of(out.out)["heads"] == chosen.group(1) and "outputs_match=yes" in out.out


@pytest.mark.slow
@pytest.mark.compiled_by_default
def test_decoding_compiles_on_a_cpu_by_default_and_prints_what_eager_decoding_prints(tiny_checkpoints, capsys):
    argv = [str(tiny_checkpoints["mtp4"]), "--self-speculative", "--prompt", "def parse(", "--max-new-tokens", "16"]
    assert decode.main([*argv, "--no-compile"]) == 0
    eager = capsys.readouterr()
    assert "compiled" not in eager.err
    assert decode.main([*argv, "--compare"]) == 0  # compiled: the default on a CPU, both decodes warmed up
    compiled = capsys.readouterr()
    assert compiled.out.splitlines()[0] == eager.out.splitlines()[0]  # the completion
    assert "outputs_match=yes" in compiled.out and float(stats_of(compiled.out)["ms/forward"]) > 0
    assert compiled.err.count("compiled the decoding step in ") == 1  # said once, outside the timed decode


def test_decode_warms_its_steps_up_before_the_timed_decodes(tiny_checkpoints, monkeypatch, capsys):
    decoded = []
    real = decode.generate

    def recorded(model, prompts, plan):
        decoded.append(plan.sampling.max_new_tokens)
        return real(model, prompts, plan)

    monkeypatch.setattr(decode, "generate", recorded)
    argv = [str(tiny_checkpoints["mtp4"]), "--self-speculative", "--heads", "4", "--prompt", "def f("]
    assert decode.main([*argv, "--compare", "--max-new-tokens", "12"]) == 0
    assert decoded == [2, 2, 12, 12]  # both plans warmed up (2 tokens each), then both timed
    assert "outputs_match=yes" in capsys.readouterr().out


@pytest.mark.compiled_by_default
def test_the_commands_compile_a_cpus_step_unless_told_not_to_and_a_cuda_step_when_told_to():
    from mtp.commands.schema import compiled

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert compiled(None, cpu) and not compiled(None, cuda)
    assert not compiled(False, cpu) and compiled(True, cuda) and compiled(True, cpu) and not compiled(False, cuda)
    parser = decode.build_parser()
    assert parser.parse_args(["x"]).compile is None  # neither flag: the device decides
    assert parser.parse_args(["x", "--no-compile"]).compile is False


def test_sampling_batch_and_byte_output_never_crash(tiny_checkpoints, capsys):
    args = ["--self-speculative", "--temperature", "1.5", "--top-k", "50", "--top-p", "0.95", "--batch-size", "3"]
    assert decode.main([str(tiny_checkpoints["byte8"]), *args, "--prompt", "é", "--max-new-tokens", "40"]) == 0
    out = capsys.readouterr().out
    assert out.count("--- row ") == 3 and stats_of(out)["batch"] == "3"


def test_autoregressive_by_default_and_prompt_from_stdin(tiny_checkpoints):
    result = cli(str(tiny_checkpoints["mtp4"]), "--max-new-tokens", "5", "--no-compile", stdin="import os\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("import os\n") and stats_of(result.stdout)["heads"] == "1"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--self-speculative", "--heads", "5"],
            "--heads 5 exceeds this checkpoint's 4 head(s); only eagle3 heads and causal heads trained with "
            "model.share_depth=true draft beyond them; use --heads 1..4.",
        ),
        (["--self-speculative", "--heads", "0"], "--heads 0 must be at least 1"),
        (["--heads", "2"], "add --self-speculative"),
        (["--max-new-tokens", "0"], "--max-new-tokens 0 must be at least 1"),
        (["--temperature", "-1"], "--temperature -1 must be 0"),
        (["--top-p", "0"], "--top-p 0 must lie in (0, 1]"),
        (["--top-p", "1.5"], "--top-p 1.5 must lie in (0, 1]"),
        (["--top-k", "-2"], "--top-k -2 must be 0"),
        (["--device", "cuda"], "no CUDA device"),
        (["--prompt-file", "/nonexistent/prompt.txt"], "does not exist"),
        (["--max-new-tokens", "5000"], "does not fit the model's context"),
        (["--self-speculative", "--draft-p-min", "1.5"], "--draft-p-min 1.5 must lie in [0, 1]"),
        (["--self-speculative", "--draft-p-min", "-0.1"], "--draft-p-min -0.1 must lie in [0, 1]"),
        (["--tree", "auto"], "--tree drafts with extra heads; add --self-speculative"),
        (["--self-speculative", "--tree", "auto", "--adaptive-drafts"], "--adaptive-drafts sizes chains"),
        (["--self-speculative", "--tree", "/nonexistent/tree.json"], "does not exist"),
        (["--self-speculative", "--tree-nodes", "0", "--tree", "auto"], "--tree-nodes 0 must be at least 1"),
        (["--draft", "/nonexistent/draft.ckpt"], "--draft: checkpoint /nonexistent/draft.ckpt does not exist"),
        (["--prompt-lookup", "2", "--gamma", "0"], "--gamma 0 must be at least 1"),
        (["--prompt-lookup", "0"], "--prompt-lookup 0 must be at least 1"),
        (["--skip-layers", "6"], "--skip-layers 6 must name some but not all of the 6 blocks of head 1's path (0..5"),
        (["--skip-layers", "0,1,2,3,4,5"], "must name some but not all of the 6 blocks"),
        (["--skip-layers", "two"], "--skip-layers 'two' must be blocks such as 2,4,5, sublayers such as 3a,5m"),
        (["--skip-layers", "6a"], "--skip-layers 6a must name some but not all of the 6 blocks of head 1's path"),
        (["--skip-layers", "0,1,2,3,4,5a,5m"], "must name some but not all of the 6 blocks"),
        (["--skip-layers", "1,2", "--skip-sublayers"], "--skip-sublayers chooses how --skip-layers auto searches"),
        (["--skip-layers", "auto", "--search-trials", "0"], "--search-trials 0 must be at least 1"),
        (
            ["--skip-layers", "1", "--self-speculative", "--tree", "auto"],
            "--gamma 4 drafts come from a drafter, which drafts chains, not a --tree of the heads' candidates",
        ),
        (["--prompt-lookup", "2", "--draft-p-min", "0.3"], "--gamma 4 drafts come from a drafter"),
        (["--staged", "lookup"], "--staged decodes a draft model speculatively; give it with --draft DRAFT.ckpt."),
        (["--self-speculative", "--drafts-per-step", "0"], "--drafts-per-step 0 must be at least 1."),
        (["--drafts-per-step", "2"], "--drafts-per-step 2 needs drafts: use --heads above 1 or a drafter."),
        (["--skip-layers", "1", "--self-speculative", "--temperature", "1", "--acceptance", "spectr"], "mixes two"),
        (["--prompt-lookup", "2", "--drafts-per-step", "2"], "prompt lookup drafts one continuation per row"),
        (["--self-speculative", "--acceptance", "typical", "--typical-delta", "-1"], "--typical-delta -1 must be at"),
        (["--draft-dtype", "int8"], "--draft-dtype int8 quantizes the drafts, but --heads 1 without a drafter"),
        (
            ["--self-speculative", "--draft-first-ids", "100000"],
            "--draft-first-ids 100000 must be below the vocabulary's",
        ),
        (
            ["--self-speculative", "--draft-first-ids", "-3"],
            "--draft-first-ids -3 must be 0 (every token) or positive.",
        ),
        (["--prompt-lookup", "2", "--draft-dtype", "int8"], "prompt lookup drafts without a model; leave --draft"),
        (
            ["--self-speculative", "--quantize", "int8", "--draft-dtype", "int8"],
            "--quantize int8 quantizes every matrix, the drafts' included, and --draft-dtype int8 quantizes the drafts "
            "alone; leave --draft-dtype auto with it.",
        ),
    ],
)
def test_bad_flags_are_one_sentence(tiny_checkpoints, args, message):
    if "--device" in args and __import__("torch").cuda.is_available():
        pytest.skip("this machine has CUDA")
    argv = [str(tiny_checkpoints["mtp4"]), *args]
    if "--prompt-file" not in args:
        argv += ["--prompt", "x = 1"]
    with pytest.raises(UserError, match=__import__("re").escape(message)):
        decode.main(argv)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "is not valid JSON"),
        ('{"paths": [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]}', "reaches depth 4 but the model drafts at most 3"),
        ('{"paths": [[0], [99999]]}', "names candidate rank 99999 but the vocabulary has"),
    ],
)
def test_bad_tree_files_are_one_sentence(tiny_checkpoints, tmp_path, text, message):
    tree = tmp_path / "tree.json"
    tree.write_text(text)
    with pytest.raises(UserError, match=__import__("re").escape(message)):
        decode.main([str(tiny_checkpoints["mtp4"]), "--self-speculative", "--tree", str(tree), "--prompt", "x"])


def test_a_tree_node_budget_neither_a_count_nor_fastest_exits_2(tiny_checkpoints, capsys):
    with pytest.raises(SystemExit) as exit_:
        decode.main([str(tiny_checkpoints["mtp4"]), "--self-speculative", "--tree", "auto", "--tree-nodes", "many"])
    assert exit_.value.code == 2 and "'many' is neither a node count nor fastest" in capsys.readouterr().err
    bench = load_script("bench_decode")
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args([str(tiny_checkpoints["mtp4"]), "--tree-nodes", "fastest,0"])
    assert exit_.value.code == 2 and "node counts (positive integers) or fastest" in capsys.readouterr().err
    assert bench.parse_args([str(tiny_checkpoints["mtp4"]), "--tree-nodes", "fastest,8"]).tree_nodes == ["fastest", 8]


def test_unknown_acceptance_rule_exits_2(tiny_checkpoints, capsys):
    with pytest.raises(SystemExit) as exit_:
        decode.main([str(tiny_checkpoints["mtp4"]), "--self-speculative", "--acceptance", "lenient", "--prompt", "x"])
    assert exit_.value.code == 2 and "invalid choice: 'lenient'" in capsys.readouterr().err


@pytest.mark.slow  # ~5 s; tests/decode/test_tree.py holds the tree's exactness everyday
def test_tree_decoding_fitted_now_or_from_fit_tree_equals_autoregressive(tiny_checkpoints, tmp_path, capsys):
    checkpoint = str(tiny_checkpoints["mtp4"])
    argv = [checkpoint, "--self-speculative", "--compare", "--prompt", "def f(", "--max-new-tokens", "24"]
    assert decode.main([*argv, "--tree", "auto", "--tree-nodes", "6"]) == 0
    out = capsys.readouterr()
    assert "outputs_match=yes" in out.out and "fitted a" in out.err
    assert 1 <= int(stats_of(out.out)["tree_nodes"]) <= 6
    assert decode.main([*argv, "--tree", "auto"]) == 0  # the fastest size on this machine: a tree, or the chain
    out = capsys.readouterr()
    assert "outputs_match=yes" in out.out and "the fastest here of expected tokens per ms by size (1: " in out.err
    chain = "the heads' chain without a tree" in out.err and "faster than any tree" in out.err
    assert (int(stats_of(out.out)["tree_nodes"]) == 0) == chain
    fit_tree = load_script("fit_tree")
    tree = tmp_path / "tree.json"
    assert (
        fit_tree.main([checkpoint, "--nodes", "5", "--prompts", "2", "--max-new-tokens", "16", "--out", str(tree)]) == 0
    )
    paths = json.loads(tree.read_text())["paths"]
    assert 1 <= len(paths) <= 5 and all(len(p) <= 3 for p in paths)
    assert decode.main([*argv, "--tree", str(tree)]) == 0
    assert "outputs_match=yes" in capsys.readouterr().out
    sampling = ["--temperature", "0.8", "--top-p", "0.95", "--acceptance", "typical", "--batch-size", "2"]
    assert decode.main([*argv, "--tree", str(tree), *sampling]) == 0
    assert "acceptance=typical(lossy)" in capsys.readouterr().out


@pytest.mark.slow  # ~7 s; tests/decode/test_drafters.py holds each drafter's exactness everyday
def test_every_drafter_decodes_what_autoregressive_decoding_does(tiny_checkpoints, capsys, monkeypatch):
    monkeypatch.setattr(layer_skip, "SEARCH_PROMPTS", 1)  # a short --skip-layers auto search
    monkeypatch.setattr(layer_skip, "SEARCH_NEW_TOKENS", 8)
    checkpoint = str(tiny_checkpoints["mtp4"])
    argv = [checkpoint, "--compare", "--prompt", "def f(", "--max-new-tokens", "24", "--gamma", "3"]
    for drafting, method in (
        (["--draft", checkpoint], "draft"),  # the checkpoint drafting for itself: it accepts every draft
        (["--skip-layers", "auto", "--adaptive-drafts"], "layerskip"),
        (["--skip-layers", "auto", "--skip-sublayers", "--search-trials", "4"], "layerskip"),
        (["--skip-layers", "0a,1m,3"], "layerskip"),
        (["--prompt-lookup", "2", "--batch-size", "2"], "lookup"),
        (["--prompt-lookup", "2", "--self-speculative"], "hybrid"),  # lookup's chain beside the heads'
    ):
        if "--skip-sublayers" in drafting and importlib.util.find_spec("optuna") is None:
            continue  # the sublayer search needs the search extra (CI installs it)
        assert decode.main([*argv, *drafting]) == 0
        out = capsys.readouterr()
        stats = stats_of(out.out)
        assert "outputs_match=yes" in out.out and stats["method"] == method and stats["gamma"] == "3", drafting
        assert 0 <= float(stats["draft_share"]) < 1
        if method == "draft":
            assert stats["accept"] == "1.000,1.000,1.000"
        if "auto" in drafting:  # the search's set, found over blocks or sublayers
            assert "skip-layers search" in out.err and stats["skip"] and stats["search"] in out.err
            assert stats["search"] == ("sublayers" if "--skip-sublayers" in drafting else "blocks")
        elif method == "layerskip":
            assert stats["skip"] == "0a,1m,3" and "search" not in stats
    sampling = ["--temperature", "0.8", "--top-p", "0.95", "--batch-size", "2"]
    assert decode.main([*argv, "--prompt-lookup", "3", *sampling]) == 0


def test_int8_drafts_decode_what_autoregressive_decoding_does(tiny_checkpoints, capsys):
    checkpoint = str(tiny_checkpoints["mtp4"])
    argv = [checkpoint, "--compare", "--prompt", "def f(", "--max-new-tokens", "24", "--draft-dtype", "int8"]
    for drafting, method in (
        (["--self-speculative", "--batch-size", "2"], "heads"),
        (["--draft", checkpoint, "--gamma", "3"], "draft"),
        (["--skip-layers", "1", "--gamma", "3"], "layerskip"),
    ):
        assert decode.main([*argv, *drafting]) == 0
        out = capsys.readouterr().out
        stats = stats_of(out)
        assert "outputs_match=yes" in out and stats["method"] == method, drafting
        assert 0 < float(stats["draft_share"]) < 1


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_quantized_targets_decode_what_their_own_autoregressive_decoding_does(tiny_checkpoints, precision, capsys):
    checkpoint = str(tiny_checkpoints["mtp4"])
    argv = [checkpoint, "--compare", "--prompt", "def f(", "--max-new-tokens", "24", "--quantize", precision]
    for drafting, method in ((["--self-speculative"], "heads"), (["--draft", checkpoint, "--gamma", "3"], "draft")):
        assert decode.main([*argv, *drafting]) == 0
        out = capsys.readouterr().out
        stats = stats_of(out)
        assert "outputs_match=yes" in out and stats["method"] == method and stats["quantize"] == precision, drafting
        assert re.search(r"float_outputs_match=(yes|no)", out), out  # measured against the float weights, not assumed


def test_a_draft_on_another_tokenizer_is_refused(tiny_checkpoints, tmp_path):
    target = str(tiny_checkpoints["mtp4"])
    with pytest.raises(UserError) as refused:  # the library names the fields; the command the training overrides
        decode.main([target, "--draft", str(tiny_checkpoints["byte8"]), "--prompt", "x"])
    assert str(refused.value) == (
        f"--draft {tiny_checkpoints['byte8']} has a different tokenizer from the target's; train the draft on the "
        "target's tokenizer (data.tokenizer.kind=pretrained data.tokenizer.path=TARGET.ckpt)."
    )
    garbage = tmp_path / "draft.ckpt"
    garbage.write_bytes(b"\x00" * 64)
    with pytest.raises(UserError, match="--draft: checkpoint .* is truncated or not a PyTorch checkpoint"):
        decode.main([target, "--draft", str(garbage), "--prompt", "x"])


def test_empty_prompt(tiny_checkpoints):
    with pytest.raises(UserError, match="the prompt is empty"):
        decode.main([str(tiny_checkpoints["mtp4"]), "--prompt", ""])


def test_bad_checkpoints_are_one_sentence(tmp_path):
    truncated = tmp_path / "cut.ckpt"
    truncated.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(UserError, match="none.ckpt does not exist"):
        decode.main([str(tmp_path / "none.ckpt"), "--prompt", "x"])
    with pytest.raises(UserError, match="truncated or not a PyTorch"):
        decode.main([str(truncated), "--prompt", "x"])


@pytest.mark.slow  # a second process start of decode.py (~6 s): the everyday suite keeps one
def test_a_missing_checkpoint_exits_2_without_traceback(tmp_path):
    result = cli(str(tmp_path / "none.ckpt"), "--prompt", "x")  # as a user sees it
    assert result.returncode == 2 and "does not exist" in result.stderr and "Traceback" not in result.stderr


DRAFTED = [("draft", 2), ("layerskip", 2), ("lookup", 2)]


def r_key(row: dict) -> tuple[str, int]:
    return row["mode"], row["batch_size"]


@pytest.mark.slow  # ~13 s, every method's rows; the captured-steps bench test runs bench_decode everyday
def test_bench_decode_writes_results(tiny_checkpoints, tmp_path):
    out = tmp_path / "bench"
    command = [sys.executable, str(ROOT / "scripts" / "bench_decode.py"), str(tiny_checkpoints["mtp4"])]
    command += ["--prompts", "2", "--prompt-tokens", "8", "--max-new-tokens", "8", "--batch-sizes", "1,2"]
    command += ["--no-compile"]  # a subprocess: the tests' eager default does not reach it
    command += ["--methods", "tree,typical,adaptive,draft,layerskip,lookup", "--tree-nodes", "4", "--repeats", "1"]
    command += [
        "--draft",
        str(tiny_checkpoints["mtp4"]),
        "--gammas",
        "2",
        "--skip-layers",
        "1,2",
        "0a,2m",
        "--gamma",
        "2",
    ]
    result = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True, env=run_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads((out / "results.json").read_text())["results"]
    chains = {(mode, b, "chain", k) for mode in ("greedy", "sampling") for b in (1, 2) for k in range(1, 5)}
    others = {(mode, b, m, 4) for mode in ("greedy", "sampling") for b in (1, 2) for m in ("tree", "adaptive")}
    typical = {("sampling", b, "typical", 4) for b in (1, 2)}  # lossy, so sampling only
    drafted = {(mode, b, m, 1, g) for mode in ("greedy", "sampling") for b in (1, 2) for m, g in DRAFTED}
    settings = {(r["mode"], r["batch_size"], r["method"], r["heads"], r["gamma"]) for r in rows}
    assert settings == {(*s, 0) for s in chains | others | typical} | drafted
    assert all(1 <= r["tree_nodes"] <= 4 for r in rows if r["method"] in ("tree", "typical"))
    assert all(r["lossy"] == (r["method"] == "typical") for r in rows)  # labelled so in the table
    assert "lossy)" in (out / "results.md").read_text()
    skip_sets = [
        r["drafter"]["skip"] for r in rows if (r["mode"], r["batch_size"], r["method"]) == ("greedy", 1, "layerskip")
    ]
    assert skip_sets == ["1,2", "0a,2m"]  # a row per set, whole blocks and sublayers
    for r in rows:
        assert r["speedup"] > 0 and r["tokens_per_forward"] >= 1
        assert len(r["acceptance"]) == (r["gamma"] or r["heads"] - 1)
        if r["method"] == "draft":  # the checkpoint drafting for itself: every draft passes; then the formula is
            # (g + 1) / (g c + 1), c the draft forward's time over the autoregressive step's
            base = next(b for b in rows if (*r_key(b), b["heads"], b["method"]) == (*r_key(r), 1, "chain"))
            g, c = r["gamma"], r["draft_ms_per_forward"] / base["ms_per_forward"]
            assert r["acceptance_rate"] == 1.0 and abs(r["predicted_speedup"] - (g + 1) / (g * c + 1)) < 1e-6
        assert r["ms_per_forward"] > 0 and r["forward_cost"] > 0
        if r["heads"] == 1 and r["method"] == "chain":
            assert r["speedup"] == 1.0 and r["forward_cost"] == 1.0
    assert "| mode | batch | method | k | tokens/forward |" in (out / "results.md").read_text()
    assert (out / "decode.png").read_bytes()[:4] == b"\x89PNG"


def small_bench(checkpoint: Path, out: Path, *flags: str) -> list[dict]:
    """bench_decode on 2 prompts of 8 tokens, 8 new tokens, batch 1, one round, heads 3 and ``flags``: its rows."""
    command = [sys.executable, str(ROOT / "scripts" / "bench_decode.py"), str(checkpoint), "--no-compile"]
    command += ["--prompts", "2", "--prompt-tokens", "8", "--max-new-tokens", "8", "--batch-sizes", "1"]
    command += ["--heads", "3", "--repeats", "1", "--draft", str(checkpoint), "--gammas", "2", "--gamma", "2"]
    result = subprocess.run(
        [*command, *flags, "--out", str(out)], capture_output=True, text=True, env=run_env(), timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads((out / "results.json").read_text())["results"]


@pytest.mark.slow
def test_bench_decode_puts_int8_drafts_beside_float_ones(tiny_checkpoints, tmp_path):
    out = tmp_path / "bench"
    flags = ["--modes", "greedy", "--methods", "draft,layerskip,lookup", "--skip-layers", "1,2"]
    rows = small_bench(tiny_checkpoints["mtp4"], out, *flags, "--draft-dtypes", "auto,int8")
    settings = [(r["method"], r["heads"], r["draft_dtype"]) for r in rows]
    float_rows = [("chain", 1), ("chain", 3), ("draft", 1), ("layerskip", 1), ("lookup", 1)]
    int8_rows = [("chain", 3), ("draft", 1), ("layerskip", 1)]  # not k=1, which drafts nothing; not lookup, no model
    assert sorted(settings) == sorted([(*s, "auto") for s in float_rows] + [(*s, "int8") for s in int8_rows])
    for r in rows:
        assert r["identical_outputs"] == r["prompts"] == 2  # greedy, so exact whatever the drafts' dtype
        if r["draft_dtype"] == "int8":
            assert r["draft_time_vs_auto"] > 0 and r["draft_ms_per_step"] > 0
    table = (out / "results.md").read_text()
    assert "| draft ms/step |" in table and "chain (int8 drafts)" in table
    assert "layerskip (gamma 2, skip 1,2, int8 drafts)" in table


@pytest.mark.slow
def test_bench_decode_puts_top_ranked_drafts_beside_sampled_ones(tiny_checkpoints, tmp_path):
    out = tmp_path / "bench"
    flags = ["--modes", "greedy,sampling", "--methods", "draft,spectr,lookup", "--sequences", "2"]
    rows = small_bench(tiny_checkpoints["mtp4"], out, *flags, "--draft-choices", "auto,sampled,top")
    for choice in ("top", "sampled"):
        twins = sorted((r["mode"], r["method"], r["heads"]) for r in rows if r["draft_choice"] == choice)
        # sampling only; not k=1 (no drafts), SpecTr (i.i.d. samples) or lookup (top-ranked already)
        assert twins == [("sampling", "chain", 3), ("sampling", "draft", 1)], choice
    table = (out / "results.md").read_text()
    assert (
        "chain (top drafts)" in table and "draft (gamma 2, top drafts)" in table and "chain (sampled drafts)" in table
    )


@pytest.mark.slow
def test_bench_decode_puts_drafts_over_the_first_token_ids_beside_the_full_vocabulary(tiny_checkpoints, tmp_path):
    out = tmp_path / "bench"
    rows = small_bench(tiny_checkpoints["mtp4"], out, "--modes", "greedy", "--draft-first-ids", "0,16")
    settings = sorted((r["method"], r["heads"], r["draft_first_ids"]) for r in rows)
    assert settings == [("chain", 1, 0), ("chain", 3, 0), ("chain", 3, 16)]  # k=1 drafts nothing: no twin
    assert all(r["identical_outputs"] == r["prompts"] == 2 for r in rows)  # greedy: exact whatever the drafts score
    assert "chain (drafts over the first 16 ids)" in (out / "results.md").read_text()


@pytest.mark.slow
def test_bench_decode_puts_quantized_targets_beside_float_ones_and_counts_their_agreement(tiny_checkpoints, tmp_path):
    out = tmp_path / "bench"
    flags = ["--modes", "greedy", "--methods", "draft", "--quantize", "none,int8,int4"]
    rows = small_bench(tiny_checkpoints["mtp4"], out, *flags)
    settings = sorted((r["method"], r["heads"], r["quantize"]) for r in rows)
    assert settings == sorted((m, k, q) for q in ("none", "int8", "int4") for m, k in (("chain", 1), ("chain", 3),
                              ("draft", 1)))  # fmt: skip
    for r in rows:
        assert r["identical_outputs"] == r["prompts"] == 2  # greedy: exact against its own precision's k=1
        assert ("identical_to_float" in r) == (r["quantize"] != "none")  # measured against float k=1, not assumed
        if r["quantize"] != "none":
            assert 0 <= r["identical_to_float"] <= 2
        if (r["method"], r["heads"]) == ("chain", 1):
            assert r["speedup"] == 1.0  # its own precision's autoregressive decoding is the baseline
    table = (out / "results.md").read_text()
    assert "| same tokens as float k=1 |" in table and "chain (int4 weights)" in table
    assert "draft (gamma 2, int8 weights)" in table


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("int8", "--quantize int8: none (the baseline rows) and any of int8, int4."),
        ("none,int3", "--quantize none,int3: none (the baseline rows) and any of int8, int4."),
    ],
)
def test_bench_decode_refuses_precisions_without_the_baseline_or_unknown(tiny_checkpoints, given, message):
    bench = load_script("bench_decode")
    with pytest.raises(UserError, match=re.escape(message)):
        bench.checked_args([str(tiny_checkpoints["mtp4"]), "--quantize", given])


@pytest.mark.parametrize("given", ["1024", "0,-5", "0,many"])
def test_bench_decode_refuses_draft_vocabularies_without_the_baseline_or_not_counts(tiny_checkpoints, given, capsys):
    bench = load_script("bench_decode")
    refused = f"--draft-first-ids {given}: 0 (every token: the baseline rows) and any token counts"
    with pytest.raises(UserError, match=re.escape(refused)):
        bench.checked_args([str(tiny_checkpoints["mtp4"]), "--draft-first-ids", given])


def test_bench_decode_refuses_the_static_cache_row_without_the_hf_comparison(tiny_checkpoints, capsys):
    bench = load_script("bench_decode")
    with pytest.raises(UserError, match="--hf-static adds a row to the Hugging Face comparison; add --hf"):
        bench.checked_args([str(tiny_checkpoints["mtp4"]), "--hf-static"])


def test_bench_decode_refuses_a_draft_vocabulary_beyond_the_models(tiny_checkpoints, tmp_path):
    bench = load_script("bench_decode")
    argv = [str(tiny_checkpoints["mtp4"]), "--draft-first-ids", "0,100000", "--prompts", "1", "--prompt-tokens", "8"]
    with pytest.raises(UserError, match=r"--draft-first-ids 100000: each must be below the vocabulary's \d+ tokens\."):
        bench.main([*argv, "--out", str(tmp_path / "out")])
    assert not any((tmp_path / "out").iterdir())  # nothing written (the folder is made first: an unwritable one fails)


@pytest.mark.slow
def test_bench_decode_layer_skip_rows_of_both_searches(tiny_checkpoints, monkeypatch):
    """--skip-layers auto --skip-sublayers: a layerskip row for the block search's set and one for the sublayer
    search's, per mode, each saying which search found it."""
    pytest.importorskip("optuna", reason="the sublayer search needs the search extra: pip install -e '.[search]'")
    monkeypatch.setattr(layer_skip, "SEARCH_PROMPTS", 1)  # short searches
    monkeypatch.setattr(layer_skip, "SEARCH_NEW_TOKENS", 8)
    bench = load_script("bench_decode")
    args = bench.checked_args(
        [str(tiny_checkpoints["mtp4"]), "--methods", "layerskip", "--skip-layers", "auto", "3a", "--skip-sublayers"]
        + ["--search-trials", "3", "--gamma", "2"]
    )
    loaded = load_checkpoint(args.checkpoint, torch.device("cpu"), "float32")
    chain = Plan(GenerationConfig(8), heads=HeadsSettings(heads=4))
    (method,) = benchmarked(args)
    rows = method.rows(BenchTarget.of(loaded, chain, torch.device("cpu"), gamma=args.gamma), "greedy", args.methods)
    params = [row.plan.drafter.params() for row in rows if row.label == "layerskip"]
    assert [p.get("search") for p in params] == ["blocks", "sublayers", None] and params[2]["skip"] == "3a"
    assert all(row.plan.drafter.gamma == 2 and row.plan.heads.heads == 1 for row in rows)
    with pytest.raises(UserError, match="--skip-sublayers chooses how --skip-layers auto searches"):
        bench.checked_args(
            [str(tiny_checkpoints["mtp4"]), "--methods", "layerskip", "--skip-layers", "3a", "--skip-sublayers"]
        )
    with pytest.raises(UserError, match="--skip-sublayers chooses how --skip-layers auto searches"):
        bench.checked_args([str(tiny_checkpoints["mtp4"]), "--skip-sublayers"])  # no layerskip rows to search for


@pytest.mark.slow
def test_bench_decode_hf_peer_decodes_the_same_tokens(tiny_checkpoints, tmp_path):
    pytest.importorskip("transformers", reason="--hf needs the hf extra: pip install -e '.[hf]'")
    out = tmp_path / "bench"
    command = [sys.executable, str(ROOT / "scripts" / "bench_decode.py"), str(tiny_checkpoints["mtp4"]), "--hf"]
    command += ["--no-compile"]
    command += ["--prompts", "2", "--prompt-tokens", "8", "--max-new-tokens", "8", "--batch-sizes", "1"]
    command += ["--modes", "greedy", "--repeats", "1", "--out", str(out)]
    result = subprocess.run([*command, "--hf-static"], capture_output=True, text=True, env=run_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    peer = json.loads((out / "results.json").read_text())["hf"]
    assert peer["hf_generate_tokens_per_s"] > 0 and peer["hf_prompt_lookup_tokens_per_s"] > 0
    assert peer["greedy_outputs_differ"] == [] and peer["prompt_lookup_equals_hf_greedy"]  # the same function
    # HF's static cache (compiled on CUDA only) decodes the same tokens, its warm-up timed apart
    assert peer["hf_static_checks"]["identical_outputs"] == 2 and not peer["hf_static_compiled"]
    assert peer["hf_static_tokens_per_s"] > 0 and peer["hf_static_warmup_s"] > 0
    page = (out / "results.md").read_text()
    assert "| HF generate |" in page and "| HF generate, static cache |" in page and "its static cache |" in page
    without_greedy = subprocess.run(
        [*command[:-4], "--modes", "sampling", "--out", str(out)],
        capture_output=True,
        text=True,
        env=run_env(),
        timeout=300,
    )
    assert without_greedy.returncode == 2 and "--hf compares with greedy decoding at batch size 1" in (
        without_greedy.stderr
    )


def test_the_peer_table_has_a_self_speculative_row_only_for_a_model_with_heads():
    """A model without heads (a GGUF as it is) has k=1 only: its "self-speculative" row would be the autoregressive
    one again under another name; mtp's prompt lookup is then the row beside HF's prompt lookup."""
    from mtp.benchmarks.hf_peer import peer_table

    checks = {"prompts": 4, "identical_outputs": 4}
    peer = {
        "hf_generate_tokens_per_s": 8.0,
        "hf_prompt_lookup_tokens_per_s": 10.0,
        "mtp_autoregressive_tokens_per_s": 12.0,
        "mtp_self_speculative_heads": 1,
        "mtp_self_speculative_tokens_per_s": 12.0,
        "prompt_lookup_equals_hf_greedy": True,
        "prompts": 4,
        "greedy_outputs_differ": [],
        **{f"{name}_checks": checks for name in ("hf_generate", "hf_prompt_lookup", "mtp_autoregressive")},
        "mtp_self_speculative_checks": checks,
    }
    table = peer_table(peer)
    assert "self-speculative" not in table and "mtp prompt lookup" not in table
    assert "| mtp autoregressive (k=1) | 12.0 | 1.50x HF generate | 4/4 |" in table
    with_lookup = peer_table(
        {
            **peer,
            "mtp_prompt_lookup_gamma": 4,
            "mtp_prompt_lookup_tokens_per_s": 5.0,
            "mtp_prompt_lookup_checks": checks,
        }
    )
    assert "| mtp prompt lookup (gamma 4) | 5.0 | 0.50x HF prompt lookup | 4/4 |" in with_lookup
    with_heads = peer_table({**peer, "mtp_self_speculative_heads": 4, "mtp_self_speculative_tokens_per_s": 20.0})
    assert "| mtp self-speculative (k=4) | 20.0 | 2.00x HF prompt lookup | 4/4 |" in with_heads
    static = {"hf_static_tokens_per_s": 24.0, "hf_static_warmup_s": 31.5, "hf_static_compiled": True}
    with_static = peer_table({**peer, **static, "hf_static_checks": checks})
    assert "| HF generate, static cache, compiled | 24.0 | | 4/4 |" in with_static
    assert "| mtp autoregressive (k=1) | 12.0 | 1.50x HF generate, 0.50x its static cache, compiled | 4/4 |" in (
        with_static
    )
    assert "its warm-up (the longest prompt, compiled) took 31.5 s, outside its rate." in with_static


@pytest.mark.slow
def test_compare_heads_writes_one_row_per_checkpoint(tiny_checkpoints, tmp_path):
    compare_heads = load_script("compare_heads")
    paths = [tiny_checkpoints["mtp4"], tiny_checkpoints["byte8"]]
    small = ["--prompts", "1", "--prompt-tokens", "8", "--max-new-tokens", "6", "--repeats", "1"]
    compare_heads.main([*map(str, paths), *small, "--train-steps", "1", "--seq-len", "16", "--batch-size", "2",
                        "--out", str(tmp_path)])  # fmt: skip
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    assert [r["n_future"] for r in results] == [4, 8]
    for row in results:
        assert row["validation"]["val/loss_head1"] > 0  # read back from the run's TensorBoard log
        assert len(row["greedy"]["acceptance"]) == row["n_future"] - 1
        assert row["train"]["status"] == "ok" and row["train"]["head_type"] == "transformer"
    assert (tmp_path / "heads.png").stat().st_size > 0
    assert (tmp_path / "results.md").read_text().count("| transformer |") == 2


@pytest.mark.parametrize(
    ("model", "loss"),
    [
        ({"head_type": "causal", "share_depth": True}, {"causal_inputs": "drafts"}),
        ({"head_type": "medusa", "medusa_layers": 2}, {}),
        ({"head_type": "transformer"}, {"loss_chunk": 8, "head_loss": "distill"}),
    ],
)
def test_compare_heads_times_the_checkpoints_own_model(model, loss):
    """The training step compare_heads times is the checkpoint's model and loss, every setting of them, not ones
    rebuilt from a few fields (a shared causal depth or a second medusa layer changes the parameters)."""
    import torch

    from mtp.model import MTPModel
    from mtp.model.config import ModelConfig
    from mtp.training.loss_config import LossConfig

    compare_heads = load_script("compare_heads")
    config = ModelConfig(vocab_size=64, d_model=32, n_layers=6, n_heads=4, n_kv_heads=2, max_seq_len=64, **model)
    flags = compare_heads.parse_args(["x.ckpt", "--seq-len", "16", "--batch-size", "2", "--train-steps", "1"])
    spec = compare_heads.step_spec(config, LossConfig(**loss), flags, torch.device("cpu"))
    timed = spec.model_config()
    assert timed.max_seq_len == 16 and spec.loss == LossConfig(**loss)
    shapes = [{name: value.shape for name, value in MTPModel(c).state_dict().items()} for c in (timed, config)]
    assert shapes[0] == shapes[1]


def test_compare_heads_reads_each_checkpoint_once_before_comparing(tiny_checkpoints, tmp_path, monkeypatch):
    compare_heads = load_script("compare_heads")
    reads = []
    monkeypatch.setattr(compare_heads, "read_checkpoint", lambda path: reads.append(path) or read_checkpoint(path))

    class Compared(Exception):
        pass

    def compare(*args):
        raise Compared

    monkeypatch.setattr(compare_heads, "compare", compare)
    paths = [str(tiny_checkpoints["mtp4"]), str(tiny_checkpoints["byte8"])]
    with pytest.raises(Compared):
        compare_heads.main([*paths, "--out", str(tmp_path)])
    assert [str(path) for path in reads] == paths


@pytest.mark.slow
def test_bench_decode_rows_of_draft_sequences_hybrids_and_staged_drafts(tiny_checkpoints, tmp_path):
    """--methods spectr,draft,draft-spectr,hybrid,staged: a row per method (and per --sequences), greedy outputs
    identical to autoregressive decoding, and the plot drawn with every method's marker."""
    out = tmp_path / "bench"
    checkpoint = str(tiny_checkpoints["mtp4"])
    command = [sys.executable, str(ROOT / "scripts" / "bench_decode.py"), checkpoint, "--draft", checkpoint]
    command += ["--no-compile"]
    command += ["--prompts", "2", "--prompt-tokens", "8", "--max-new-tokens", "8", "--batch-sizes", "1"]
    command += ["--modes", "greedy", "--heads", "4", "--methods", "chain,spectr,draft,draft-spectr,hybrid,staged"]
    command += ["--repeats", "1", "--sequences", "2", "--gammas", "2", "--gamma", "2", "--staged", "heads"]
    command += ["--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, env=run_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads((out / "results.json").read_text())["results"]
    methods = sorted((r["method"], r["sequences"]) for r in rows)
    expected = [("chain", 1), ("chain", 1), ("draft", 1), ("draft spectr", 2), ("hybrid", 1), ("spectr", 2)]
    assert methods == sorted(expected + [("staged", 1)])
    assert all(r["identical_outputs"] == r["prompts"] == 2 for r in rows)
    assert (out / "decode.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_decode_puts_captured_steps_beside_eager_ones(tiny_checkpoints, tmp_path, monkeypatch):
    """--step-modes eager,captured: every setting again with its steps captured (CUDA graphs; on CPU here, by the
    stand-in that replays by rerunning), the same tokens, the capture's cost and each row against its eager twin."""
    from mtp.decode import graphs

    monkeypatch.setitem(graphs.CAPTURES, "cpu", graphs.Rerun)
    bench, out = load_script("bench_decode"), tmp_path / "bench"
    argv = [str(tiny_checkpoints["mtp4"]), "--prompts", "2", "--prompt-tokens", "8", "--max-new-tokens", "8"]
    argv += ["--batch-sizes", "1", "--heads", "3", "--repeats", "1", "--modes", "greedy"]
    bench.main([*argv, "--step-modes", "eager,captured", "--out", str(out)])
    rows = json.loads((out / "results.json").read_text())["results"]
    assert sorted((r["heads"], r["cuda_graphs"]) for r in rows) == [(1, False), (1, True), (3, False), (3, True)]
    assert all(r["identical_outputs"] == r["prompts"] == 2 for r in rows)
    assert all(r["captures"] > 0 and r["capture_s"] > 0 for r in rows if r["cuda_graphs"])
    table = (out / "results.md").read_text()
    assert "chain (CUDA graphs)" in table and "Captured steps (CUDA graphs): " in table
    assert "tokens/s against the same setting's eager steps: greedy batch 1 chain k=1 " in table
    assert all(r["identical_to_eager"] == 2 for r in rows if r["cuda_graphs"]) and "its tokens on 2/2 prompts" in table


def test_bench_decode_refuses_captured_steps_without_cuda(tiny_checkpoints, capsys):
    bench = load_script("bench_decode")
    with pytest.raises(UserError, match="--step-modes captured replays CUDA graphs, and the benchmark runs on cpu"):
        bench.checked_args([str(tiny_checkpoints["mtp4"]), "--step-modes", "eager,captured", "--device", "cpu"])
    with pytest.raises(UserError, match="--step-modes eager,replayed: each must be eager or captured"):
        bench.checked_args([str(tiny_checkpoints["mtp4"]), "--step-modes", "eager,replayed"])


def test_a_near_ties_margin_is_head_ones_for_every_head_type():
    """Where a method's tokens leave autoregressive decoding's, the benchmark reports head 1's top-2 margin there:
    models whose draft heads read the following tokens (EAGLE-3) included."""
    import torch

    from mtp.benchmarks.hf_peer import top2_margin
    from mtp.model import MTPModel
    from mtp.model.config import ModelConfig

    torch.manual_seed(0)
    shape = dict(vocab_size=61, d_model=32, n_layers=9, n_heads=4, n_kv_heads=2, n_future=3)
    model = MTPModel(ModelConfig(**shape, head_type="eagle3", eagle3_layers=[5, 0, 3])).eval()
    prompt, continuation = [3, 14, 15, 9, 2], [6, 5]
    top = model.next_token_logits(torch.tensor([prompt + continuation]))[0, -1].topk(2).values
    assert top2_margin(model, prompt, continuation) == pytest.approx(float(top[0] - top[1]))
