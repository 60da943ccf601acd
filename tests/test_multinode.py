"""Two nodes on one machine, as a user launches them on two (gloo on CPU): the same command run twice with
NODE_RANK=0 and 1, MASTER_ADDR=127.0.0.1, trainer.num_nodes=2 and trainer.devices=1. Its loss curve equals one
node's two processes with the same global batch, the data is prepared once, the checkpoint is written once (by the
first node), and it resumes on one node and decodes."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.conftest import ROOT
from tests.test_scripts import pretrain, tiny_data

STEPS = ["trainer.max_steps=6", "trainer.val_check_interval=3", "trainer.limit_val_batches=1",
         "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false",
         "callbacks.decode_probe.prompts=0"]  # fmt: skip
STRATEGIES = {"ddp": ["trainer.strategy=ddp"], "fsdp": ["trainer=fsdp", "trainer.precision=32-true"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def losses(run: Path) -> list[float]:
    """The run's training loss at every step, from its TensorBoard log."""
    (events,) = (run / "tensorboard").glob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    return [event.value for event in accumulator.Scalars("train/loss")]


def node_processes(overrides: list[str], runs: list[Path], tmp_path: Path) -> list[subprocess.CompletedProcess]:
    """The pretrain command started once per node, with the node's rank and the first node's address."""
    port = free_port()
    started = []
    for rank, run in enumerate(runs):
        command = [sys.executable, str(ROOT / "scripts" / "pretrain.py"), f"paths.log_dir={tmp_path / 'logs'}",
                   *overrides, "trainer.num_nodes=2", "trainer.devices=1", f"hydra.run.dir={run}"]  # fmt: skip
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "HF_DATASETS_OFFLINE": "1",
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "NODE_RANK": str(rank),
        }
        started.append(subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True))  # fmt: skip
    done = []
    for process in started:
        stdout, stderr = process.communicate(timeout=600)
        done.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    return done


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_nodes_train_as_one_node_of_two_processes_and_resume_on_one(strategy, corpus_dir, tmp_path, capsys):
    from tests.test_decode_scripts import load_script

    cache = tmp_path / "cache"  # a cache both nodes see, as a shared file system gives them
    common = [*tiny_data(corpus_dir, cache), "model=mtp2", "trainer.accelerator=cpu", *STRATEGIES[strategy], *STEPS]
    one_node = pretrain(*common, "trainer.devices=2", f"hydra.run.dir={tmp_path / 'one'}", tmp_path=tmp_path)
    assert one_node.returncode == 0, one_node.stderr[-3000:]
    cache_built = list(cache.glob("files-bpe-*"))
    nodes = [tmp_path / "node0", tmp_path / "node1"]  # each node's own run folder: no shared output
    for path in cache_built:  # the second run prepares its data afresh, once, on one of the two nodes
        path.rename(path.with_name(path.name + ".old"))
    results = node_processes(common, nodes, tmp_path)
    for result in results:
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    logs = [(node / "pretrain.log").read_text() for node in nodes]
    assert sum(log.count("preparing the data once for these settings") for log in logs) == 1
    expected = losses(tmp_path / "one")
    assert len(expected) == 6 and losses(nodes[0]) == pytest.approx(expected, rel=1e-5, abs=1e-6)
    # the first node wrote the checkpoint, once; the second wrote none
    checkpoint = nodes[0] / "checkpoints" / "last.ckpt"
    assert checkpoint.exists() and not (nodes[1] / "checkpoints").exists()
    resumed = pretrain(*[o for o in common if not o.startswith("trainer.max_steps")], "trainer.max_steps=8",
                       "trainer.devices=1", f"ckpt_path={checkpoint}", f"hydra.run.dir={tmp_path / 'resumed'}",
                       tmp_path=tmp_path)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    last = tmp_path / "resumed" / "checkpoints" / "last.ckpt"
    decode = load_script("decode")
    assert decode.main([str(last), "--self-speculative", "--prompt", "def f(", "--max-new-tokens", "6"]) == 0
    assert "tokens/forward=" in capsys.readouterr().out
