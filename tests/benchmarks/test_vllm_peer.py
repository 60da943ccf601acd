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


@pytest.mark.parametrize(
    ("method", "draft", "expected"),
    [
        ("mimo", None, {"method": "mtp", "num_speculative_tokens": 1}),
        ("eagle3", "DRAFT", {"method": "eagle3", "model": "DRAFT", "num_speculative_tokens": 1}),
        (None, None, None),
    ],
)
def test_vllm_is_asked_for_the_draft_the_checkpoint_carries(tmp_path, monkeypatch, method, draft, expected):
    """A MiMo folder drafts with its own MTP layer (method mtp, no draft folder); an EAGLE-3 draft is its own folder;
    plain decoding asks for none."""
    script = tmp_path / "runner.py"
    script.write_text(
        "import json, sys\nspec = json.load(open(sys.argv[1]))\n"
        "asked = {'asked': spec.get('speculative_config')}\n"
        "json.dump({'tokens': [], 'wall_s': 1.0, 'generated': 0, 'counters': asked}, open(sys.argv[2], 'w'))\n"
    )
    monkeypatch.setattr(vllm_peer, "RUNNER", script)
    run = vllm_peer.run_vllm(sys.executable, "x", tmp_path, [[1]], 4, 1, draft, method, 1 if method else 0)
    assert run.error is None and run.counters["asked"] == expected


def test_bench_decode_checks_its_vllm_flags_before_loading_anything(tmp_path):
    from mtp.commands import bench_decode

    missing = tmp_path / "no-venv" / "bin" / "python"
    with pytest.raises(UserError, match=r"^--vllm runs vLLM from a virtual environment of its own, and there is none"):
        bench_decode.checked_args(["x.ckpt", "--vllm", "--vllm-python", str(missing)])
    with pytest.raises(UserError, match=r"^--vllm-python names the environment vLLM runs in; add --vllm.$"):
        bench_decode.checked_args(["x.ckpt", "--vllm-python", str(missing)])
    with pytest.raises(UserError, match=r"^--vllm compares with greedy decoding at batch size 1"):
        bench_decode.checked_args(["x.ckpt", "--vllm", "--modes", "sampling"])


def test_a_target_folder_with_mtps_heads_beside_it_is_refused_before_vllm_starts(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "mtp_heads.safetensors").write_bytes(b"")
    with pytest.raises(
        UserError, match=r"holds mtp_heads.safetensors beside the model's weights, which vLLM would load"
    ):
        vllm_peer.check_target(tmp_path)
    (tmp_path / "mtp_heads.safetensors").unlink()
    vllm_peer.check_target(tmp_path)


def test_the_table_puts_vllms_rows_beside_mtps():
    peer = {"threads": 2, "prompts": 4, "method": "eagle3", "rows": [
        {"label": "vLLM plain", "tokens_per_s": 20.0, "tokens_per_step": 1.0, "acceptance": [], "error": None,
         "same_as_plain": 4, "same_as_mtp": 3},
        {"label": "vLLM eagle3 (k=2)", "tokens_per_s": 25.0, "tokens_per_step": 1.4, "acceptance": [0.4],
         "error": None, "same_as_plain": 4, "same_as_mtp": 3},
        {"label": "vLLM eagle3 (k=3)", "error": "ValueError: no"}]}  # fmt: skip
    mtp = [{"heads": 1, "method": "chain", "tokens_per_s": 30.0, "tokens_per_forward": 1.0, "acceptance": []}]
    table = vllm_peer.vllm_table(peer, mtp)
    assert "| vLLM eagle3 (k=2) | 25.0 | 1.40 | 0.40 | 1.25x | 4/4 | 3/4 |" in table
    assert "| vLLM eagle3 (k=3) | refused: ValueError: no |" in table and "| mtp autoregressive | 30.0 |" in table


@pytest.mark.slow
def test_vllm_decodes_an_eagle3_export_as_its_plain_decoding(tmp_path):
    """Where tools/vllm_cpu.sh installed vLLM: a tiny model with eagle3 heads, exported, decoded by vLLM plainly and
    with the draft: the same tokens."""
    python = vllm_peer.default_python()
    if not python.is_file():
        pytest.skip("vLLM is not installed (tools/vllm_cpu.sh); CI cannot afford it")
    pytest.importorskip("transformers")
    import torch

    from mtp.checkpoint.format import CHECKPOINT_FORMAT, CHECKPOINT_KEY
    from mtp.data.tokenizer import byte_tokenizer
    from mtp.model import MTPModel
    from mtp.model.config import ModelConfig

    torch.manual_seed(0)
    config = ModelConfig(vocab_size=320, d_model=128, n_layers=8, n_heads=2, n_kv_heads=1, n_future=3,
                         head_type="eagle3")  # fmt: skip
    model = MTPModel(config)
    checkpoint = tmp_path / "tiny.ckpt"
    meta = {"format": CHECKPOINT_FORMAT, "model_config": config.to_dict(), "tokenizer": byte_tokenizer().to_str()}
    torch.save({CHECKPOINT_KEY: meta, "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}},
               checkpoint)  # fmt: skip
    prompts = [[256, 100, 101, 102], [256, 50, 60]]
    peer = vllm_peer.VllmPeer(python, checkpoint, "eagle3", [1, 3], prompts, 12, None, tmp_path / "vllm", 1)
    result = peer.compare(None)
    plain, drafted = result["rows"]
    assert plain["error"] is None and drafted["error"] is None, (plain["error"], drafted["error"])
    assert drafted["same_as_plain"] == 2 and drafted["counters"].get("spec_decode_num_drafts", 0) > 0


@pytest.mark.slow
def test_vllm_drafts_with_a_mimo_exports_own_layer_as_mtp_does(tmp_path):
    """Where tools/vllm_cpu.sh installed vLLM: a small causal-head model (head size 64, which vLLM's CPU attention
    takes) trained on counting to draft well, with causal_first_token=zero, exported as MiMo and decoded by vLLM
    plainly and with its own MTP layer (method mtp): the same tokens as plain and as mtp's autoregressive decoding,
    and as many drafts accepted as mtp's own decoder accepts with depth 2 on the same prompts."""
    python = vllm_peer.default_python()
    if not python.is_file():
        pytest.skip("vLLM is not installed (tools/vllm_cpu.sh); CI cannot afford it")
    pytest.importorskip("transformers")
    import torch

    from mtp.decode import Plan, generate
    from mtp.model import MTPModel
    from mtp.model.config import ModelConfig
    from tests.decode.helpers import train_on_cycles
    from tests.interop.test_engines import checkpoint_of

    torch.manual_seed(0)
    config = ModelConfig(vocab_size=320, d_model=128, n_layers=4, n_heads=2, n_kv_heads=2, n_future=2,
                         head_type="causal", causal_first_token="zero")  # fmt: skip
    model = train_on_cycles(MTPModel(config), steps=60)
    checkpoint = checkpoint_of(model, tmp_path / "tiny.ckpt")
    prompts = [[100, 101, 102, 103], [7], [50, 51, 52, 60, 61]]
    reference, _ = generate(model, prompts, Plan().changed(max_new_tokens=16, heads=1))
    _, drafted = generate(model, prompts, Plan().changed(max_new_tokens=16, heads=2))
    peer = vllm_peer.VllmPeer(python, checkpoint, "mimo", [1, 2], prompts, 16, None, tmp_path / "vllm", 1)
    result = peer.compare(reference)
    plain, mtp_layer = result["rows"]
    assert plain["error"] is None and mtp_layer["error"] is None, (plain["error"], mtp_layer["error"])
    assert plain["same_as_mtp"] == mtp_layer["same_as_plain"] == mtp_layer["same_as_mtp"] == len(prompts)
    counters = mtp_layer["counters"]
    assert counters["spec_decode_num_drafts"] > 0
    assert counters["spec_decode_num_accepted_tokens"] == drafted.accepted[0], (counters, drafted.accepted)
