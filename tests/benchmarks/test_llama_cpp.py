"""llama.cpp as the CPU peer: what its tools print read back (the reply, tokens, seconds, drafts), its rows and table,
and each failure one sentence. The tools themselves are built and run by scripts/bench_decode.py --llama-cpp (not in
CI: a build takes 20-40 minutes); here they are stood in for by what they print."""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mtp.benchmarks import llama_cpp
from mtp.benchmarks.llama_cpp import (
    GGUF_TYPES,
    LlamaCpp,
    LlamaCppPeer,
    LlamaCppRun,
    llama_cpp_peers,
    llama_cpp_results,
    llama_cpp_table,
    same_reply,
    target_ggufs,
)
from mtp.errors import UserError

PROMPT = "<|im_start|>user\nsum a list<|im_end|>\n<|im_start|>assistant\n"


def printed(stdout: str, stderr: str, code: int = 0) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess([], code, stdout, stderr)


def speculative(reply: str, tokens: int, seconds: float, drafted: int, accepted: int) -> subprocess.CompletedProcess:
    """What llama-speculative-simple prints: the prompt and the reply on stdout, its statistics on stderr."""
    stderr = (
        f"I encoded   14 tokens in    0.100 seconds, speed:  140.000 t/s\n"
        f"I decoded {tokens:4d} tokens in {seconds:8.3f} seconds, speed: {tokens / seconds:8.3f} t/s\n"
        f"I n_draft   = 3\nI n_predict = {tokens}\nI n_drafted = {drafted}\nI n_accept  = {accepted}\n"
    )
    return printed(f"\n\n{PROMPT}{reply}\n\n", stderr)


def completion(reply: str, runs: int, ms: float) -> subprocess.CompletedProcess:
    """What llama-completion prints with --no-display-prompt: the reply, and llama_perf's lines."""
    stderr = f"I common_perf_print: eval time = {ms:10.2f} ms / {runs:5d} runs   (   9.00 ms per token)\n"
    return printed(reply, stderr)


@pytest.fixture
def tools(monkeypatch, tmp_path):
    """The tools, their runs answered from ``outputs[tool]`` in turn; the arguments each got in ``calls``."""
    found = LlamaCpp(tmp_path / "bin", tmp_path / "src", "0.3.36")
    found.outputs, found.calls = {}, []

    def run(self, tool, arguments):
        self.calls.append((tool, arguments))
        result = self.outputs[tool].pop(0)
        if result.returncode != 0:
            raise UserError(f"{tool} failed (exit {result.returncode}): {result.stderr.splitlines()[-1]}")
        return result

    monkeypatch.setattr(LlamaCpp, "_run", run)
    return found


def test_a_drafted_run_reads_the_reply_tokens_seconds_and_drafts(tools):
    tools.outputs["llama-speculative-simple"] = [speculative("def f(x):\n    return sum(x)", 12, 0.5, 10, 6)]
    run = tools.decode(Path("t.gguf"), PROMPT, 128, 2, draft=Path("d.gguf"), draft_max=2)
    assert run == LlamaCppRun("def f(x):\n    return sum(x)", 12, 0.5, 10, 6) and run.tokens_per_s == 24
    tool, arguments = tools.calls[0]
    assert tool == "llama-speculative-simple" and arguments[arguments.index("--spec-type") + 1] == "draft-eagle3"
    assert (
        arguments[arguments.index("-md") + 1] == "d.gguf"
        and arguments[arguments.index("--spec-draft-n-max") + 1] == "2"
    )
    assert arguments[arguments.index("--temp") + 1] == "0" and arguments[arguments.index("-t") + 1] == "2"


def test_a_plain_run_counts_the_first_token_beside_the_decoding_runs(tools):
    tools.outputs["llama-completion"] = [completion("def f(x):\n    return sum(x)", 11, 400.0)]
    run = tools.decode(Path("t.gguf"), PROMPT, 128, 2)
    assert (run.text, run.tokens, run.seconds, run.drafted) == ("def f(x):\n    return sum(x)", 12, 0.4, 0)
    assert "--no-display-prompt" in tools.calls[0][1]


def test_what_the_tools_cannot_give_is_one_sentence(tools):
    tools.outputs["llama-speculative-simple"] = [
        printed("\n\nanother prompt entirely", "I decoded 3 tokens in 0.1 seconds\nI n_drafted = 1\nI n_accept = 1\n"),
        printed("", "loading...\nerror: failed to load the draft model\n", code=1),
        printed(f"\n\n{PROMPT}x", "nothing useful\n"),
    ]
    with pytest.raises(UserError, match="^llama-speculative-simple echoed another prompt than it was given"):
        tools.decode(Path("t.gguf"), PROMPT, 4, 1, draft=Path("d.gguf"))
    with pytest.raises(UserError, match=r"^llama-speculative-simple failed \(exit 1\): error: failed to load the"):
        tools.decode(Path("t.gguf"), PROMPT, 4, 1, draft=Path("d.gguf"))
    with pytest.raises(UserError, match="^llama-speculative-simple printed no statistics"):
        tools.decode(Path("t.gguf"), PROMPT, 4, 1, lookup=True)


def test_a_build_that_fails_is_one_sentence_naming_its_log(monkeypatch, tmp_path):
    source = tmp_path / f"llama_cpp_python-{llama_cpp.LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    source.mkdir(parents=True)  # the sdist already unpacked: the next step is cmake's

    def cmake(command, stdout, stderr):
        return subprocess.CompletedProcess(command, 1)

    monkeypatch.setattr(llama_cpp.subprocess, "run", cmake)
    with pytest.raises(UserError, match=rf"^configuring llama.cpp failed \(exit 1\); see {tmp_path}/cmake.log\.$"):
        LlamaCpp.at(tmp_path)

    def missing(command, stdout, stderr):
        raise FileNotFoundError(2, "No such file", "cmake")

    monkeypatch.setattr(llama_cpp.subprocess, "run", missing)
    with pytest.raises(UserError, match="^configuring llama.cpp needs cmake, which is not installed; install it"):
        LlamaCpp.at(tmp_path)
    assert not (tmp_path / "build.json").exists()  # recorded only once the tools are built


def test_the_source_is_fetched_alone_its_build_tools_as_wheels(monkeypatch, tmp_path):
    """pip downloads llama-cpp-python's sdist and nothing else from source: ``--no-binary :all:`` would build each of
    its build dependencies from source too, in nested build environments (over an hour on 2 cores)."""
    commands = []

    def download(command, stdout, stderr):
        commands.append(command)
        return subprocess.CompletedProcess(command, 1)

    monkeypatch.setattr(llama_cpp.subprocess, "run", download)
    with pytest.raises(UserError, match=r"^downloading llama-cpp-python .* failed \(exit 1\); see "):
        LlamaCpp.at(tmp_path)
    (command,) = commands
    assert command[command.index("--no-binary") + 1] == "llama-cpp-python" and "--no-deps" in command


def test_the_peer_rows_count_forwards_and_check_each_reply_against_plain_decoding(tools):
    replies = ["def f(x):\n    return sum(x)", "def g():\n    pass"]
    tools.outputs["llama-completion"] = [completion(replies[0], 3, 10.0)]  # the warm-up
    tools.outputs["llama-completion"] += [completion(r + " [end of text]\n\n", 11, 500.0) for r in replies]
    tools.outputs["llama-speculative-simple"] = [
        speculative(replies[0], 12, 1.0, 12, 3),  # lookup
        speculative(replies[1], 12, 1.0, 12, 3),
        speculative(replies[0], 12, 0.4, 8, 6),  # the draft, 2 a step
        speculative("def g():\n    return 1", 12, 0.4, 8, 6),  # a reply the draft changed: not greedy-exact
    ]
    peer = LlamaCppPeer(tools, Path("t.gguf"), [PROMPT, PROMPT], 128, 2, Path("d.gguf"), (2,), "q8_0")
    peer.run_round()
    compared = peer.compare([(replies[0], 11), ("def g():\n    return 2", 11)])
    assert (compared["type"], compared["target"]) == ("q8_0", "t.gguf")
    plain, lookup, drafted = compared["rows"]
    assert (plain["tokens"], plain["seconds"], plain["tokens_per_forward"]) == (24, 1.0, 1.0)
    assert lookup["tokens_per_forward"] == pytest.approx(24 / 18) and lookup["acceptance_rate"] == 0.25
    assert drafted["draft_max"] == 2 and drafted["tokens_per_s"] == 30 and drafted["same_replies_as_plain"] == 1
    assert lookup["same_replies_as_plain"] == 2 and compared["plain_replies_equal_mtp"] == 1
    mtp = [{"heads": 1, "method": "chain", "quantize": "int8", "tokens_per_s": 12.0, "tokens_per_forward": 1.0}]
    table = llama_cpp_table([compared], mtp)
    assert "| llama.cpp Q8_0 EAGLE-3 draft (k=3) | 30.0 | 2.00 | 0.75 | 1.25x | 1/2 |" in table
    assert "| mtp int8 autoregressive | 12.0 | 1.00 | | 0.50x | |" in table
    assert "plain replies at Q8_0 equal mtp autoregressive decoding's with the model's own weights on 1 of 2" in table


def test_a_target_of_another_model_is_one_sentence(monkeypatch, tmp_path, tiny_checkpoints):
    from mtp.checkpoint.load import load_checkpoint
    from mtp.model.config import ModelConfig

    monkeypatch.setattr(LlamaCpp, "at", classmethod(lambda cls, cache: cls(tmp_path, tmp_path, "0.3.36")))
    monkeypatch.setattr(llama_cpp, "read_foreign_config", lambda path: ModelConfig(vocab_size=49152, d_model=576))
    checkpoint = tiny_checkpoints["mtp4"]
    loaded = load_checkpoint(checkpoint, "cpu", "float32")
    with pytest.raises(UserError, match=r"^--llama-cpp-target .*t.gguf has a vocabulary of 49152 and width 576, the"):
        llama_cpp_peers(
            tmp_path, tmp_path / "t.gguf", ["f32"], checkpoint, loaded, [[1, 2, 3]], [1, 2], 128, tmp_path / "out"
        )


def test_replies_are_the_same_up_to_trailing_space_or_a_budget_both_reached():
    """A speculative run may pass the token budget by the drafts one step accepts, and the tools end a reply's text
    differently; a reply that ended before the budget must equal the other whole."""
    assert same_reply(("def f():\n    pass\n\n", 6), ("def f():\n    pass", 6), 128)
    assert same_reply(("def f(x):\n    ret", 128), ("def f(x):\n    return x", 130), 128)
    assert not same_reply(("def f(x):", 4), ("def f(x):\n    return x", 128), 128)  # one ended early
    assert not same_reply(("def f(x):\n    ret", 127), ("def f(x):\n    return x", 130), 128)
    assert not same_reply(("return a", 128), ("return b", 128), 128)


def test_the_build_makes_llama_quantize_too(monkeypatch, tmp_path):
    """A cache built before llama-quantize was one of the tools builds again (its other tools already built)."""
    source = tmp_path / f"llama_cpp_python-{llama_cpp.LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    source.mkdir(parents=True)
    commands = []

    def run(command, stdout, stderr):
        commands.append(command)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(llama_cpp.subprocess, "run", run)
    LlamaCpp.at(tmp_path)
    assert commands[-1][-4:] == ["--target", "llama-completion", "llama-speculative-simple", "llama-quantize"]
    assert json.loads((tmp_path / "build.json").read_text())["tools"][-1] == "llama-quantize"
    (tmp_path / "build" / "bin").mkdir(parents=True)
    for tool in ("llama-completion", "llama-speculative-simple"):
        (tmp_path / "build" / "bin" / tool).touch()
    commands.clear()
    LlamaCpp.at(tmp_path)
    assert [command[:2] for command in commands] == [["cmake", "-S"], ["cmake", "--build"]]
    (tmp_path / "build" / "bin" / "llama-quantize").touch()
    commands.clear()
    assert LlamaCpp.at(tmp_path).bin == tmp_path / "build" / "bin" and commands == []


def test_each_type_is_written_by_llama_cpps_converter_or_its_quantizer(monkeypatch, tmp_path):
    """f32 and q8_0 from convert_hf_to_gguf.py --outtype, q4_0 from llama-quantize applied to the f32 file (converted
    once); never a quantization of mtp's own."""
    steps = []
    monkeypatch.setattr(llama_cpp, "_step", lambda command, log, what: steps.append((command, log)))
    tools = LlamaCpp(tmp_path / "bin", tmp_path / "src", "0.3.36")
    hf, work = tmp_path / "target-hf", tmp_path / "work"
    made = target_ggufs(tools, hf, ["q4_0", "f32", "q8_0"], work)
    assert list(made.items()) == [(t, work / f"target-{t}.gguf") for t in GGUF_TYPES]
    converter = [sys.executable, str(tmp_path / "src" / "convert_hf_to_gguf.py"), str(hf), "--outtype"]
    f32, q8_0, q4_0 = (str(work / f"target-{t}.gguf") for t in GGUF_TYPES)
    assert steps == [
        ([*converter, "f32", "--outfile", f32], work / "target-f32.convert.log"),
        ([*converter, "q8_0", "--outfile", q8_0], work / "target-q8_0.convert.log"),
        ([str(tmp_path / "bin" / "llama-quantize"), f32, q4_0, "Q4_0"], work / "target-q4_0.quantize.log"),
    ]
    steps.clear()
    assert target_ggufs(tools, hf, ["q4_0"], work) == {"q4_0": work / "target-q4_0.gguf"}  # the f32 file a step only
    assert [command[-1] for command, _ in steps] == [f32, "Q4_0"]


def test_a_quantization_that_fails_is_one_sentence_naming_its_log(monkeypatch, tmp_path):
    monkeypatch.setattr(
        llama_cpp.subprocess, "run", lambda command, stdout, stderr: subprocess.CompletedProcess(command, 1)
    )
    tools = LlamaCpp(tmp_path / "bin", tmp_path / "src", "0.3.36")
    with pytest.raises(UserError) as err:
        tools.quantize(tmp_path / "target-f32.gguf", tmp_path / "target-q4_0.gguf", "Q4_0")
    assert str(err.value) == (
        f"quantizing {tmp_path}/target-f32.gguf to Q4_0 failed (exit 1); see {tmp_path}/target-q4_0.quantize.log."
    )


def test_each_type_is_a_peer_of_its_own_warmed_up_once_with_the_one_float_draft(tools, monkeypatch, tmp_path):
    steps, work = [], tmp_path / "work"
    monkeypatch.setattr(LlamaCpp, "at", classmethod(lambda cls, cache: tools))
    monkeypatch.setattr(llama_cpp, "_step", lambda command, log, what: steps.append(command))
    monkeypatch.setattr(llama_cpp, "export_hf", lambda checkpoint, out, force: SimpleNamespace(directory=out))
    monkeypatch.setattr(llama_cpp, "export_draft", lambda checkpoint, out, layout, force: None)
    config = SimpleNamespace(head_type="eagle3", n_future=4, vocab_size=64, d_model=16)
    loaded = SimpleNamespace(config=config, tokenizer=SimpleNamespace(decode=lambda ids, skip_special_tokens: PROMPT))
    tools.outputs["llama-completion"] = [completion("x", 3, 10.0) for _ in GGUF_TYPES]  # the warm-ups
    peers = llama_cpp_peers(tmp_path, None, ["q8_0", "q4_0", "f32"], Path("c.ckpt"), loaded, [[1]], [1, 2, 3], 8, work)
    targets = [work / f"target-{t}.gguf" for t in GGUF_TYPES]
    assert [(peer.gguf_type, peer.target) for peer in peers] == list(zip(GGUF_TYPES, targets, strict=True))
    assert [arguments[arguments.index("-m") + 1] for _, arguments in tools.calls] == [str(t) for t in targets]
    assert all(peer.draft == work / "draft.gguf" for peer in peers)
    assert [(m.name, m.draft_max) for m in peers[2].methods][2:] == [("EAGLE-3 draft", 1), ("EAGLE-3 draft", 2)]
    (draft,) = [command for command in steps if str(work / "draft") in command]  # converted once, in float32
    assert draft[draft.index("--outtype") + 1] == "f32" and draft[-1] == str(work / "target-hf")
    steps.clear()
    tools.calls.clear()
    tools.outputs["llama-completion"] = [completion("x", 3, 10.0)]
    monkeypatch.setattr(llama_cpp, "read_foreign_config", lambda path: config)
    (peer,) = llama_cpp_peers(tmp_path, tmp_path / "t.gguf", ["f32"], Path("c.ckpt"), loaded, [[1]], [1], 8, work)
    assert (peer.gguf_type, peer.target, steps) == ("file", tmp_path / "t.gguf", [])  # the file as it is


def peer_result(gguf_type: str | None, plain_tokens_per_s: float, same_as_mtp: int = 2) -> dict:
    """A target's entry of results.json's llama_cpp: its plain and lookup rows (None: an earlier run's, untyped)."""
    rows = [
        {"method": name, "draft_max": draft_max, "tokens_per_s": plain_tokens_per_s * speed, "tokens_per_forward": 1.0,
         "acceptance_rate": None, "same_replies_as_plain": 2}
        for name, draft_max, speed in (("plain", 0, 1.0), ("lookup (ngram-simple)", 3, 1.5))
    ]  # fmt: skip
    peer = {"version": "0.3.36", "target": f"/out/llama_cpp/target-{gguf_type or 'f32'}.gguf", "draft": None}
    peer |= {"threads": 2, "prompts": 2, "rows": rows, "plain_replies_equal_mtp": same_as_mtp}
    return peer | ({"type": gguf_type} if gguf_type is not None else {})


def mtp_row(quantize: str, heads: int, tokens_per_s: float) -> dict:
    return {"heads": heads, "method": "chain", "quantize": quantize, "tokens_per_s": tokens_per_s,
            "tokens_per_forward": 1.0 if heads == 1 else 2.0}  # fmt: skip


def test_mtps_rows_are_set_against_llama_cpps_plain_decoding_at_the_same_precision():
    peers = [peer_result("f32", 10.0), peer_result("q8_0", 20.0, 1), peer_result("q4_0", 40.0, 0)]
    mtp = [mtp_row("none", 1, 12.0), mtp_row("int8", 1, 16.0), mtp_row("int8", 3, 32.0), mtp_row("int4", 1, 30.0)]
    lines = llama_cpp_table(peers, mtp).splitlines()
    assert lines[0].endswith("| against llama.cpp plain (same precision) | same replies as llama.cpp plain |")
    assert lines[2:8] == [
        "| llama.cpp F32 plain | 10.0 | 1.00 |  | 1.00x | 2/2 |",
        "| llama.cpp F32 lookup (ngram-simple) (k=4) | 15.0 | 1.00 |  | 1.50x | 2/2 |",
        "| llama.cpp Q8_0 plain | 20.0 | 1.00 |  | 1.00x | 2/2 |",
        "| llama.cpp Q8_0 lookup (ngram-simple) (k=4) | 30.0 | 1.00 |  | 1.50x | 2/2 |",
        "| llama.cpp Q4_0 plain | 40.0 | 1.00 |  | 1.00x | 2/2 |",
        "| llama.cpp Q4_0 lookup (ngram-simple) (k=4) | 60.0 | 1.00 |  | 1.50x | 2/2 |",
    ]
    assert lines[8:12] == [
        "| mtp autoregressive | 12.0 | 1.00 | | 1.20x | |",
        "| mtp int8 autoregressive | 16.0 | 1.00 | | 0.80x | |",  # against Q8_0's 20, not F32's 10
        "| mtp int8 chain (k=3) | 32.0 | 2.00 | | 1.60x | |",
        "| mtp int4 autoregressive | 30.0 | 1.00 | | 0.75x | |",  # against Q4_0's 40
    ]
    said = "llama.cpp 0.3.36's plain replies at {} equal mtp autoregressive decoding's with the model's own weights on"
    assert lines[13:16] == [said.format(t) + f" {n} of 2 prompts." for t, n in (("F32", 2), ("Q8_0", 1), ("Q4_0", 0))]
    # a precision llama.cpp did not run has no row to be set against; mtp's own weights none without f32 either
    lines = llama_cpp_table([peer_result("q8_0", 20.0)], mtp[:2]).splitlines()
    assert lines[4:6] == [
        "| mtp autoregressive | 12.0 | 1.00 | |  | |",
        "| mtp int8 autoregressive | 16.0 | 1.00 | | 0.80x | |",
    ]


def test_an_earlier_runs_single_target_is_still_read():
    """results.json's llama_cpp was one dict, with no type: read as a list of that one target, a file named by its
    name, against which mtp's own weights are set (and no quantized row)."""
    earlier = peer_result(None, 10.0)
    assert llama_cpp_results(earlier) == [earlier] and llama_cpp_results([earlier]) == [earlier]
    lines = llama_cpp_table(earlier, [mtp_row("none", 1, 12.0), mtp_row("int8", 1, 16.0)]).splitlines()
    assert lines[2] == "| llama.cpp target-f32.gguf plain | 10.0 | 1.00 |  | 1.00x | 2/2 |"
    assert lines[4:6] == [
        "| mtp autoregressive | 12.0 | 1.00 | | 1.20x | |",
        "| mtp int8 autoregressive | 16.0 | 1.00 | |  | |",
    ]
    assert lines[7].startswith("llama.cpp 0.3.36's plain replies with target-f32.gguf equal mtp autoregressive")


def test_bench_decode_checks_its_llama_cpp_types_before_loading_anything():
    from mtp.commands import bench_decode

    cases = [
        (
            ["--llama-cpp", "d", "--llama-cpp-types", "f32,f16"],
            "--llama-cpp-types f32,f16: each type must be one of f32, q8_0, q4_0, such as --llama-cpp-types "
            "f32,q8_0,q4_0.",
        ),
        (
            ["--llama-cpp-types", "q8_0"],
            "--llama-cpp-types names the GGUF types llama.cpp decodes; add --llama-cpp DIR.",
        ),
        (
            ["--llama-cpp", "d", "--llama-cpp-target", "t.gguf", "--llama-cpp-types", "f32,q8_0"],
            "--llama-cpp-types f32,q8_0 asks for the checkpoint's own weights at those types, but --llama-cpp-target's "
            "file is decoded as it is; leave out --llama-cpp-target to decode those types, or --llama-cpp-types to "
            "decode the file.",
        ),
        (
            ["--llama-cpp", "d", "--llama-cpp-target", "t.gguf", "--llama-cpp-types", "q4_0"],
            "--llama-cpp-types q4_0 asks for the checkpoint's own weights at those types, but --llama-cpp-target's "
            "file is decoded as it is; leave out --llama-cpp-target to decode those types, or --llama-cpp-types to "
            "decode the file.",
        ),
    ]
    for flags, message in cases:
        with pytest.raises(UserError) as err:
            bench_decode.checked_args(["x.ckpt", *flags])
        assert str(err.value) == message, flags
    read = bench_decode.checked_args(["x.ckpt", "--llama-cpp", "d", "--llama-cpp-types", "Q4_0,f32"])
    assert read.llama_cpp_types == ["f32", "q4_0"]  # in the tables' order
    assert bench_decode.checked_args(["x.ckpt", "--llama-cpp", "d"]).llama_cpp_types == ["f32"]  # today's target
    target = bench_decode.checked_args(["x.ckpt", "--llama-cpp", "d", "--llama-cpp-target", "t.gguf"])
    assert (target.llama_cpp_target, target.llama_cpp_types) == (Path("t.gguf"), ["f32"])
    node = bench_decode.settings_of_config("c.ckpt", {"llama_cpp": "d", "llama_cpp_types": ["q8_0", "f32"]})
    assert node.llama_cpp_types == ["f32", "q8_0"]


@pytest.mark.slow
def test_bench_decode_times_a_target_per_type_beside_mtps_quantized_rows(monkeypatch, tmp_path, tiny_checkpoints):
    """The benchmark with llama.cpp's tools stood in for: a peer per type in the same rounds, results.json's llama_cpp
    a list of them, and the table's mtp rows at every precision, each against its own."""
    from mtp.commands import bench_decode

    monkeypatch.setattr(LlamaCpp, "at", classmethod(lambda cls, cache: cls(tmp_path / "bin", tmp_path / "src", "x")))
    monkeypatch.setattr(llama_cpp, "_step", lambda command, log, what: None)
    speed = {"f32": 1.0, "q8_0": 2.0}  # seconds per reply

    def decode(self, model, prompt, max_new_tokens, threads, draft=None, draft_max=3, lookup=False):
        return LlamaCppRun("reply", max_new_tokens, speed[model.stem.removeprefix("target-")])

    monkeypatch.setattr(LlamaCpp, "decode", decode)
    out = tmp_path / "bench"
    bench_decode.main(
        [str(tiny_checkpoints["mtp4"]), "--no-compile", "--prompts", "2", "--prompt-tokens", "8", "--max-new-tokens",
         "8", "--batch-sizes", "1", "--modes", "greedy", "--heads", "1,2", "--repeats", "1", "--quantize", "none,int8",
         "--llama-cpp", str(tmp_path / "cache"), "--llama-cpp-types", "q8_0,f32", "--out", str(out)]
    )  # fmt: skip
    peers = json.loads((out / "results.json").read_text())["llama_cpp"]
    assert [(peer["type"], Path(peer["target"]).name) for peer in peers] == [
        ("f32", "target-f32.gguf"),
        ("q8_0", "target-q8_0.gguf"),
    ]
    assert [row["tokens_per_s"] for peer in peers for row in peer["rows"] if row["method"] == "plain"] == [8.0, 4.0]
    table = (out / "results.md").read_text()
    assert "| llama.cpp F32 plain | 8.0 |" in table and "| llama.cpp Q8_0 plain | 4.0 |" in table
    results = json.loads((out / "results.json").read_text())["results"]
    for quantize, name, plain in (("none", "mtp autoregressive", 8.0), ("int8", "mtp int8 autoregressive", 4.0)):
        (row,) = [r for r in results if (r["quantize"], r["heads"]) == (quantize, 1)]
        assert f"| {name} | {row['tokens_per_s']:.1f} | 1.00 | | {row['tokens_per_s'] / plain:.2f}x | |" in table
    assert "| mtp int8 chain (k=2) |" in table
