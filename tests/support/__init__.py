"""Helpers shared by the suite's tests and plugins."""

import pytest


def runs_the_session(config: pytest.Config) -> bool:
    """Is this the process that reports the run (not one of pytest-xdist's workers)? The
    run-wide guards (outcome tally, clean checkout, machine load) live there, once per run."""
    return not hasattr(config, "workerinput")
