"""Trunk outputs of training windows kept while the trunk is frozen (heads trained on a pretrained model).

With the embedding and the trunk blocks frozen (``freeze=trunk`` or ``freeze=loaded``), the trunk's output for a
window never changes, yet every epoch would run the trunk again: on a CPU, for a 135M-parameter model with four
heads, the trunk is most of a step's time. The cache keeps each window's output after its first step, under the
window's own token ids, so the epochs after the first run only the heads. It is bounded: past ``max_bytes`` new
windows are computed each time, as without it. A cached output is the very tensor the trunk computed (same dtype,
under the same autocast, the same bytes), so a step computes exactly what it would without the cache.

Where the rows live:

- without a ``folder``, in the process's memory (:class:`MemoryRows`);
- with a ``folder`` (``trunk_cache_dir``), in one file of fixed-size rows there (:class:`FileRows`): a row is written
  when the trunk computes it and read back when a step needs it, so the process holds only the index (a window's ids
  to its row), and the kernel's page cache, which it hands back under pressure, holds the rows in between. The index is
  written whole after each epoch, under a hash of the trunk's weights, the window length and the compute dtype, and
  the next run on the same trunk and windows reads the rows back: heads of another type, or other settings, trained on
  the same data never run the trunk over it again. Per trunk, window length and dtype:
  ``trunk-<hash>-T<len>-<dtype>.rows`` (the rows) and ``.index.pt`` (their ids, written whole by
  :func:`mtp.files.write_whole`, read with ``torch.load(weights_only=True)``). Rows written after the last index (a
  run stopped within an epoch) are dropped when the file is opened again. A ``.pt`` file of earlier versions (every
  row in one file) is read once into the new files.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor

from mtp.errors import UserError
from mtp.files import write_whole
from mtp.model import MTPModel


class MemoryRows:
    """Rows kept as tensors in the process's memory (on the device they were computed on)."""

    def __init__(self) -> None:
        self.rows: dict[bytes, Tensor] = {}
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.rows)

    def __contains__(self, key: bytes) -> bool:
        return key in self.rows

    def keys(self) -> Iterator[bytes]:
        return iter(self.rows)

    def put(self, key: bytes, row: Tensor) -> None:
        self.rows[key] = row.clone()  # its own storage: the batch's tensor is not kept alive
        self.bytes += row.numel() * row.element_size()

    def get(self, keys: list[bytes], device: torch.device) -> Tensor:
        return torch.stack([self.rows[key] for key in keys])


class FileRows:
    """Rows in one file of fixed-size records, written as computed and read as needed: the process holds only the
    index (a key to its record). ``shape`` and ``dtype`` are a row's."""

    def __init__(self, path: Path, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self.path, self.shape, self.dtype = path, shape, dtype
        self.row_bytes = math.prod(shape) * dtype.itemsize
        self.index: dict[bytes, int] = {}
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def __del__(self) -> None:
        fd = getattr(self, "fd", None)
        if fd is not None:
            os.close(fd)
            self.fd = None

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, key: bytes) -> bool:
        return key in self.index

    def keys(self) -> Iterator[bytes]:
        return iter(self.index)

    @property
    def bytes(self) -> int:
        return len(self.index) * self.row_bytes

    def keep_first(self, count: int) -> None:
        """The file ends after its first ``count`` rows: rows past the index (a run stopped within an epoch) go."""
        os.ftruncate(self.fd, count * self.row_bytes)

    def put(self, key: bytes, row: Tensor) -> None:
        data = row.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        offset = len(self.index) * self.row_bytes
        written = os.pwrite(self.fd, data, offset)
        if written != self.row_bytes:
            raise OSError(f"{self.path}: wrote {written} of a row's {self.row_bytes} bytes (is the disk full?)")
        self.index[key] = len(self.index)

    def get(self, keys: list[bytes], device: torch.device) -> Tensor:
        out = torch.empty((len(keys), self.row_bytes), dtype=torch.uint8)
        buffer = out.numpy()
        for i, key in enumerate(keys):
            read = os.preadv(self.fd, [buffer[i]], self.index[key] * self.row_bytes)
            if read != self.row_bytes:
                raise OSError(f"{self.path} ends within row {self.index[key]}: delete it and its .index.pt")
        return out.view(self.dtype).view(len(keys), *self.shape).to(device)

    def sync(self) -> None:
        os.fsync(self.fd)


class TrunkCache:
    def __init__(self, model: MTPModel, max_bytes: int, folder: str | os.PathLike | None = None) -> None:
        self.model, self.max_bytes = model, max_bytes
        self.folder = Path(folder) if folder is not None else None
        self.rows: MemoryRows | FileRows = MemoryRows()  # with a folder: its file, once the window length is known
        self.hits = self.misses = 0
        self.file: Path | None = None  # the index file (with a folder), known at the first step
        self.trunk = ""  # the hash of the trunk's weights the files are named by
        self.saved = 0  # rows the index file holds

    @staticmethod
    def check_frozen(model: MTPModel) -> None:
        """A cache needs a trunk that does not train: one sentence with the fix otherwise."""
        trunk = [model.tok_embeddings.weight, *model.trunk_blocks.parameters()]
        if any(p.requires_grad for p in trunk):
            raise UserError(
                "trunk_cache_gb > 0 keeps the trunk's outputs, which change while the trunk trains; freeze it "
                "(init_from=... freeze=trunk or freeze=loaded) or set trunk_cache_gb=0."
            )

    @property
    def width(self) -> int:
        """A row's width: the output, and with EAGLE-3 the chosen layers' inputs beside it."""
        config = self.model.config
        return (len(config.feature_layers) + 1) * config.d_model

    def __call__(self, inputs: Tensor) -> Tensor:
        """The trunk's output (B, T, d) for token ids (B, T): kept rows where every row is kept, else computed (and
        kept while there is room). One host read of the ids per step: the rows' keys."""
        if self.folder is not None and self.file is None:
            self.open(inputs)
        keys = [row.tobytes() for row in inputs.cpu().numpy()]
        if all(key in self.rows for key in keys):
            self.hits += len(keys)
            return self.rows.get(keys, inputs.device)
        self.misses += len(keys)
        with torch.no_grad():
            trunk = self.model.trunk_features(inputs)
        for key, row in zip(keys, trunk, strict=True):
            self.keep(key, row)
        return trunk

    def keep(self, key: bytes, output: Tensor) -> None:
        size = output.numel() * output.element_size()
        if key not in self.rows and self.rows.bytes + size <= self.max_bytes:
            self.rows.put(key, output)

    def open(self, inputs: Tensor) -> None:
        """The folder's files for this trunk, window length and dtype, and what an earlier run wrote there, as far as
        the budget holds it."""
        device = inputs.device.type  # outputs differ under autocast: its dtype names the file too
        dtype = self.model.tok_embeddings.weight.dtype
        if torch.is_autocast_enabled(device):
            dtype = torch.get_autocast_dtype(device)
        self.trunk = trunk_hash(self.model)
        stem = f"trunk-{self.trunk}-T{inputs.size(1)}-{str(dtype)[6:]}"
        self.file = self.folder / f"{stem}.index.pt"
        rows = FileRows(self.folder / f"{stem}.rows", (inputs.size(1), self.width), dtype)
        stored = self.read_index()
        count = 0
        if stored is not None:
            whole = os.fstat(rows.fd).st_size // rows.row_bytes  # a file cut short keeps its whole rows
            count = min(len(stored["ids"]), whole, self.max_bytes // rows.row_bytes)
            rows.index = {ids.tobytes(): i for i, ids in enumerate(stored["ids"][:count].numpy())}
        rows.keep_first(count)
        self.rows, self.saved = rows, count
        legacy = self.folder / f"{stem}.pt"
        if stored is None and legacy.is_file():
            for ids, row in self.read_legacy(legacy):
                self.keep(ids.tobytes(), row)

    def read_index(self) -> dict | None:
        """The index an earlier run wrote, checked to be this trunk's; None where there is none (or it is damaged)."""
        if not self.file.is_file():
            return None
        try:
            stored = torch.load(self.file, weights_only=True)
        except Exception:  # a damaged index is only a lost cache: the trunk computes those windows again
            return None
        self.check_written_for(stored.get("trunk", self.trunk), stored.get("width", self.width), self.file.name)
        return stored

    def read_legacy(self, path: Path) -> Iterator[tuple[object, Tensor]]:
        """The rows of a file of earlier versions: every row in one ``.pt`` file, read mapped."""
        try:
            stored = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception:
            return iter(())
        rows = stored["rows"] if "rows" in stored else list(stored["outputs"])  # files before rows: one stacked tensor
        wide = rows[0].size(-1) if rows else self.width
        self.check_written_for(stored.get("trunk", self.trunk), wide, path.name)
        return zip(stored["ids"].numpy(), rows, strict=True)

    def check_written_for(self, trunk: str, wide: int, name: str) -> None:
        if trunk != self.trunk or wide != self.width:
            raise UserError(
                f"trunk_cache_dir holds {name}, written for another trunk or other layers than this model's "
                f"(outputs {wide} wide, this model's {self.width}); delete that file or point trunk_cache_dir at "
                "another folder."
            )

    def save(self) -> None:
        """Write the index of the rows the file holds, if it holds more than the index says (written whole, after
        the rows are on disk)."""
        if self.file is None or not isinstance(self.rows, FileRows) or len(self.rows) <= self.saved:
            return
        self.rows.sync()
        ids = torch.stack([torch.frombuffer(bytearray(key), dtype=torch.long) for key in self.rows.keys()])
        stored = {"ids": ids, "trunk": self.trunk, "width": self.width}
        write_whole(self.file, lambda f: torch.save(stored, f))
        self.saved = len(self.rows)


MEMORY_SHARE = 0.5
"""The most of the machine's available memory (when training starts), or of the cache folder's free disk, the cache
may hold, whatever its budget says."""


def available_memory() -> int | None:
    """The memory the kernel says is available to start new work without swapping (``MemAvailable``), in bytes; None
    where it does not say (not Linux)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def free_disk(folder: str | os.PathLike) -> int | None:
    """The free bytes on the disk that holds ``folder`` (or the nearest folder above it that exists)."""
    path = Path(folder).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def cache_room(folder: str | os.PathLike | None) -> tuple[int | None, str]:
    """What bounds a cache: the memory available now (no ``folder``), or the free disk of its folder with what the
    folder's row files already hold; and the words that say which."""
    if folder is None:
        return available_memory(), "this machine has available"
    free = free_disk(folder)
    if free is None:
        return None, ""
    held = sum(path.stat().st_size for path in Path(folder).glob("trunk-*.rows")) if Path(folder).is_dir() else 0
    return free + held, f"free on the disk of trunk_cache_dir={folder}"


def cache_budget(
    asked: int, available: int | None, where: str = "this machine has available"
) -> tuple[int, str | None]:
    """The bytes the cache may hold: ``asked`` (``trunk_cache_gb``), or at most :data:`MEMORY_SHARE` of the
    ``available`` bytes (memory, or a folder's free disk: ``where`` says which); with a note to say where that bounds
    it (None: as asked)."""
    if available is None or asked <= MEMORY_SHARE * available:
        return asked, None
    bound = int(MEMORY_SHARE * available)
    return bound, (
        f"trunk cache: {bound / 2**30:.1f} GiB, half the {available / 2**30:.1f} GiB {where}, not the "
        f"trunk_cache_gb={asked / 2**30:g} asked; windows past it run the trunk each epoch"
    )


def trunk_hash(model: MTPModel) -> str:
    """A hash of what decides the trunk's outputs: its weights (embedding, trunk blocks) and rotary settings."""
    config = model.config
    digest = hashlib.sha256(repr((config.rope_theta, config.norm_eps, len(model.trunk_blocks))).encode())
    if config.feature_layers:  # the layers' inputs kept beside the output (mtp.model.MTPModel.trunk_features)
        digest.update(repr(("features", config.feature_layers)).encode())
    for parameter in [model.tok_embeddings.weight, *model.trunk_blocks.parameters()]:
        digest.update(parameter.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]
