"""The GPU check kit's tests (marked gpu, skipped without CUDA; scripts/gpu_check.py runs them on a GPU machine)."""

import copy
import gc
from pathlib import Path

import lightning as L
import pytest
import torch

from mtp.checkpoint.load import load_checkpoint
from mtp.decode import GenerationConfig, generate
from mtp.decode.plan import Plan
from mtp.decode.settings import HeadsSettings, StepSettings
from mtp.decode.tree import full_tree
from mtp.model import MTPModel
from mtp.model.config import ModelConfig
from mtp.training.loss import mtp_loss
from mtp.training.loss_config import LossConfig
from mtp.training.parallel import parallelize
from mtp.training.train import train
from tests.decode.helpers import tiny_model

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
    reference, _ = generate(model, prompts, Plan(GenerationConfig(max_new_tokens=40), HeadsSettings(heads=1)))
    for heads in (2, 3, 4):
        out, stats = generate(model, prompts, Plan(GenerationConfig(max_new_tokens=40), HeadsSettings(heads=heads)))
        assert out == reference, f"heads={heads}"
        assert min(stats.acceptance) > 0.5


def cuda_copy(model: MTPModel, dtype: torch.dtype = torch.float32) -> MTPModel:
    copied = copy.deepcopy(model).cuda().to(dtype)
    copied.rope_cos, copied.rope_sin = copied.rope_cos.float(), copied.rope_sin.float()
    return copied


CAPTURED_PROMPTS = [[1, 2], [7, 8, 9, 10, 11], [20], [3, 4, 5]]


def test_captured_steps_decode_what_eager_steps_do(trained_models):
    """CUDA graphs: greedy and sampled (same seed) autoregressive decoding, chains, a tree and causal heads, batches
    whose rows accept different drafts and end at different steps (rows leave: a new shape, captured again), spans
    across a bucket (128 positions): the same tokens and acceptance as eager steps, and a second call replays the first
    one's graphs. The sampling rules are lossless eagerly (tests/decode/test_lossless.py); the captured steps draw the
    same tokens from the same uniforms."""
    for head_type in ("transformer", "causal"):
        for model in (cuda_copy(trained_models(head_type)), cuda_copy(tiny_model(seed=2, vocab_size=24))):
            for heads, tree in ((1, None), (4, None), (3, full_tree(2, 2) if head_type == "transformer" else None)):
                for extra in ({}, {"temperature": 1.0, "seed": 3, "eos_id": 0}):
                    config = Plan().changed(max_new_tokens=130, heads=heads, tree=tree, **extra)
                    eager, eager_stats = generate(model, CAPTURED_PROMPTS, config)
                    captured, stats = generate(model, CAPTURED_PROMPTS, config.changed(cuda_graphs=True))
                    assert captured == eager, (head_type, config)
                    assert stats.accepted == eager_stats.accepted and (stats.captures > 0 or extra)  # greedy's first
    again, replayed = generate(model, CAPTURED_PROMPTS, config.changed(cuda_graphs=True))
    assert again == eager and replayed.captures == 0  # every batch size it shrank through replays


def test_captured_bf16_steps_decode_what_eager_bf16_steps_do(trained_model):
    model, prompts = cuda_copy(trained_model, torch.bfloat16), CAPTURED_PROMPTS[:1]
    for heads in (1, 4):
        config = Plan(GenerationConfig(max_new_tokens=130), heads=HeadsSettings(heads=heads))
        captured, stats = generate(model, prompts, config.changed(cuda_graphs=True))
        assert captured == generate(model, prompts, config)[0] and stats.captures > 0
        assert generate(model, prompts, config.changed(cuda_graphs=True))[1].captures == 0  # one row: same shapes


def test_captured_graphs_and_their_storage_are_released_with_the_model(trained_model):
    torch.cuda.synchronize()
    gc.collect()
    before = torch.cuda.memory_allocated()
    model = cuda_copy(trained_model)
    for batch in (1, 2, 4):
        generate(
            model,
            CAPTURED_PROMPTS[:batch],
            Plan(
                GenerationConfig(max_new_tokens=60), heads=HeadsSettings(heads=4), step=StepSettings(cuda_graphs=True)
            ),
        )
    assert torch.cuda.memory_allocated() > before
    del model
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= before + 4096, "graphs or cache storage outlive their model"
