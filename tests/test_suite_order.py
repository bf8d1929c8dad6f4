"""The suite's own scheduling (tests/conftest.py): tests marked slow are collected first, longest first,
so that pytest-xdist starts them first on the GPU, where a time limit would otherwise cut them off."""

from __future__ import annotations

import pytest
from conftest import slow_seconds
from helpers import load_module


def test_slow_tests_are_collected_longest_first(request: pytest.FixtureRequest) -> None:
    seconds = [slow_seconds(item) for item in request.session.items]
    if not any(seconds):
        pytest.skip("no test marked slow was collected")
    assert seconds == sorted(seconds, reverse=True)


def test_tests_not_run_names_what_a_cut_off_run_missed(tmp_path, capsys) -> None:
    mod = load_module("scripts/tests_not_run.py")
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
