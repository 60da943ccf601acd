"""A distillation's output folder (:class:`DistillFolder`): its JSON-lines shards and ``settings.json`` (the settings
that made the data, the runs, running totals), each file written whole or not at all; and the fingerprint that names
the model a folder's data came from (:func:`model_fingerprint`)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtp.errors import SettingError, literal
from mtp.files import write_whole

SHARD_PREFIX = "distill-"
SHARD_NAME = SHARD_PREFIX + "{:05d}.jsonl"
SETTINGS_NAME = "settings.json"
SETTINGS_FORMAT = 1
FINGERPRINT_BYTES = 1 << 20
"""A model is identified by its size and a hash of the first and last MiB of each of its files: a GGUF file's first
MiB is mostly its vocabulary, the same in two fine-tunes of one base, so the last MiB (tensors) is hashed too."""


def model_fingerprint(path: str | os.PathLike) -> dict[str, Any]:
    """``{"bytes": total size, "sha256": hash of each file's name, size, first and last MiB}`` of a model file or
    folder: cheap, and different for different weights."""
    path = Path(path)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    digest, total = hashlib.sha256(), 0
    for file in files:
        size = file.stat().st_size
        total += size
        digest.update(f"{file.relative_to(path) if path.is_dir() else file.name}\0{size}\0".encode())
        with file.open("rb") as f:
            digest.update(f.read(FINGERPRINT_BYTES))
            if size > 2 * FINGERPRINT_BYTES:
                f.seek(size - FINGERPRINT_BYTES)
                digest.update(f.read())
    return {"bytes": total, "sha256": digest.hexdigest()}


def write_atomically(path: Path, text: str) -> None:
    """``path`` holds ``text`` whole, or keeps what it held (:func:`mtp.files.write_whole`)."""
    write_whole(path, lambda f: f.write(text.encode("utf-8")))


@dataclass
class Totals:
    prompts: int = 0
    tokens: int = 0
    """Generated tokens (the completions' ids)."""
    seconds: float = 0.0
    """Wall time of the runs that decoded them, summed."""
    finished: bool = False
    """Every prompt of the source is in the shards."""

    def as_dict(self) -> dict[str, Any]:
        rate = self.tokens / self.seconds if self.seconds > 0 else 0.0
        return {
            "prompts": self.prompts,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 3),
            "tokens_per_s": round(rate, 2),
            "finished": self.finished,
        }


def flatten(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` as ``{"a.b": 1}``."""
    flat = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class DistillFolder:
    """An output folder: its shards and ``settings.json``.

    Opening it checks that what is there was made with the same ``settings`` (else one sentence naming the first
    setting that differs, spelled by ``describe(key, value)`` as the user sets it) and removes temporary files a
    killed run left. Nothing is written until the first shard (``settings.json`` just before it), so a run that
    fails early leaves the folder as it was. With ``force`` the folder's shards and settings are replaced at that
    first write. It refuses a folder in a :class:`SettingError` naming ``force`` and ``out``.
    """

    def __init__(
        self,
        out: Path,
        settings: dict[str, Any],
        run: dict[str, Any],
        force: bool = False,
        describe: Callable[[str, Any], str] = lambda key, value: f"{key}={value}",
    ) -> None:
        self.out, self.force = out, force
        out.mkdir(parents=True, exist_ok=True)
        for torn in out.glob(f".{SHARD_PREFIX}*.tmp"):
            torn.unlink(missing_ok=True)
        for torn in out.glob(f".{SETTINGS_NAME}.*.tmp"):
            torn.unlink(missing_ok=True)
        self.record: dict[str, Any] = {"format": SETTINGS_FORMAT, "settings": settings, "runs": [], "totals": {}}
        self.started = False
        settings_file = out / SETTINGS_NAME
        if not force and settings_file.is_file():
            try:
                old = json.loads(settings_file.read_text(encoding="utf-8"))
                old_settings = old["settings"]
            except (ValueError, KeyError, TypeError):
                raise SettingError(
                    f"{literal(settings_file)} is not a distillation's settings file; pass {{force:name}} to start "
                    f"over in {literal(out)} (its shards are replaced) or choose another {{out:name}}.",
                    force=force,
                    out=out,
                ) from None
            new, before = flatten(settings), flatten(old_settings)
            for key in [*new, *(k for k in before if k not in new)]:
                if new.get(key) != before.get(key):
                    made, asked = literal(describe(key, before.get(key))), literal(describe(key, new.get(key)))
                    raise SettingError(
                        f"{literal(out)} holds data made with {made}, but this run asks for {asked}; rerun with the "
                        "same settings to continue it, pass {force:name} to start over there (its shards are "
                        "replaced), or choose another {out:name}.",
                        force=force,
                        out=out,
                    )
            self.record["runs"], self.record["totals"] = old.get("runs", []), old.get("totals", {})
            self.started = True
        elif not force and self.shards():
            raise SettingError(
                f"{literal(out)} holds distillation shards but no {SETTINGS_NAME}; pass {{force:name}} to start over "
                "there (its shards are replaced) or choose another {out:name}.",
                force=force,
                out=out,
            )
        self.record["runs"].append(run)

    def shards(self) -> list[Path]:
        return sorted(self.out.glob(f"{SHARD_PREFIX}*.jsonl"))

    def rows(self, index: int) -> list[dict[str, Any]]:
        """The rows of shard ``index`` (none when it does not exist, or with ``force``)."""
        path = self.out / SHARD_NAME.format(index)
        if self.force or not path.is_file():
            return []
        rows = []
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    raise SettingError(
                        f"{literal(path)} line {number} is damaged; delete that shard (it is decoded again) or pass "
                        "{force:name}.",
                        force=self.force,
                    ) from None
        return rows

    def write(self, index: int, rows: list[dict[str, Any]], totals: Totals) -> None:
        """Shard ``index`` holds ``rows``, then settings.json ``totals`` (each file written whole)."""
        if not self.started:  # the first write of this folder by these settings
            if self.force:
                for old in [*self.shards(), self.out / SETTINGS_NAME]:
                    old.unlink(missing_ok=True)
                self.force = False
            # settings first: a shard never lies in the folder without the settings that made it
            self._write_settings()
            self.started = True
        lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        write_atomically(self.out / SHARD_NAME.format(index), lines)
        self.write_totals(totals)  # after the shard: a failed shard write leaves the totals of what is there

    def write_totals(self, totals: Totals) -> None:
        """settings.json's totals brought up to date (a folder this run never wrote to keeps its file untouched)."""
        if self.started:
            self.record["totals"] = totals.as_dict()
            self._write_settings()

    def _write_settings(self) -> None:
        write_atomically(self.out / SETTINGS_NAME, json.dumps(self.record, indent=2) + "\n")
