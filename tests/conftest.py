import os
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(ROOT))
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(autouse=True)
def eager_commands_by_default(request, monkeypatch):
    """The commands' decoding steps eager unless a test gives --compile (or a config compile: true), or is marked
    ``compiled_by_default``: compiling a tiny model's step takes far longer than its whole decode. A command run in
    a subprocess compiles by default on a CPU; give it --no-compile."""
    if request.node.get_closest_marker("compiled_by_default") is None:
        from mtp.commands import schema

        monkeypatch.setattr(schema, "COMPILED_ON", ())


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    """A small corpus of real code: 60 standard-library modules as .txt files."""
    from mtp.data.sources import stdlib_files

    out = tmp_path_factory.mktemp("corpus")
    files = [f for f in stdlib_files() if 2_000 < f.stat().st_size < 40_000][:60]
    for i, f in enumerate(files):
        (out / f"doc{i:03d}.txt").write_text(f.read_text(encoding="utf-8", errors="replace"))
    return out


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory) -> Path:
    """One data cache for the session, so tests that share settings reuse one packed corpus."""
    return tmp_path_factory.mktemp("cache")


def compose_train(overrides: list[str]) -> DictConfig:
    """The composed config, with Hydra's record of the overrides (cfg.hydra), as a run from the command line has."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="train", overrides=overrides, return_hydra_config=True)


def tiny_overrides(model: str, corpus_dir: Path, cache: Path) -> list[str]:
    """The real config tree with tiny sizes, the test corpus and a shared data cache."""
    overrides = [
        f"model={model}",
        "size=tiny",
        "data=files",
        f"data.source.paths=[{corpus_dir}/*.txt]",
        f"data.cache_dir={cache}",
        "data.seq_len=32",
        "data.batch_size=4",
        "data.val_fraction=0.1",
        "trainer.accelerator=cpu",
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
        "trainer.limit_val_batches=2",
        "trainer.log_every_n_steps=1",
        "trainer.enable_progress_bar=false",
        "optim.warmup_steps=1",
    ]
    if model.startswith("mtp"):
        overrides.append("model.vocab_size=512")
    return overrides


def compose_in(overrides: list[str], output_dir: Path) -> DictConfig:
    cfg = compose_train(overrides)
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir / "run")
        cfg.paths.log_dir = str(output_dir / "logs")
    return cfg


@pytest.fixture
def make_cfg(corpus_dir, shared_cache, tmp_path):
    """Compose the real config tree with tiny sizes, the test corpus and tmp output folders."""

    def make(model: str = "mtp4", extra: list[str] = ()) -> DictConfig:
        return compose_in(tiny_overrides(model, corpus_dir, shared_cache) + list(extra), tmp_path)

    return make


@pytest.fixture(scope="session")
def tiny_checkpoints(corpus_dir, shared_cache, tmp_path_factory) -> dict[str, Path]:
    """last.ckpt of a tiny BPE mtp4 and a tiny byte8 model, trained for 40 steps on the test corpus."""
    from mtp.training.train import train

    checkpoints = {}
    for preset in ("mtp4", "byte8"):
        out = tmp_path_factory.mktemp(preset)
        steps = ["trainer.max_steps=40", "trainer.val_check_interval=20", "optim.lr=1e-2"]
        train(compose_in(tiny_overrides(preset, corpus_dir, shared_cache) + steps, out))
        checkpoints[preset] = out / "run" / "checkpoints" / "last.ckpt"
    return checkpoints


@pytest.fixture(scope="session")
def trained_model():
    """A 4-head model trained for a few seconds on a counting pattern, so that most drafts are accepted."""
    from tests.decode.helpers import tiny_model, train_on_cycles

    return train_on_cycles(tiny_model(n_future=4, vocab_size=24, seed=1))


@pytest.fixture(scope="session")
def trained_models(trained_model):
    """trained_model's counterpart for every head type (trained on first use), by the names of helpers.HEAD_TYPES."""
    from tests.decode.helpers import HEAD_TYPES, tiny_model, train_on_cycles

    models = {"transformer": trained_model}

    def get(name: str):
        if name not in models:
            models[name] = train_on_cycles(tiny_model(n_future=4, vocab_size=24, seed=1, **HEAD_TYPES[name]))
        return models[name]

    return get


def pytest_collection_modifyitems(config, items):
    """Tests marked gpu need CUDA: without it they are skipped, with the reason shown."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run scripts/gpu_check.py on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
