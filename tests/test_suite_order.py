"""The suite's own scheduling (tests/conftest.py): tests marked slow come first, longest first, each
followed by an unmarked test, so that pytest-xdist starts each on its own worker on the GPU, where a
time limit would otherwise cut them off."""

from __future__ import annotations

import pytest
from conftest import slow_seconds, spread_slow
from helpers import load_module


def test_spread_slow_alternates_long_tests_with_the_rest() -> None:
    seconds = {"a": 0, "b": 30, "c": 0, "d": 150, "e": 120, "f": 0, "g": 0}
    assert spread_slow(list(seconds), seconds.get) == ["d", "a", "e", "c", "b", "f", "g"]
    few = {"a": 0, "b": 5, "c": 9}  # more long tests than others: the long ones run on in order
    assert spread_slow(list(few), few.get) == ["c", "a", "b"]


def test_slow_tests_are_collected_first_and_apart(request: pytest.FixtureRequest) -> None:
    items = request.session.items
    seconds = [slow_seconds(item) for item in items]
    marked = [s for s in seconds if s]
    if not marked:
        pytest.skip("no test marked slow was collected")
    assert [slow_seconds(i) for i in spread_slow(items, slow_seconds)] == seconds  # the order pytest runs
    assert marked == sorted(marked, reverse=True)
    head = seconds[: 2 * min(len(marked), len(seconds) - len(marked))]
    assert all(head[0::2]) and not any(head[1::2])


def test_tests_not_run_names_what_a_cut_off_run_missed(tmp_path, capsys) -> None:
    mod = load_module("tools/tests_not_run.py")
    report = tmp_path / "r.xml"
    report.write_text('<testsuites><testsuite>'
                      '<testcase classname="tests.test_a" name="test_x[cuda-1]"/>'
                      '<testcase classname="tests.test_b" name="test_y"><skipped/></testcase>'
                      '</testsuite></testsuites>')
    collected = tmp_path / "c.txt"
    collected.write_text("tests/test_a.py::test_x[cuda-1]\ntests/test_a.py::test_x[cuda-2]\n"
                         "tests/test_b.py::test_y\n\n3 tests collected in 0.1s\n")
    mod.main(str(report), str(collected))
    assert capsys.readouterr().out.splitlines() == ["2 of 3 collected tests reported; not run:",
                                                    "tests/test_a.py::test_x[cuda-2]"]
    mod.main(str(tmp_path / "none.xml"), str(collected))
    assert "pytest wrote none" in capsys.readouterr().out
