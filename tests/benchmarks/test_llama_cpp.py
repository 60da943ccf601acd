"""llama.cpp as the CPU peer: what its tools print read back (the reply, tokens, seconds, drafts), its rows and table,
and each failure one sentence. The tools themselves are built and run by scripts/bench_decode.py --llama-cpp (not in
CI: a build takes 20-40 minutes); here they are stood in for by what they print."""

import subprocess
from pathlib import Path

import pytest

from mtp.benchmarks import llama_cpp
from mtp.benchmarks.llama_cpp import (
    LlamaCpp,
    LlamaCppPeer,
    LlamaCppRun,
    llama_cpp_peer,
    llama_cpp_table,
    same_reply,
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
    peer = LlamaCppPeer(tools, Path("t.gguf"), [PROMPT, PROMPT], 128, 2, Path("d.gguf"), (2,))
    peer.run_round()
    compared = peer.compare([(replies[0], 11), ("def g():\n    return 2", 11)])
    plain, lookup, drafted = compared["rows"]
    assert (plain["tokens"], plain["seconds"], plain["tokens_per_forward"]) == (24, 1.0, 1.0)
    assert lookup["tokens_per_forward"] == pytest.approx(24 / 18) and lookup["acceptance_rate"] == 0.25
    assert drafted["draft_max"] == 2 and drafted["tokens_per_s"] == 30 and drafted["same_replies_as_plain"] == 1
    assert lookup["same_replies_as_plain"] == 2 and compared["plain_replies_equal_mtp"] == 1
    mtp = [{"heads": 1, "method": "chain", "tokens_per_s": 12.0, "tokens_per_forward": 1.0}]
    table = llama_cpp_table(compared, mtp)
    assert "| llama.cpp EAGLE-3 draft (k=3) | 30.0 | 2.00 | 0.75 | 1.25x | 1/2 |" in table
    assert "| mtp autoregressive | 12.0 | 1.00 | | 0.50x | |" in table
    assert "plain replies equal mtp autoregressive decoding's on 1 of 2 prompts" in table


def test_a_target_of_another_model_is_one_sentence(monkeypatch, tmp_path, tiny_checkpoints):
    from mtp.checkpoint.load import load_checkpoint
    from mtp.model.config import ModelConfig

    monkeypatch.setattr(LlamaCpp, "at", classmethod(lambda cls, cache: cls(tmp_path, tmp_path, "0.3.36")))
    monkeypatch.setattr(llama_cpp, "read_foreign_config", lambda path: ModelConfig(vocab_size=49152, d_model=576))
    checkpoint = tiny_checkpoints["mtp4"]
    loaded = load_checkpoint(checkpoint, "cpu", "float32")
    with pytest.raises(UserError, match=r"^--llama-cpp-target .*t.gguf has a vocabulary of 49152 and width 576, the"):
        llama_cpp_peer(tmp_path, tmp_path / "t.gguf", checkpoint, loaded, [[1, 2, 3]], [1, 2], 128, tmp_path / "out")


def test_replies_are_the_same_up_to_trailing_space_or_a_budget_both_reached():
    """A speculative run may pass the token budget by the drafts one step accepts, and the tools end a reply's text
    differently; a reply that ended before the budget must equal the other whole."""
    assert same_reply(("def f():\n    pass\n\n", 6), ("def f():\n    pass", 6), 128)
    assert same_reply(("def f(x):\n    ret", 128), ("def f(x):\n    return x", 130), 128)
    assert not same_reply(("def f(x):", 4), ("def f(x):\n    return x", 128), 128)  # one ended early
    assert not same_reply(("def f(x):\n    ret", 127), ("def f(x):\n    return x", 130), 128)
    assert not same_reply(("return a", 128), ("return b", 128), 128)
