"""Peak memory and step time of full training steps for one configuration, measured in this process.

Run as ``python -m mtp.benchmarks.train_step '<json spec>'``; prints one JSON line. The parent
(scripts/bench_train.py) starts a fresh process per configuration so that peak figures never mix.

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` minus the memory allocated after the model
was built; on CPU the process's peak resident set (``ru_maxrss``) minus its resident set after the
model was built. Both therefore count activations, logits, gradients and optimizer state.

With ``tensor_parallel`` > 1 the step runs split across that many processes (started here: gloo on CPU, NCCL on
CUDA, every process reading the same batch), the model split as ``trainer=tp`` splits it
(:func:`mtp.training.parallel.apply_tp`); each process measures its own peak and the row reports the largest (memory
per process) and the slowest step.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from mtp.model import MTPModel
from mtp.model.config import ModelConfig
from mtp.training.loss import mtp_loss
from mtp.training.loss_config import LossConfig
from mtp.training.optim import parameter_groups
from mtp.training.parallel import parallelize


@dataclass
class StepSpec:
    """One configuration whose training steps are timed: a model and its loss, each its own config whole (the
    checkpoint's, or one a benchmark builds), and the step's shape."""

    model: ModelConfig
    """The model trained (its context becomes ``seq_len``: :meth:`model_config`)."""
    loss: LossConfig
    """The loss it trains with."""
    seq_len: int = 128
    batch_size: int = 4
    steps: int = 3
    warmup: int = 1
    device: str = "cpu"
    bf16: bool = False
    activation_checkpointing: bool = False
    compile: bool = False
    seed: int = 0
    tensor_parallel: int = 1
    """Processes the step is split across (tensor parallelism); 1: one process."""

    def model_config(self) -> ModelConfig:
        """The model this step trains: :attr:`model` with a context of ``seq_len``."""
        return replace(self.model, max_seq_len=self.seq_len)

    def shape(self) -> dict[str, Any]:
        """The step's shape: every field but the two configs."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("model", "loss")}

    def to_json(self) -> str:
        """The spec as the child process reads it (:meth:`from_json`)."""
        return json.dumps({"model": self.model.to_dict(), "loss": self.loss.to_dict(), **self.shape()})

    @classmethod
    def from_json(cls, text: str) -> StepSpec:
        values = json.loads(text)
        model, loss = ModelConfig.from_dict(values.pop("model")), LossConfig.from_dict(values.pop("loss"))
        return cls(model, loss, **values)

    def row(self) -> dict[str, Any]:
        """What a results row says of the spec: the model's shape and the loss's choices by name (``loss`` is its
        mode), the step's shape, and both configs whole (``model``, ``loss_config``)."""
        model, loss = self.model, self.loss
        labels = ("n_future", "vocab_size", "head_type", "d_model", "n_layers", "n_heads", "n_kv_heads")
        return {
            **{name: getattr(model, name) for name in labels},
            "loss": loss.mode,
            "loss_chunk": loss.loss_chunk,
            "head_loss": loss.head_loss,
            **self.shape(),
            "model": model.to_dict(),
            "loss_config": loss.to_dict(),
        }


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def peak_resident_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def measure(spec: StepSpec, tp_mesh: Any = None) -> dict:
    """The step of ``spec`` in this process (split over ``tp_mesh`` when given: one process of the group)."""
    if spec.tensor_parallel > 1 and tp_mesh is None:
        return measure_split(spec)
    torch.manual_seed(spec.seed)
    device = torch.device(spec.device)
    cuda = device.type == "cuda"
    config, loss_settings = spec.model_config(), spec.loss
    loss_settings.check_model(config)
    model = MTPModel(config).to(device)
    parallelize(model, activation_checkpointing=spec.activation_checkpointing, compile=spec.compile, tp_mesh=tp_mesh)
    optimizer = torch.optim.AdamW(parameter_groups(model, 0.1), lr=1e-4, betas=(0.9, 0.95), fused=cuda)
    window = torch.randint(0, config.vocab_size, (spec.batch_size, spec.seq_len + config.n_future), device=device)

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
    else:
        baseline = resident_bytes()

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=spec.bf16):
            loss = mtp_loss(model, window, loss_settings).total
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    times = []
    for _ in range(spec.warmup + spec.steps):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)

    peak = (torch.cuda.max_memory_allocated() if cuda else peak_resident_bytes()) - baseline
    step_time = statistics.median(times[spec.warmup :])
    return {
        **spec.row(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "peak_memory_bytes": peak,
        "step_time_s": step_time,
        "tokens_per_s": spec.batch_size * spec.seq_len / step_time,
        "status": "ok",
    }


def measure_split(spec: StepSpec) -> dict:
    """The step split across ``spec.tensor_parallel`` processes started here, each measuring itself: the largest
    peak and the slowest step of them."""
    import tempfile  # the split step only

    import torch.multiprocessing as mp  # distributed: the split step only

    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_measure_rank, args=(spec.to_json(), folder), nprocs=spec.tensor_parallel)
        ranks = [json.loads((Path(folder) / f"rank{r}.json").read_text()) for r in range(spec.tensor_parallel)]
    if any(rank["status"] != "ok" for rank in ranks):
        return next(rank for rank in ranks if rank["status"] != "ok")
    slowest = max(ranks, key=lambda rank: rank["step_time_s"])
    return {**slowest, "peak_memory_bytes": max(rank["peak_memory_bytes"] for rank in ranks),
            "parameters": ranks[0]["parameters"]}  # fmt: skip


def _measure_rank(rank: int, spec_json: str, folder: str) -> None:
    """One process of a split step: its share of the threads, the group, the measurement into ``folder``."""
    import torch.distributed as dist  # distributed: the split step only
    from torch.distributed.device_mesh import init_device_mesh

    spec = StepSpec.from_json(spec_json)
    cuda = spec.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(max(1, torch.get_num_threads() // spec.tensor_parallel))
    init = f"file://{folder}/init"
    dist.init_process_group("nccl" if cuda else "gloo", init_method=init, rank=rank, world_size=spec.tensor_parallel)
    mesh = init_device_mesh("cuda" if cuda else "cpu", (spec.tensor_parallel,))
    try:
        result = measure(spec, tp_mesh=mesh)
    except torch.OutOfMemoryError:
        result = {**spec.row(), "status": "out of memory"}
    (Path(folder) / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    spec = StepSpec.from_json(sys.argv[1])
    try:
        result = measure(spec)
    except torch.OutOfMemoryError:
        result = {**spec.row(), "status": "out of memory"}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
