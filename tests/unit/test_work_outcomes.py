"""A worker's outcomes are enums (issue 29, item 5), and its JSON keeps the same strings."""

from __future__ import annotations

import json
from pathlib import Path

from mahabharatha import locks, team
from mahabharatha.states import WorkEnd, WorkOutcome


def test_a_workers_outcomes_are_enums_and_read_back_as_enums(tmp_path: Path) -> None:
    """Fails before the fix: ``mahabharatha.states`` had no ``WorkOutcome``/``WorkEnd``;
    ``WorkResult.outcome`` and ``WorkReport.ended`` were plain strings."""
    gsd = tmp_path / ".gsd"
    for name in ("a", "b"):
        (gsd / "specs" / name).mkdir(parents=True)

    def task(feature: str) -> None:
        if feature == "b":
            raise RuntimeError("b fails")

    report = locks.work(task, ["a", "b"], gsd, attempts=1, heartbeat=None)
    assert report.ended is WorkEnd.FINISHED
    assert [(r.feature, r.outcome) for r in report.results] == [
        ("a", WorkOutcome.DONE),
        ("b", WorkOutcome.FAILED),
    ]
    assert all(type(result.outcome) is WorkOutcome for result in report.results)
    document = json.loads(
        json.dumps({"ended": report.ended, "results": [r.to_dict() for r in report.results]})
    )
    assert document["ended"] == "finished"
    assert [r["outcome"] for r in document["results"]] == ["done", "failed"]
    again = team.report_from_document(document)
    assert again is not None and again.ended is WorkEnd.FINISHED
    assert [r.outcome for r in again.results] == [WorkOutcome.DONE, WorkOutcome.FAILED]
    assert all(type(result.outcome) is WorkOutcome for result in again.results)
