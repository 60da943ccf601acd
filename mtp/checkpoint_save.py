"""Writing checkpoints: whole files only (reading them: mtp.checkpoint_load; when to write them: mtp.callbacks)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from mtp.checkpoint_load import read_checkpoint
from mtp.errors import UserError


class AtomicCheckpointIO(TorchCheckpointIO):
    """Saves to a temporary file beside the target and renames it into place: a checkpoint is whole or absent.

    Lightning's own save is not enough: its fsspec transaction stages the file in the system temp directory
    and moves it, which is a copy (not a rename) when that directory is on another filesystem than the
    checkpoints (tmpfs /tmp, checkpoints on a network disk), so a kill during the copy leaves a torn file.
    Reading goes through :func:`read_checkpoint`, so a bad file is one clear sentence.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        path = Path(path)
        temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            remove_torn_writes(path)
            with open(temporary, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())  # the bytes are on disk before the name points at them
            os.replace(temporary, path)
            sync_directory(path.parent)  # and the new name is on disk too
        except OSError as err:  # a full disk, a read-only or vanished folder: the previous checkpoint stays
            raise UserError(
                f"could not write checkpoint {path} ({err.strerror or err}); free space there or point "
                "paths.output_dir (hydra.run.dir) at a writable disk, then resume from the last checkpoint."
            ) from err
        finally:
            temporary.unlink(missing_ok=True)

    def load_checkpoint(self, path: str | os.PathLike, map_location: Any = None, weights_only: bool | None = None):
        return read_checkpoint(path, map_location or "cpu")


def remove_torn_writes(path: Path) -> None:
    """Temporary files of earlier saves to ``path`` that a kill (SIGKILL, power loss) left behind."""
    for torn in path.parent.glob(f".{path.name}.*.tmp"):
        torn.unlink(missing_ok=True)


def sync_directory(folder: Path) -> None:
    """fsync a folder, so that a rename in it survives a crash (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
