"""pytest plugin of ``tools/mutants.py``: one JSON line per test outcome, saying whether a
failure was an assertion (the test noticed the mutant) or something else (a crash, a timeout)."""

from __future__ import annotations

import json
import os
from collections.abc import Generator

import pytest

_REPORT = "MAHABHARATHA_MUTANT_REPORT"


def _asserted(call: pytest.CallInfo[None]) -> bool:
    """Did the test fail on its own check? An AssertionError, a ``pytest.fail`` or a ``pytest
    .raises`` that did not raise, but never pytest-timeout's ``Timeout``."""
    excinfo = call.excinfo
    if excinfo is None:
        return False
    if excinfo.errisinstance(AssertionError):
        return True
    return excinfo.errisinstance(pytest.fail.Exception) and "Timeout" not in str(excinfo.value)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    path = os.environ.get(_REPORT)
    if path is None or (report.when != "call" and report.passed):
        return report
    if report.when == "call" or report.failed or report.skipped:
        outcome = "xfailed" if hasattr(report, "wasxfail") else report.outcome
        line = {
            "nodeid": item.nodeid,
            "when": report.when,
            "outcome": outcome,
            "assertion": report.when == "call" and report.failed and _asserted(call),
            "detail": str(call.excinfo.typename) if call.excinfo is not None else "",
        }
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
    return report
