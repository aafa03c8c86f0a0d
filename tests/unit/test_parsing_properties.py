"""Properties of the two parsers every lock decision rests on: records and feature names."""

from __future__ import annotations

import math
import re
import time

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mahabharatha.commands._utils import _parse_lock_content, _validate_feature_name

MAX_PID = 4_194_304
ONE_DAY = 86400.0
RECORD = re.compile(r"[0-9]+:[0-9]+(?:\.[0-9]+)?")
"""The record syntax: ASCII digits, a colon, ASCII digits with an optional fraction."""
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_NAME_BYTES = 255

fast = settings(max_examples=200, deadline=None, database=None)
"""Quick and stateless: no example database is written into the working tree."""

record_like = st.text(alphabet="0123456789:.+-_eE \t\n\u0663\uff17nainf", max_size=40)
"""Text made of the pieces records (and near-records) are built from."""

records = st.builds(
    lambda pid, ts, pad: f"{pad}{pid}:{ts}{pad}",
    st.integers(min_value=-10, max_value=MAX_PID + 10) | st.integers(),
    st.floats(allow_nan=True, allow_infinity=True) | st.integers(),
    st.sampled_from(["", " ", "\n", "\t "]),
)
"""Well-formed-looking records, in and out of bounds."""


@fast
@given(st.text() | record_like | records)
def test_parse_lock_content_never_raises_and_returns_only_in_bounds_records(
    content: str,
) -> None:
    result = _parse_lock_content(content)
    if result is None:
        return
    pid, ts = result
    assert type(pid) is int
    assert type(ts) is float
    assert 1 <= pid <= MAX_PID
    assert math.isfinite(ts)
    assert 0 < ts <= time.time() + ONE_DAY
    assert RECORD.fullmatch(content.strip())


@fast
@given(
    pid=st.integers(min_value=1, max_value=MAX_PID),
    ts=st.floats(
        min_value=0,
        max_value=time.time() + ONE_DAY,
        exclude_min=True,
        allow_nan=False,
        allow_infinity=False,
    )
    | st.floats(min_value=1e9, max_value=time.time()),
)
def test_parse_lock_content_round_trips_every_record_the_module_writes(pid: int, ts: float) -> None:
    # Written as the module writes it: f"{pid}:{time.time()}" uses the float's repr.
    assume("e" not in repr(ts))
    assert _parse_lock_content(f"{pid}:{ts}") == (pid, ts)


names = (
    st.text()
    | st.from_regex(NAME, fullmatch=True)
    | st.text(alphabet="ab09._-/\\\n\x00 \u00e9", max_size=12)
    | st.text(alphabet="ab", min_size=250, max_size=260)
    | st.text(alphabet="\u00e9a", min_size=120, max_size=140)
)


def is_valid_name(name: str) -> bool:
    return (
        NAME.fullmatch(name) is not None
        and ".." not in name
        and len(name.encode()) <= MAX_NAME_BYTES
    )


@fast
@given(names)
def test_validate_feature_name_accepts_exactly_the_safe_names(name: str) -> None:
    try:
        _validate_feature_name(name)
    except ValueError as error:
        assert str(error).startswith("Invalid feature name")
        assert not is_valid_name(name)
    else:
        assert is_valid_name(name)
