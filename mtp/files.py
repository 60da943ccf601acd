"""Files written whole or not at all: a temporary file beside the target, fsynced, renamed into place (the folder
fsynced too). Used by checkpoints (mtp.checkpoint.save), distillation shards (mtp.pretrained.distill) and the trunk
cache; no Lightning here, so commands that only write data do not import it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_whole(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """``path`` holds what ``write`` writes into the open (binary) file, whole, or keeps what it held. A failed write
    (a full disk) leaves no temporary file; one a kill left beside ``path`` earlier is removed first."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        remove_torn_writes(path)
        with open(temporary, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(temporary, path)
        sync_directory(path.parent)  # and the new name is on disk too
    finally:
        temporary.unlink(missing_ok=True)


def remove_torn_writes(path: Path) -> None:
    """Temporary files of earlier writes to ``path`` that a kill (SIGKILL, power loss) left behind."""
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
