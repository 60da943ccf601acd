"""trainer=fsdp as a user runs it on CPU: 2 processes (gloo), sharded and full checkpoints, resume, decode."""

from pathlib import Path

import pytest
import torch
from test_decode_scripts import load_script
from test_scripts import pretrain, tiny_data

from mtp.checkpoint.format import read_checkpoint
from mtp.checkpoint.load import load_checkpoint


def fsdp_run(corpus_dir, cache, tmp_path: Path, name: str, steps: int, *extra: str) -> Path:
    """Train to ``steps`` under trainer=fsdp; returns the run folder (its batches are in <run>/batches)."""
    run = tmp_path / name
    result = pretrain(
        *tiny_data(corpus_dir, cache),
        "model=mtp4",
        "trainer=fsdp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.precision=32-true",
        f"trainer.max_steps={steps}",
        "trainer.val_check_interval=2",
        "trainer.limit_val_batches=1",
        "trainer.enable_progress_bar=false",
        f"hydra.run.dir={run}",
        "+callbacks.record._target_=tests.batch_recorder.RecordBatches",
        f"+callbacks.record.path={run / 'batches'}",
        *extra,
        tmp_path=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return run


def batches(run: Path, rank: int) -> list[torch.Tensor]:
    return torch.load(run / "batches" / f"rank{rank}.pt", weights_only=True)


@pytest.mark.slow
def test_fsdp_on_cpu_resumes_exactly_from_sharded_and_full_checkpoints_and_decodes(
    corpus_dir, shared_cache, tmp_path, capsys
):
    straight = fsdp_run(corpus_dir, shared_cache, tmp_path, "straight", 8)
    # 0 -> 3 sharded; resume from the folder to 6, saving one full file; resume from that file to 8, sharded
    first = fsdp_run(corpus_dir, shared_cache, tmp_path, "first", 3)
    sharded = first / "checkpoints" / "last.ckpt"
    assert sharded.is_dir() and read_checkpoint(sharded)["global_step"] == 3
    full_save = "trainer.strategy.save_distributed_checkpoint=false"
    second = fsdp_run(corpus_dir, shared_cache, tmp_path, "second", 6, f"ckpt_path={sharded}", full_save)
    full = second / "checkpoints" / "last.ckpt"
    assert full.is_file() and read_checkpoint(full)["global_step"] == 6
    third = fsdp_run(corpus_dir, shared_cache, tmp_path, "third", 8, f"ckpt_path={full}")

    for rank in (0, 1):  # each process trained on exactly the batches the uninterrupted run saw
        pieces = batches(first, rank) + batches(second, rank) + batches(third, rank)
        assert len(pieces) == 8 and all(torch.equal(a, b) for a, b in zip(batches(straight, rank), pieces, strict=True))
    assert not torch.equal(batches(straight, 0)[0], batches(straight, 1)[0])  # the processes split the data

    # the same data, weights, optimizer state and schedule: the same final weights
    expected = load_checkpoint(straight / "checkpoints" / "last.ckpt").model.state_dict()
    resumed = load_checkpoint(third / "checkpoints" / "last.ckpt").model.state_dict()
    for name, tensor in expected.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=1e-5, atol=1e-6, msg=name)

    decode = load_script("decode")  # in this process: the checkpoints, not the interpreter's start, are under test
    for checkpoint in (sharded, full):
        assert decode.main([str(checkpoint), "--self-speculative", "--prompt", "def f(", "--max-new-tokens", "8"]) == 0
        out = capsys.readouterr().out
        assert out.startswith("def f(") and "tokens/forward=" in out.splitlines()[-1]
