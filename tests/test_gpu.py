"""The GPU check kit's tests (marked gpu, skipped without CUDA; scripts/gpu_check.py runs them on a GPU machine)."""

from pathlib import Path

import lightning as L
import pytest
import torch

from mtp.checkpoint.load import load_checkpoint
from mtp.config import LossConfig, ModelConfig
from mtp.decode import GenerationConfig, generate
from mtp.model import MTPModel
from mtp.training.loss import mtp_loss
from mtp.training.parallel import parallelize
from mtp.training.train import train

pytestmark = pytest.mark.gpu

BF16_RELATIVE = 3e-2  # bf16 matmuls: about 3 significant digits


def build(**kwargs) -> MTPModel:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=4096, d_model=256, n_layers=8, n_heads=8, n_kv_heads=4, n_future=4, **kwargs)
    return MTPModel(config).cuda()


def windows(batch: int = 4, length: int = 260) -> torch.Tensor:
    return torch.randint(0, 4096, (batch, length), generator=torch.Generator().manual_seed(1)).cuda()


def bf16_step(model: MTPModel, tokens: torch.Tensor, mode: str) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = mtp_loss(model, tokens, LossConfig(mode=mode)).total
    loss.backward()
    return loss.item(), {name: p.grad.float() for name, p in model.named_parameters()}


def test_bf16_mixed_step_sequential_and_naive_agree():
    model, tokens = build(), windows()
    naive_loss, naive = bf16_step(model, tokens, "naive")
    sequential_loss, sequential = bf16_step(model, tokens, "sequential")
    assert sequential_loss == pytest.approx(naive_loss, rel=1e-2)
    for name, grad in naive.items():
        relative = ((sequential[name] - grad).norm() / grad.norm()).item()
        assert relative < BF16_RELATIVE, f"{name}: {relative:.2e}"


def test_compiled_and_checkpointed_blocks_match_eager_in_bf16():
    tokens = windows()
    eager_loss, eager = bf16_step(build(), tokens, "sequential")
    for techniques in ({"compile": True}, {"compile": True, "activation_checkpointing": True}):
        loss, grads = bf16_step(parallelize(build(), **techniques), tokens, "sequential")
        assert loss == pytest.approx(eager_loss, rel=1e-2), techniques
        for name, grad in eager.items():
            assert ((grads[name] - grad).norm() / grad.norm()).item() < BF16_RELATIVE, (techniques, name)


class RecordOptimizer(L.Callback):
    def on_train_start(self, trainer, pl_module) -> None:
        self.fused = trainer.optimizers[0].defaults.get("fused")
        # the optimizer's weights (fp32 master copies); not the module's: under FSDP2 the root keeps its parameters
        # gathered in bf16 after a forward (the sanity check's), which module.parameters() then returns
        self.dtype = trainer.optimizers[0].param_groups[0]["params"][0].dtype


@pytest.mark.parametrize("trainer", ["gpu", "fsdp"])
def test_lightning_bf16_run_with_fused_adamw_writes_a_loadable_checkpoint(make_cfg, trainer):
    record = RecordOptimizer()
    cfg = make_cfg("mtp4", [f"trainer={trainer}", "trainer.accelerator=gpu", "trainer.devices=1", "compile=true"])
    metrics = train(cfg, callbacks=[record])
    assert record.fused is True and record.dtype == torch.float32  # fp32 master weights, bf16 compute
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))
    loaded = load_checkpoint(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt", "cuda")
    assert next(loaded.model.parameters()).dtype == torch.bfloat16  # the decoding dtype policy on CUDA


def test_bf16_greedy_self_speculative_equals_autoregressive(trained_model):
    model = trained_model.cuda().to(torch.bfloat16)
    model.rope_cos, model.rope_sin = model.rope_cos.float(), model.rope_sin.float()
    prompts = [[1, 2], [7, 8, 9, 10, 11], [20]]
    reference, _ = generate(model, prompts, GenerationConfig(max_new_tokens=40, heads=1))
    for heads in (2, 3, 4):
        out, stats = generate(model, prompts, GenerationConfig(max_new_tokens=40, heads=heads))
        assert out == reference, f"heads={heads}"
        assert min(stats.acceptance) > 0.5
