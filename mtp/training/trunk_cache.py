"""Trunk outputs of training windows kept in memory while the trunk is frozen (heads trained on a pretrained model).

With the embedding and the trunk blocks frozen (``freeze=trunk`` or ``freeze=loaded``), the trunk's output for a
window never changes, yet every epoch would run the trunk again: on a CPU, for a 135M-parameter model with four
heads, the trunk is most of a step's time. The cache keeps each window's output after its first step, under the
window's own token ids, so the epochs after the first run only the heads. It is bounded: past ``max_bytes`` new
windows are computed each time, as without it. A cached output is the very tensor the trunk computed (same dtype,
under the same autocast), so a step computes exactly what it would without the cache.

With a ``folder`` (``trunk_cache_dir``), what the cache holds is also written there after each epoch, under a hash
of the trunk's weights, the window length and the compute dtype, and read back by the next run on the same trunk
and windows: heads of another type, or other settings, trained on the same data never run the trunk over it again.
One file per trunk, window length and dtype (``trunk-<hash>-T<len>-<dtype>.pt``, written whole by
:func:`mtp.files.write_whole`), read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch
from torch import Tensor

from mtp.errors import UserError
from mtp.files import write_whole
from mtp.model import MTPModel


class TrunkCache:
    def __init__(self, model: MTPModel, max_bytes: int, folder: str | os.PathLike | None = None) -> None:
        self.model, self.max_bytes = model, max_bytes
        self.outputs: dict[bytes, Tensor] = {}
        self.bytes = 0
        self.hits = self.misses = 0
        self.folder = Path(folder) if folder is not None else None
        self.file: Path | None = None  # known once the window length is (the first step)
        self.trunk = ""  # the hash of the trunk's weights the file is named by
        self.saved = 0  # rows the file holds

    @staticmethod
    def check_frozen(model: MTPModel) -> None:
        """A cache needs a trunk that does not train: one sentence with the fix otherwise."""
        trunk = [model.tok_embeddings.weight, *model.trunk_blocks.parameters()]
        if any(p.requires_grad for p in trunk):
            raise UserError(
                "trunk_cache_gb > 0 keeps the trunk's outputs, which change while the trunk trains; freeze it "
                "(init_from=... freeze=trunk or freeze=loaded) or set trunk_cache_gb=0."
            )

    def __call__(self, inputs: Tensor) -> Tensor:
        """The trunk's output (B, T, d) for token ids (B, T): kept rows where every row is kept, else computed (and
        kept while there is room). One host read of the ids per step: the rows' keys."""
        if self.folder is not None and self.file is None:
            device = inputs.device.type  # outputs differ under autocast: its dtype names the file too
            dtype = self.model.tok_embeddings.weight.dtype
            if torch.is_autocast_enabled(device):
                dtype = torch.get_autocast_dtype(device)
            self.trunk = trunk_hash(self.model)
            self.file = self.folder / f"trunk-{self.trunk}-T{inputs.size(1)}-{str(dtype)[6:]}.pt"
            self.load()
        keys = [row.tobytes() for row in inputs.cpu().numpy()]
        if all(key in self.outputs for key in keys):
            self.hits += len(keys)
            return torch.stack([self.outputs[key] for key in keys])
        self.misses += len(keys)
        with torch.no_grad():
            trunk = self.model.trunk_features(inputs)
        for key, row in zip(keys, trunk, strict=True):
            self.keep(key, row.clone())  # its own storage: the batch's tensor is not kept alive
        return trunk

    def keep(self, key: bytes, output: Tensor) -> None:
        size = output.numel() * output.element_size()
        if key not in self.outputs and self.bytes + size <= self.max_bytes:
            self.outputs[key] = output
            self.bytes += size

    def load(self) -> None:
        """What an earlier run on the same trunk and windows wrote, as far as the budget holds it."""
        if self.file is None or not self.file.is_file():
            return
        device = self.model.tok_embeddings.weight.device
        try:  # mapped, on a CPU: the rows are the file's pages, read as the steps need them, not a second copy
            stored = torch.load(self.file, map_location=device, weights_only=True, mmap=device.type == "cpu")
        except Exception:  # a damaged file is only a lost cache: the trunk computes those windows again
            return
        rows = stored["rows"] if "rows" in stored else list(stored["outputs"])  # files before rows: one stacked tensor
        config = self.model.config
        width = (len(config.feature_layers) + 1) * config.d_model
        wide = rows[0].size(-1) if rows else width
        written_for = stored.get("trunk", self.trunk)  # files written before it was recorded: by their name
        if written_for != self.trunk or wide != width:
            raise UserError(
                f"trunk_cache_dir holds {self.file.name}, written for another trunk or other layers than this model's "
                f"(outputs {wide} wide, this model's {width}); delete that file or point trunk_cache_dir at another "
                "folder."
            )
        for ids, output in zip(stored["ids"].numpy(), rows, strict=True):
            self.keep(ids.tobytes(), output)
        self.saved = len(self.outputs)

    def save(self) -> None:
        """Write what the cache holds, if it holds more than its file (a temporary file renamed into place)."""
        if self.file is None or len(self.outputs) <= self.saved:
            return
        self.file.parent.mkdir(parents=True, exist_ok=True)
        ids = torch.stack([torch.frombuffer(bytearray(key), dtype=torch.long) for key in self.outputs])
        rows = [row.cpu() for row in self.outputs.values()]  # each row as kept: no second copy of the whole cache
        stored = {"ids": ids, "rows": rows, "trunk": self.trunk}
        write_whole(self.file, lambda f: torch.save(stored, f))
        self.saved = len(self.outputs)


MEMORY_SHARE = 0.5
"""The most of the machine's available memory (when training starts) the cache may hold, whatever its budget says."""


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


def cache_budget(asked: int, available: int | None) -> tuple[int, str | None]:
    """The bytes the cache may hold: ``asked`` (``trunk_cache_gb``), or at most :data:`MEMORY_SHARE` of the
    ``available`` memory; with a note to say where the machine's memory bounds it (None: as asked)."""
    if available is None or asked <= MEMORY_SHARE * available:
        return asked, None
    bound = int(MEMORY_SHARE * available)
    return bound, (
        f"trunk cache: {bound / 2**30:.1f} GiB, half the {available / 2**30:.1f} GiB this machine has available, not "
        f"the trunk_cache_gb={asked / 2**30:g} asked; windows past it run the trunk each epoch"
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
