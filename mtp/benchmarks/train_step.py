"""Peak memory and step time of full training steps for one configuration, measured in this process.

Run as ``python -m mtp.benchmarks.train_step '<json spec>'``; prints one JSON line. The parent
(scripts/bench_train.py) starts a fresh process per configuration so that peak figures never mix.

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` minus the memory allocated after the model
was built; on CPU the process's peak resident set (``ru_maxrss``) minus its resident set after the
model was built. Both therefore count activations, logits, gradients and optimizer state.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from mtp.config import LossConfig, ModelConfig
from mtp.model import MTPModel
from mtp.training.loss import mtp_loss
from mtp.training.optim import parameter_groups
from mtp.training.parallel import parallelize


@dataclass
class StepSpec:
    n_future: int
    vocab_size: int
    loss: str
    head_type: str = "transformer"
    d_model: int = 256
    n_layers: int = 9
    n_heads: int = 4
    n_kv_heads: int = 2
    seq_len: int = 128
    batch_size: int = 4
    loss_chunk: int = 0
    head_loss: str = "ce"
    steps: int = 3
    warmup: int = 1
    device: str = "cpu"
    bf16: bool = False
    activation_checkpointing: bool = False
    compile: bool = False
    seed: int = 0
    model: dict[str, Any] | None = None
    """A whole ModelConfig (:meth:`~mtp.config.ModelConfig.to_dict`, e.g. a checkpoint's) to time instead of the one
    the fields above describe (they then only label the row); its context becomes ``seq_len``."""
    loss_config: dict[str, Any] | None = None
    """A whole LossConfig (:meth:`~mtp.config.LossConfig.to_dict`, e.g. a checkpoint's) to train with instead of the
    one ``loss``, ``loss_chunk`` and ``head_loss`` describe (they then only label the row)."""

    @classmethod
    def of_model(cls, config: ModelConfig, loss: LossConfig, **shape: Any) -> StepSpec:
        """The step of ``config``'s model, every field of it (head type, shared depth, medusa layers, ...), trained
        under ``loss``, in ``shape`` (seq_len, batch_size, steps, device, bf16, ...)."""
        labels = ("n_future", "vocab_size", "head_type", "d_model", "n_layers", "n_heads", "n_kv_heads")
        return cls(
            **{name: getattr(config, name) for name in labels},
            loss=loss.mode,
            loss_chunk=loss.loss_chunk,
            head_loss=loss.head_loss,
            **shape,
            model=config.to_dict(),
            loss_config=loss.to_dict(),
        )

    def model_config(self) -> ModelConfig:
        """The model this step trains."""
        if self.model is not None:
            return replace(ModelConfig.from_dict(self.model), max_seq_len=self.seq_len)
        return ModelConfig(
            vocab_size=self.vocab_size,
            d_model=self.d_model,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            n_future=self.n_future,
            head_type=self.head_type,
            max_seq_len=self.seq_len,
        )

    def loss_settings(self) -> LossConfig:
        """The loss this step trains with."""
        if self.loss_config is not None:
            return LossConfig.from_dict(self.loss_config)
        return LossConfig(mode=self.loss, loss_chunk=self.loss_chunk, head_loss=self.head_loss)


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def peak_resident_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def measure(spec: StepSpec) -> dict:
    torch.manual_seed(spec.seed)
    device = torch.device(spec.device)
    cuda = device.type == "cuda"
    config, loss_settings = spec.model_config(), spec.loss_settings()
    loss_settings.check_model(config)
    model = MTPModel(config).to(device)
    parallelize(model, activation_checkpointing=spec.activation_checkpointing, compile=spec.compile)
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
        **asdict(spec),
        "parameters": sum(p.numel() for p in model.parameters()),
        "peak_memory_bytes": peak,
        "step_time_s": step_time,
        "tokens_per_s": spec.batch_size * spec.seq_len / step_time,
        "status": "ok",
    }


def main() -> None:
    spec = StepSpec(**json.loads(sys.argv[1]))
    try:
        result = measure(spec)
    except torch.OutOfMemoryError:
        result = {**asdict(spec), "status": "out of memory"}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
