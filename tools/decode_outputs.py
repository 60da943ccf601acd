"""Record what every decode in the test suite emits, to compare two trees of mtp byte for byte (before and after a
restructuring): a pytest plugin that writes, per test, the tokens of each ``mtp.decode.loop.generate`` run in the order
they ran, with the run's drafted and accepted counts.

    python -m pytest tests/decode tests/test_methods.py -p tools.decode_outputs --decode-outputs before.json
    (the same in the other tree, into after.json)
    python tools/decode_outputs.py before.json after.json [before-again.json]

Run it with the tree's own mtp first on the path (``PYTHONPATH=TREE``, from TREE). Greedy runs and sampled runs at a
fixed seed are both deterministic on one machine, so the two files must be equal; the comparison names each test whose
runs differ, and the tests found in one file only (skipped or renamed), which it does not count as differences. A test
whose decodes depend on a timing (a head count chosen as the one measured fastest) differs between two runs of one tree:
given a second record of the first tree (``before-again.json``, the same tests), the tests that differ between the two
are listed as varying run to run and not counted either.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

_RECORD: dict[str, list[dict]] = {}
_CURRENT: list[str] = [""]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--decode-outputs", metavar="FILE", help="write every decode's tokens, per test, to FILE (JSON)")


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("--decode-outputs"):
        return
    from mtp.decode import loop

    finish = loop._Run.finish

    def recorded(run, *args, **kwargs):
        outputs, stats = finish(run, *args, **kwargs)
        _RECORD.setdefault(_CURRENT[0], []).append(
            {"outputs": [list(map(int, row)) for row in outputs], "drafted": list(stats.drafted),
             "accepted": list(stats.accepted)}
        )  # fmt: skip
        return outputs, stats

    loop._Run.finish = recorded


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    _CURRENT[0] = item.nodeid
    yield
    _CURRENT[0] = ""


def pytest_unconfigure(config: pytest.Config) -> None:
    path = config.getoption("--decode-outputs")
    if path:
        Path(path).write_text(json.dumps(_RECORD, indent=0, sort_keys=True))


Record = dict[str, list[dict]]
"""Per test, its decodes in the order they ran."""


def compare(before: Record, after: Record, again: Record | None = None) -> int:
    """Print the tests whose decodes differ (those that differ between ``before`` and ``again`` apart); the count of
    the others."""
    common = sorted(before.keys() & after.keys())
    varies = {test for test in common if again is not None and test in again and again[test] != before[test]}
    differ = [test for test in common if before[test] != after[test] and test not in varies]
    for test in differ:
        print(f"differs: {test}")
    for test in sorted(varies):
        print(f"varies run to run (not counted): {test}")
    for name, only in (("before", before.keys() - after.keys()), ("after", after.keys() - before.keys())):
        for test in sorted(only):
            print(f"only {name}: {test}")
    runs = sum(len(before[test]) for test in common)
    tokens = sum(len(row) for test in common for run in before[test] for row in run["outputs"])
    print(
        f"{len(common)} tests in both, {runs} decodes, {tokens} tokens: {len(differ)} tests differ"
        + (f", {len(varies)} vary run to run" if varies else "")
    )
    return len(differ)


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: python tools/decode_outputs.py BEFORE.json AFTER.json [BEFORE_AGAIN.json]")
    sys.exit(1 if compare(*(json.loads(Path(p).read_text()) for p in sys.argv[1:])) else 0)
