import json
import logging
import sys
import sysconfig

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mtp.data.packing import TokenizerConfig, prepare
from mtp.data.sources import (
    TEST_SUITE_MIN,
    SourceConfig,
    in_validation,
    load_documents,
    split_documents,
    stdlib_files,
    stdlib_without_tests,
)
from mtp.errors import UserError


def texts(dataset) -> list[str]:
    return [t for batch in dataset.iter(batch_size=100) for t in batch["text"]]


def test_stdlib_is_the_standard_library_without_site_packages():
    files = stdlib_files()
    names = {f.name for f in files}
    assert {"os.py", "json/__init__.py".split("/")[-1], "typing.py"} <= names
    assert len(files) > 500
    assert not any("site-packages" in f.parts for f in files)


def test_split_is_deterministic_disjoint_and_order_free(corpus_dir):
    source = SourceConfig(kind="files", paths=[str(corpus_dir / "*.txt")])
    splits = split_documents(load_documents(source), 0.2)
    train, val = texts(splits["train"]), texts(splits["validation"])
    assert val and train and not set(train) & set(val)
    assert len(train) + len(val) == len(list(corpus_dir.glob("*.txt")))
    again = split_documents(load_documents(source), 0.2)
    assert texts(again["validation"]) == val
    assert all(in_validation(t, 0.2) for t in val)


def test_files_source_reads_txt_jsonl_and_parquet(tmp_path):
    (tmp_path / "a.txt").write_text("first document\nstill the first")
    (tmp_path / "b.jsonl").write_text(json.dumps({"body": "row one"}) + "\n" + json.dumps({"body": "row two"}) + "\n")
    pq.write_table(pa.table({"body": ["parquet row"]}), tmp_path / "c.parquet")
    source = SourceConfig(kind="files", paths=[str(tmp_path / "*")], text_field="body")
    assert sorted(texts(load_documents(source))) == sorted(
        ["first document\nstill the first", "row one", "row two", "parquet row"]
    )


def test_hub_path_on_a_local_dataset_folder(tmp_path):
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    (folder / "train.jsonl").write_text("\n".join(json.dumps({"content": f"doc {i}"}) for i in range(5)))
    for streaming in (False, True):
        source = SourceConfig(kind="hub", name=str(folder), text_field="content", streaming=streaming, max_documents=3)
        assert texts(load_documents(source)) == ["doc 0", "doc 1", "doc 2"]


def test_missing_text_field_is_named(tmp_path):
    (tmp_path / "d.jsonl").write_text(json.dumps({"body": "x"}))
    with pytest.raises(UserError, match="no field 'text'.*body"):
        load_documents(SourceConfig(kind="files", paths=[str(tmp_path / "*.jsonl")]))
    folder = tmp_path / "hub"
    folder.mkdir()
    (folder / "train.jsonl").write_text(json.dumps({"body": "x"}))
    with pytest.raises(UserError, match="no field 'content'"):
        load_documents(SourceConfig(kind="hub", name=str(folder), text_field="content", streaming=True))


def test_missing_or_empty_paths(tmp_path):
    with pytest.raises(UserError, match="matches no file"):
        load_documents(SourceConfig(kind="files", paths=[str(tmp_path / "nothing*.txt")]))
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(UserError, match="is empty"):
        load_documents(SourceConfig(kind="files", paths=[str(tmp_path / "*.txt")]))
    with pytest.raises(UserError, match="needs data.source.paths"):
        SourceConfig(kind="files")
    with pytest.raises(UserError, match="cannot read files ending in .bin"):
        (tmp_path / "x.bin").write_bytes(b"1")
        load_documents(SourceConfig(kind="files", paths=[str(tmp_path / "x.bin")]))


def test_unknown_hub_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="could not"):
        load_documents(SourceConfig(kind="hub", name=str(tmp_path / "no-such-dataset")))


def fake_stdlib(root, tests: int, monkeypatch):
    """A standard library of two modules and ``tests`` top-level test modules, as this Python's."""
    (root / "test").mkdir(parents=True)
    (root / "os_like.py").write_text("import sys\n\n\ndef f(x):\n    return x + 1\n" * 20)
    (root / "json_like.py").write_text("def g(y):\n    return [y, y * 2]\n" * 20)
    for i in range(tests):
        (root / "test" / f"test_m{i}.py").write_text(f"def test_{i}():\n    assert {i} == {i}\n")
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"stdlib": str(root)})


def test_a_standard_library_without_its_test_suite_is_warned_of_once_when_the_data_is_prepared(
    tmp_path, monkeypatch, caplog
):
    """Debian and Ubuntu ship the test suite apart: the default corpus is then a third of README's."""
    fake_stdlib(tmp_path / "lib", 3, monkeypatch)
    warning = stdlib_without_tests()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert warning is not None and f"apt install libpython{version}-testsuite" in warning
    assert str(tmp_path / "lib") in warning
    caplog.set_level(logging.INFO, logger="mtp.data.packing")
    source, tokenizer = SourceConfig(kind="stdlib"), TokenizerConfig(kind="byte")
    prepare(source, tokenizer, 0.2, tmp_path / "cache")
    assert caplog.text.count("has no test suite") == 1
    prepare(source, tokenizer, 0.2, tmp_path / "cache")  # reused: prepared once, warned of once
    assert caplog.text.count("has no test suite") == 1


def test_a_standard_library_with_its_test_suite_is_not_warned_of(tmp_path, monkeypatch, caplog):
    fake_stdlib(tmp_path / "lib", TEST_SUITE_MIN, monkeypatch)
    assert stdlib_without_tests() is None
    caplog.set_level(logging.INFO, logger="mtp.data.packing")
    prepare(SourceConfig(kind="stdlib"), TokenizerConfig(kind="byte"), 0.2, tmp_path / "cache")
    assert "test suite" not in caplog.text
