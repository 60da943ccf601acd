"""Tensor parallelism (trainer=tp) on CPU with gloo: the gradients of 2 processes (TP=2) and of 4 (TP=2 x FSDP2=2)
equal one process's, for every head type that trains on a shared trunk, under the sequential loss with the corpus's
targets and with distillation from head 1; the loss's vocabulary-parallel pieces equal their one-process forms; a
model that cannot be split is refused in one sentence."""

import itertools
import os
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mtp.errors import UserError
from mtp.model import MTPModel
from mtp.model.config import ModelConfig
from mtp.model.heads import HEADS
from mtp.training import loss as loss_module
from mtp.training.loss import mtp_loss
from mtp.training.loss_config import LossConfig
from mtp.training.parallel import check_tensor_parallel, check_tensor_parallel_loss, is_sharded, parallelize

HEAD_TYPES = {
    "transformer": {"head_type": "transformer"},
    "linear": {"head_type": "linear"},
    "causal": {"head_type": "causal"},
    "causal-shared": {"head_type": "causal", "share_depth": True},
    "medusa": {"head_type": "medusa"},
}
LOSSES = {"ce": {}, "distill": {"head_loss": "distill"}, "ce+distill": {"head_loss": "ce+distill", "loss_chunk": 5}}
CASES = [(n, head, "ce") for n, head in itertools.product([1, 2], ["transformer"])]
CASES += [(4, head, loss) for head, loss in itertools.product(HEAD_TYPES, LOSSES)]
VOCAB = 96  # divisible by the tensor-parallel size


def build(n_future: int, head_type: str) -> MTPModel:
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=VOCAB, d_model=32, n_layers=6, n_heads=4, n_kv_heads=2, n_future=n_future, **HEAD_TYPES[head_type]
    )
    model = MTPModel(config)
    with torch.no_grad():  # medusa's zero-initialised residual weights off zero, so that their gradients carry
        for name, p in model.named_parameters():
            if name.startswith("heads.residuals"):
                p.normal_(0, 0.02)
    return model


def window(n_future: int, batch: int = 4) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, 16 + n_future), generator=torch.Generator().manual_seed(1))


def gradients(model: MTPModel, tokens: torch.Tensor, mode: str, loss: str) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    mtp_loss(model, tokens, LossConfig(mode=mode, **LOSSES[loss])).total.backward()
    return {name: p.grad for name, p in model.named_parameters()}


def tp_worker(rank: int, world: int, tp: int, init_file: str, results: str) -> None:
    """Every case: the sequential loss on this data-parallel group's share of the batch, split tp ways; the gathered
    gradients against one process's naive loss on the whole batch."""
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("data_parallel", "tensor_parallel"))
    dp_mesh = mesh["data_parallel"] if world > tp else None
    rows = set()  # the vocabulary rows of every weight the sequential loss scores with: this process's share only
    function = loss_module._HeadsCrossEntropy
    apply = function.apply

    def recording(*args):
        n_heads = args[4]
        rows.update(weight.size(0) for weight in args[8 + n_heads :])
        return apply(*args)

    function.apply = recording
    worst = {}
    for n_future, head_type, loss in CASES:
        tokens = window(n_future)
        expected = gradients(build(n_future, head_type), tokens, "naive", loss)  # one process, the whole batch
        model = parallelize(build(n_future, head_type), tp_mesh=mesh["tensor_parallel"], mesh=dp_mesh)
        assert is_sharded(model)
        share = tokens.chunk(world // tp)[mesh["data_parallel"].get_local_rank()]
        split = gradients(model, share, "sequential", loss)
        assert split.keys() == expected.keys()
        worst[(n_future, head_type, loss)] = max(
            ((grad.full_tensor() - expected[name]).norm() / expected[name].norm().clamp(min=1e-12)).item()
            for name, grad in split.items()
        )
    worst["rows"] = sorted(rows)
    if rank == 0:
        torch.save(worst, results)
    dist.barrier()  # both ranks tear gloo down together (see tests/test_parallel.py's fsdp_worker)
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.mark.slow
@pytest.mark.parametrize("world, tp", [(2, 2), (4, 2)])
def test_tensor_parallel_gradients_equal_one_process(world, tp, tmp_path):
    results = str(tmp_path / "worst.pt")
    mp.spawn(tp_worker, args=(world, tp, tempfile.mktemp(dir=tmp_path), results), nprocs=world)
    worst = torch.load(results, weights_only=False)
    assert worst.pop("rows") == [VOCAB // tp]  # never the whole vocabulary
    assert set(worst) == set(CASES)
    for case, error in worst.items():
        assert error < 1e-5, f"n_future, head type, loss = {case}: relative error {error:.2e}"


def parts_worker(rank: int, init_file: str, results: str) -> None:
    """The vocabulary-parallel pieces on two halves of a vocabulary against their one-process forms."""
    from mtp.training import vocab_parallel as vp

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 10)
    ids = torch.randint(0, 10, (3, 5, 4))
    part = vp.VocabPart(torch.empty(5, 1), offset=5 * rank, group=dist.group.WORLD)
    mine = logits[..., 5 * rank : 5 * rank + 5]
    whole = vp.VocabPart(torch.empty(10, 1))
    ones = torch.ones(3, 5, 4)
    checks = {
        "logsumexp": (vp.logsumexp(mine, part.group), vp.logsumexp(logits, None)),
        "target": (vp.target_logits(mine, ids[..., :1], part), vp.target_logits(logits, ids[..., :1], whole)),
        "gather": (vp.gather(mine, ids, part), vp.gather(logits, ids, whole)),
        "top_k": (vp.top_k(mine, 3, part)[1], vp.top_k(logits, 3, whole)[1]),  # the same ids, in the same order
        "scatter": (vp.scatter_add(torch.zeros(3, 5, 5), ids, ones, part),
                    vp.scatter_add(torch.zeros(3, 5, 10), ids, ones, whole)[..., 5 * rank : 5 * rank + 5]),
    }  # fmt: skip
    errors = {name: (a - b).abs().max().item() for name, (a, b) in checks.items()}
    if rank == 0:
        torch.save(errors, results)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.mark.slow
def test_the_vocabulary_parallel_pieces_equal_their_one_process_forms(tmp_path):
    results = str(tmp_path / "errors.pt")
    mp.spawn(parts_worker, args=(tempfile.mktemp(dir=tmp_path), results), nprocs=2)
    errors = torch.load(results, weights_only=False)
    assert set(errors) == {"logsumexp", "target", "gather", "top_k", "scatter"}
    assert all(error < 1e-6 for error in errors.values()), errors


def config(**settings) -> ModelConfig:
    return ModelConfig(**{"vocab_size": 96, "d_model": 32, "n_layers": 6, "n_heads": 4, "n_kv_heads": 2,
                          "n_future": 2, **settings})  # fmt: skip


@pytest.mark.parametrize(
    "settings, tp, message",
    [
        ({"vocab_size": 97}, 2, r"^model.vocab_size=97 is not divisible by trainer.strategy.tensor_parallel_size=2"),
        ({"n_kv_heads": 1}, 2, r"^model.n_kv_heads=1 is not divisible by trainer.strategy.tensor_parallel_size=2"),
        ({}, 8, r"^model.n_heads=4 is not divisible by trainer.strategy.tensor_parallel_size=8"),
        ({"head_type": "eagle3", "n_layers": 8}, 2, r"^model.head_type=eagle3 heads read three trunk layers' inputs"),
        ({"draft_vocab": 32}, 2, r"^model.draft_vocab=32 picks draft tokens across the whole vocabulary"),
    ],
)
def test_a_model_tensor_parallelism_cannot_split_is_one_sentence(settings, tp, message):
    model_config = config(**settings)
    with pytest.raises(UserError, match=message) as caught:
        check_tensor_parallel(model_config, tp, HEADS[model_config.head_type])
    assert str(caught.value).count(". ") == 0 and str(caught.value).endswith(".")
    check_tensor_parallel(model_config, 1, HEADS[model_config.head_type])  # one process splits nothing


def test_detached_heads_under_tensor_parallelism_are_one_sentence():
    with pytest.raises(UserError, match=r"^loss.detach_heads=true is not computed under trainer.strategy.tensor_par"):
        check_tensor_parallel_loss(True, 2)
    check_tensor_parallel_loss(True, 1)
    check_tensor_parallel_loss(False, 2)


def test_a_bad_tensor_parallel_size_is_one_sentence(tmp_path):
    from mtp.training.strategy import MeshStrategy

    with pytest.raises(UserError, match=r"^trainer.strategy.tensor_parallel_size=0 must be a whole number"):
        MeshStrategy(tensor_parallel_size=0)
    from lightning.fabric.plugins.environments import LightningEnvironment

    strategy, processes = MeshStrategy(tensor_parallel_size=3), LightningEnvironment()
    processes.set_world_size(4)
    strategy.cluster_environment = processes
    with pytest.raises(UserError, match=r"^trainer.strategy.tensor_parallel_size=3 does not divide the 4 processes"):
        strategy.setup_environment()


@pytest.mark.slow
def test_trainer_tp_trains_as_one_process_does_and_its_checkpoints_decode_the_same_tokens(
    corpus_dir, shared_cache, tmp_path
):
    """trainer=tp as a user runs it on CPU (2 gloo processes, one tensor-parallel group, so both read the batches one
    process would): after 4 steps its weights are one process's to fp32 rounding, in the sharded checkpoint folder
    and in the full file alike, and both greedy-decode the tokens the one-process model does."""
    from mtp.checkpoint.load import load_checkpoint
    from mtp.decode import GenerationConfig, HeadsSettings, Plan, generate
    from tests.test_scripts import pretrain, tiny_data

    common = [*tiny_data(corpus_dir, shared_cache), "model=mtp2", "trainer.accelerator=cpu", "trainer.max_steps=4",
              "trainer.precision=32-true", "trainer.val_check_interval=2", "trainer.limit_val_batches=1",
              "trainer.enable_progress_bar=false"]  # fmt: skip
    runs = {
        "one": [],
        "split": ["trainer=tp", "trainer.devices=2"],
        "split-full": ["trainer=tp", "trainer.devices=2", "trainer.strategy.save_distributed_checkpoint=false"],
    }
    models = {}
    for name, extra in runs.items():
        result = pretrain(*common, *extra, f"hydra.run.dir={tmp_path / name}", tmp_path=tmp_path)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
        checkpoint = tmp_path / name / "checkpoints" / "last.ckpt"
        assert checkpoint.is_dir() == (name == "split")
        models[name] = load_checkpoint(checkpoint, "cpu", "float32").model
    expected = models["one"].state_dict()
    prompts = [[0, 5, 9, 2], [0, 7]]
    tokens, _ = generate(models["one"], prompts, Plan(GenerationConfig(max_new_tokens=12), HeadsSettings(heads=2)))
    for name in ("split", "split-full"):
        for key, tensor in models[name].state_dict().items():
            torch.testing.assert_close(tensor, expected[key], rtol=1e-4, atol=1e-5, msg=f"{name}: {key}")
        split_tokens, _ = generate(models[name], prompts, Plan(GenerationConfig(max_new_tokens=12)))
        assert split_tokens == tokens, name
