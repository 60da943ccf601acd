import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mtp.data.sources import SourceConfig, in_validation, load_documents, split_documents, stdlib_files
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
