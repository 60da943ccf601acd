"""Several real processes preparing one corpus at once, a builder killed mid-build, a full or unwritable disk."""

import errno
import os
import signal
import sys

import pytest

from mtp.data import packing
from mtp.data.packing import TokenizerConfig, open_packed, prepare
from mtp.data.sources import SourceConfig
from mtp.errors import UserError
from tests.data.helpers import builders, start_preparers, wait_for, write_corpus

needs_flock = pytest.mark.skipif(sys.platform == "win32", reason="no fcntl: builds may overlap (safely)")


def entries(cache):
    """Names under the cache other than lock files: complete entries and partial folders."""
    return sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) if cache.exists() else []


@pytest.mark.slow  # three processes building at once (~12 s)
@needs_flock
def test_processes_preparing_at_once_share_one_build(tmp_path):
    pattern, cache = write_corpus(tmp_path / "corpus"), tmp_path / "cache"
    processes = start_preparers(2, cache, pattern, tmp_path / "work", slow_step="build", delay=1.0)
    results = [p.communicate(timeout=120) for p in processes]
    assert [p.returncode for p in processes] == [0, 0], [err for _, err in results]
    paths = {out.strip() for out, _ in results}
    assert len(builders(tmp_path / "work")) == 1  # the others waited for it instead of building their own
    assert len(paths) == 1 and entries(cache) == [os.path.basename(paths.pop())]  # one entry, no partial folder
    waiting = [err for _, err in results if "waiting for another process preparing" in err]
    assert len(waiting) == 1 and str(cache) in waiting[0]  # said while it waited
    packed = open_packed(cache / entries(cache)[0])
    assert packed.meta["tokens"]["train"] > 0


@needs_flock
def test_a_builder_killed_mid_build_leaves_nothing_trusted(tmp_path, monkeypatch):
    pattern, cache, work = write_corpus(tmp_path / "corpus"), tmp_path / "cache", tmp_path / "work"
    (victim,) = start_preparers(1, cache, pattern, work, slow_step="shard", delay=60)
    wait_for(lambda: builders(work) or victim.poll() is not None, 60)  # train.bin written, meta.json not yet
    assert victim.poll() is None, victim.communicate()
    (partial,) = entries(cache)
    assert ".partial-" in partial and (cache / partial / "train.bin").is_file()
    victim.send_signal(signal.SIGKILL)
    victim.communicate()

    built = []
    real_build = packing._build
    monkeypatch.setattr(packing, "_build", lambda *args: (built.append(args[0]), real_build(*args))[1])
    previous = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the dead builder's lock is still held"))
    signal.alarm(30)
    try:
        packed = prepare(SourceConfig(kind="files", paths=[pattern]), TokenizerConfig(kind="byte"), 0.25, cache)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert len(built) == 1 and entries(cache) == [packed.path.name]  # built anew; the stale partial is gone
    assert packed.meta["tokens"]["train"] > 0


def fail_on_write(monkeypatch, name: str, when: str, error: int) -> None:
    """Make writing the cache file called ``name`` fail with ``error``: at a ``write`` call, or at ``close`` (where a
    buffered file meets a full disk when its data fit in the buffer)."""
    real_open = open

    class Failing:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.close()

        def write(self, data):
            if when == "write":
                raise OSError(error, os.strerror(error))
            return self.handle.write(data)

        def close(self):
            self.handle.close()
            if when == "close":
                raise OSError(error, os.strerror(error))

    def failing_open(path, mode="r", *args, **kwargs):
        handle = real_open(path, mode, *args, **kwargs)
        return Failing(handle) if os.path.basename(path) == name and "w" in mode else handle

    monkeypatch.setattr(packing, "open", failing_open, raising=False)  # packing's writes only, not pytest's


@pytest.mark.parametrize(
    "name, when",
    [("train.bin", "write"), ("validation.bin", "close"), ("tokenizer.json", "close"), ("meta.json", "write")],
)
def test_a_full_disk_is_one_sentence_and_leaves_nothing(name, when, tmp_path, monkeypatch):
    pattern, cache = write_corpus(tmp_path / "corpus"), tmp_path / "cache"
    source, tokenizer = SourceConfig(kind="files", paths=[pattern]), TokenizerConfig(kind="byte")
    fail_on_write(monkeypatch, name, when, errno.ENOSPC)
    with pytest.raises(UserError) as caught:
        prepare(source, tokenizer, 0.25, cache)
    message = str(caught.value)
    assert message.startswith(f"could not write the data cache at {cache}{os.sep}")
    fix = "free space there or set data.cache_dir to another disk."
    assert message.endswith(f"{name} (No space left on device); {fix}")
    assert entries(cache) == []  # neither a partial folder nor anything that looks complete
    monkeypatch.undo()
    assert prepare(source, tokenizer, 0.25, cache).meta["tokens"]["train"] > 0


def test_a_cache_dir_that_cannot_be_created_is_one_sentence(tmp_path):
    pattern = write_corpus(tmp_path / "corpus")
    (tmp_path / "a_file").write_text("not a folder")
    with pytest.raises(UserError, match=r"could not write the data cache at .*a_file.*\(Not a directory\).*cache_dir"):
        prepare(SourceConfig(kind="files", paths=[pattern]), TokenizerConfig(kind="byte"), 0.25, tmp_path / "a_file/c")


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0, reason="root ignores file permissions")
def test_an_unwritable_cache_dir_is_one_sentence(tmp_path):
    pattern = write_corpus(tmp_path / "corpus")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        with pytest.raises(UserError, match=r"could not write the data cache at .*locked.*\(Permission denied\)"):
            prepare(SourceConfig(kind="files", paths=[pattern]), TokenizerConfig(kind="byte"), 0.25, locked / "c")
    finally:
        locked.chmod(0o700)


def test_a_read_only_cache_dir_is_one_sentence(tmp_path, monkeypatch):
    """As root the permission test above skips: a read-only file system (EROFS) is simulated at the mkdir."""
    pattern = write_corpus(tmp_path / "corpus")

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(packing.Path, "mkdir", read_only)
    with pytest.raises(UserError, match=r"at .*/c \(Read-only file system\); .*data.cache_dir"):
        prepare(SourceConfig(kind="files", paths=[pattern]), TokenizerConfig(kind="byte"), 0.25, tmp_path / "c")
