"""Scale: sequential loss under FSDP2 (2 gloo processes on CPU), activation checkpointing, compile, frozen weights."""

import itertools
import os
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mtp.model import MTPModel
from mtp.model.config import ModelConfig
from mtp.training.loss import mtp_loss
from mtp.training.loss_config import LossConfig
from mtp.training.parallel import parallelize

WORLD = 2
FSDP_CASES = list(itertools.product([1, 2, 4], ["transformer", "linear"], [False, True])) + list(
    itertools.product([4], ["causal", "causal-shared", "medusa"], [False, True])
)
VARIANTS = {"causal-shared": {"head_type": "causal", "share_depth": True}}


def build(n_future: int = 4, head_type: str = "transformer", **kwargs) -> MTPModel:
    torch.manual_seed(0)
    settings = VARIANTS.get(head_type, {"head_type": head_type})
    config = ModelConfig(
        vocab_size=97, d_model=32, n_layers=6, n_heads=4, n_kv_heads=2, n_future=n_future, **settings, **kwargs
    )
    model = MTPModel(config)
    with torch.no_grad():  # medusa's zero-initialised residual weights off zero, so that their gradients carry
        for name, p in model.named_parameters():
            if name.startswith("heads.residuals"):
                p.normal_(0, 0.02)
    return model


def window(n_future: int, batch: int = 4) -> torch.Tensor:
    return torch.randint(0, 97, (batch, 16 + n_future), generator=torch.Generator().manual_seed(1))


def gradients(model: MTPModel, tokens: torch.Tensor, mode: str) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    mtp_loss(model, tokens, LossConfig(mode=mode)).total.backward()
    return {name: p.grad for name, p in model.named_parameters()}


def fsdp_worker(rank: int, init_file: str, results: str) -> None:
    """Every case: sequential loss on this rank's half of the batch under FSDP2, gathered gradients vs naive alone."""
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (WORLD,))
    worst = {}
    for n_future, head_type, checkpointing in FSDP_CASES:
        tokens = window(n_future)
        expected = gradients(build(n_future, head_type), tokens, "naive")  # one process, the whole batch
        model = parallelize(build(n_future, head_type), activation_checkpointing=checkpointing, mesh=mesh)
        sharded = gradients(model, tokens.chunk(WORLD)[rank], "sequential")
        assert sharded.keys() == expected.keys()
        worst[(n_future, head_type, checkpointing)] = max(
            ((grad.full_tensor() - expected[name]).norm() / expected[name].norm()).item()
            for name, grad in sharded.items()
        )
    if rank == 0:
        torch.save(worst, results)
    # both ranks tear gloo down together: a rank that destroys its group while its peer still runs can abort the peer
    dist.barrier()
    dist.destroy_process_group()
    # and skip the interpreter's finalisation: gloo's worker threads can still hold tensors then, whose release takes
    # the GIL of an interpreter being torn down ("terminate called without an active exception", SIGABRT after the
    # results were saved, twice in CI; pytorch/pytorch#179291). The results are on disk; a failure above still raises.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.mark.slow
def test_fsdp2_sequential_gradients_equal_single_process_naive(tmp_path):
    """n in {1, 2, 4}, transformer and linear heads (causal, shared causal and medusa at n=4), with and without
    activation checkpointing."""
    results = str(tmp_path / "worst.pt")
    mp.spawn(fsdp_worker, args=(tempfile.mktemp(dir=tmp_path), results), nprocs=WORLD)
    worst = torch.load(results, weights_only=False)
    assert set(worst) == set(FSDP_CASES)
    for case, error in worst.items():
        assert error < 1e-5, f"n_future, head type, checkpointing = {case}: relative error {error:.2e}"


def saved_tensor_count(model: MTPModel, tokens: torch.Tensor) -> int:
    """Tensors autograd keeps from the forward for the backward."""
    count = 0

    def pack(tensor):
        nonlocal count
        count += 1
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = mtp_loss(model, tokens).total
    loss.backward()
    return count


@pytest.mark.parametrize("head_type", ["transformer", "linear", "causal"])
@pytest.mark.parametrize("mode", ["sequential", "naive"])
def test_activation_checkpointing_keeps_gradients_and_drops_saved_activations(head_type, mode):
    tokens = window(4)
    plain, checkpointed = (
        build(head_type=head_type),
        parallelize(build(head_type=head_type), activation_checkpointing=True),
    )
    expected, got = gradients(plain, tokens, mode), gradients(checkpointed, tokens, mode)
    assert list(got) == list(expected)  # parameter names unchanged
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    # a block keeps its input and nothing else: far fewer saved tensors than the ~20 per block without checkpointing
    blocks = len(plain.blocks())
    assert saved_tensor_count(checkpointed, tokens) < saved_tensor_count(plain, tokens) - 10 * blocks


@pytest.mark.slow
@pytest.mark.parametrize("head_type", ["transformer", "causal-shared"])
def test_compiled_blocks_train_like_eager(head_type):
    """Three AdamW steps, both loss modes: losses within 1e-4 of eager with every block compiled (and checkpointed)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    def losses(mode: str, **techniques) -> list[float]:
        model = parallelize(build(head_type=head_type), **techniques)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        values = []
        for step in range(3):
            loss = mtp_loss(model, window(4, batch=4 + step), LossConfig(mode=mode)).total
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            values.append(loss.item())
        return values

    torch._dynamo.reset()
    counters.clear()
    for mode in ("sequential", "naive"):
        eager = torch.tensor(losses(mode))
        for techniques in ({"compile": True}, {"compile": True, "activation_checkpointing": True}):
            compiled = torch.tensor(losses(mode, **techniques))
            torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4, msg=f"{mode} {techniques}")
    assert counters["stats"]["unique_graphs"] >= 2  # the blocks really ran compiled graphs (with and without AC)


def test_compile_and_checkpointing_keep_parameter_names():
    names = [name for name, _ in build().named_parameters()]
    model = parallelize(build(), compile=True, activation_checkpointing=True)
    assert [name for name, _ in model.named_parameters()] == names
    assert list(model.state_dict()) == list(build().state_dict())


@pytest.mark.parametrize("head_type", ["transformer", "linear", "causal", "medusa"])
def test_a_frozen_weight_on_a_head_path_gets_no_gradient(head_type):
    tokens = window(4)
    results = {}
    for mode in ("naive", "sequential"):
        model = build(head_type=head_type)
        model.heads.outputs[0].weight.requires_grad_(False)  # the (first) unembedding
        model.norm.weight.requires_grad_(False)  # the shared norm
        grads = gradients(model, tokens, mode)
        assert grads["heads.outputs.0.weight"] is None and grads["norm.weight"] is None
        results[mode] = grads
    for name, grad in results["naive"].items():
        if grad is not None:
            torch.testing.assert_close(results["sequential"][name], grad, rtol=1e-5, atol=1e-7, msg=name)
