"""The PostgreSQL backend's own promises: tokens, leases on the server's clock, claim order,
done marks, verify. (The conformance suite checks what every backend shares.)

Fails before this change: there was no PostgreSQL backend at all."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from mahabharatha.backends.base import LockLostError, NotHeldError, NotOwnerError, Requester
from mahabharatha.owner import ownership
from tests.support.postgres import PgServer, admin_execute, expire


def me() -> Requester:
    return Requester(os.getpid(), ownership.details_of(os.getpid()))


def test_acquire_holds_until_released_and_tokens_grow(backend: Any) -> None:
    first = backend.try_acquire("feat", me()).held
    assert first is not None and first.token is not None
    blocked = backend.try_acquire("feat", Requester(1))
    assert blocked.held is None and blocked.holder.pid == os.getpid()
    assert blocked.holder.state == "active"
    assert backend.verify("feat", first.token)
    assert backend.release_held(first)
    assert not backend.release_held(first)  # exactly once
    second = backend.try_acquire("feat", Requester(1)).held
    assert second is not None and second.token > first.token
    assert not backend.verify("feat", first.token)
    assert backend.verify("feat", second.token)


def test_lease_is_judged_by_the_server_and_takeover_fails_the_old_token(
    backend: Any, pg_server: PgServer, namespace: str
) -> None:
    old = backend.try_acquire("feat", Requester(1), lease=30).held
    assert 25 < old.expires_at - old.timestamp <= 30
    expire(pg_server, namespace, "feat")
    assert backend.inspect("feat").state == "stale"
    taken = backend.try_acquire("feat", me())
    assert taken.held is not None and taken.held.token > old.token
    assert taken.replaced is not None and taken.replaced.pid == 1
    assert not backend.verify("feat", old.token)
    with pytest.raises(LockLostError):
        backend.refresh(old)
    assert not backend.release_held(old)  # never another's
    assert backend.verify("feat", taken.held.token)


def test_refresh_renews_on_the_server_clock(
    backend: Any, pg_server: PgServer, namespace: str
) -> None:
    held = backend.try_acquire("feat", me(), lease=60).held
    admin_execute(
        pg_server,
        "UPDATE mahabharatha_locks SET expires_at = now() + interval '5 seconds'"
        " WHERE namespace = %s AND feature = %s",
        namespace,
        "feat",
    )
    assert backend.inspect("feat").expires_in_seconds <= 5
    renewed = backend.refresh(held)
    assert renewed.token == held.token
    assert backend.inspect("feat").expires_in_seconds > 55
    expire(pg_server, namespace, "feat")
    with pytest.raises(LockLostError):  # a lease that ran out is lost, even if nobody took it
        backend.refresh(renewed)


def test_release_by_pid_leaves_another_owner(backend: Any) -> None:
    backend.try_acquire("feat", Requester(1))
    with pytest.raises(NotOwnerError):
        backend.release("feat", 2)
    assert backend.inspect("feat").pid == 1
    assert not backend.release("other", 2)
    assert backend.release("feat", 2, force=True)
    assert backend.inspect("feat").state == "free"


def test_claim_takes_the_first_free_in_order_and_never_a_done_one(backend: Any) -> None:
    names = ["c", "a", "b"]
    backend.try_acquire("a", Requester(1))
    first = backend.try_claim(names, me())
    assert first.held.feature == "c"
    assert backend.done("c", os.getpid())
    assert backend.is_done("c")
    second = backend.try_claim(names, me())
    assert second.held.feature == "b"
    assert backend.try_claim(names, me()) is None
    assert backend.try_claim(names, me(), include_done=True).held.feature == "c"
    assert backend.reopen("c") and not backend.reopen("c")


def test_done_needs_the_holder(backend: Any) -> None:
    with pytest.raises(NotHeldError):
        backend.done("feat", 2)
    backend.try_acquire("feat", Requester(1))
    with pytest.raises(NotOwnerError):
        backend.done("feat", 2)
    assert not backend.is_done("feat")
    assert backend.inspect("feat").pid == 1


def test_status_and_survey(backend: Any, tmp_path: Any) -> None:
    (tmp_path / ".gsd" / "specs" / "local-only").mkdir(parents=True)
    backend.try_acquire("held", Requester(1))
    backend.try_acquire("finished", me())
    backend.done("finished", os.getpid())
    assert [info.feature for info in backend.status()] == ["held"]
    states = {info.feature: info.state for info in backend.survey()}
    assert states == {"held": "active", "finished": "done", "local-only": "free"}
    assert backend.feature_names() == ["local-only"]


def test_reclaim_dead_takes_only_a_provably_gone_owner(backend: Any) -> None:
    import subprocess

    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = Requester(gone.pid, ownership.details_of(gone.pid))  # this boot and namespace
    backend.try_acquire("feat", dead)
    assert backend.try_acquire("feat", me()).held is None  # age alone: still held
    taken = backend.try_acquire("feat", me(), reclaim_dead=True)
    assert taken.held is not None and taken.replaced.pid == gone.pid
    other_host = Requester(gone.pid, None)  # no details: cannot be judged, never reclaimed
    backend.try_acquire("other", other_host)
    assert backend.try_acquire("other", me(), reclaim_dead=True).held is None


def test_clean_removes_only_expired_locks(
    backend: Any, pg_server: PgServer, namespace: str
) -> None:
    backend.try_acquire("old", Requester(1))
    backend.try_acquire("live", Requester(1))
    expire(pg_server, namespace, "old")
    listed = backend.clean(dry_run=True)
    assert [(entry.feature, entry.removed) for entry in listed] == [("old", False)]
    assert backend.inspect("old").state == "stale"
    assert [(entry.feature, entry.removed) for entry in backend.clean()] == [("old", True)]
    assert backend.inspect("old").state == "free"
    assert backend.inspect("live").state == "active"


def test_namespaces_keep_locks_apart(make_backend: Callable[..., Any]) -> None:
    one, two = make_backend(namespace="repo-one"), make_backend(namespace="repo-two")
    assert one.try_acquire("feat", Requester(1)).held is not None
    assert two.try_acquire("feat", Requester(2)).held is not None
    one.release("feat", 1, force=True)
    two.release("feat", 2, force=True)


def test_wait_for_release_wakes_on_notify(make_backend: Callable[..., Any]) -> None:
    holder, waiter = make_backend(), make_backend()
    held = holder.try_acquire("feat", Requester(1)).held
    assert waiter.wait_for_release("feat", 1.0)  # first call: starts listening
    assert not waiter.wait_for_release("feat", 0.05)  # nothing released yet
    holder.release_held(held)
    assert waiter.wait_for_release("feat", 5.0)


@pytest.mark.parametrize(
    ("remote", "expected"),
    [
        ("git@github.com:Org/repo.git", "github.com/org/repo"),
        ("https://user@GitHub.com/Org/repo.git/", "github.com/org/repo"),
        ("ssh://git@github.com:22/Org/repo", "github.com/org/repo"),
        ("git@git.example.org:Org/repo.git", "git.example.org/Org/repo"),
        ("/nowhere/git/repo.git", "/nowhere/git/repo.git"),
    ],
)
def test_namespace_from_the_origin_remote(remote: str, expected: str) -> None:
    from mahabharatha.backends.postgres.namespace import normalise_remote

    assert normalise_remote(remote) == expected


def test_namespace_derivation_and_its_absence(tmp_path: Any, monkeypatch: Any) -> None:
    import subprocess

    from mahabharatha.backends.postgres.backend import PostgresBackend
    from mahabharatha.backends.postgres.namespace import derive_namespace

    monkeypatch.delenv("MAHABHARATHA_LOCK_NAMESPACE", raising=False)
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    with pytest.raises(ValueError, match="--namespace"):
        PostgresBackend("postgresql:///x", gsd_dir=str(repo / ".gsd"))
    subprocess.run(
        ["git", "-C", str(repo), "remote", "add", "origin", "git@example.org:team/app.git"],
        check=True,
    )
    assert derive_namespace(repo / ".gsd") == "example.org/team/app"
    backend = PostgresBackend("postgresql:///x", gsd_dir=str(repo / ".gsd"))
    assert backend.namespace == "example.org/team/app"
    monkeypatch.setenv("MAHABHARATHA_LOCK_NAMESPACE", "chosen")
    assert PostgresBackend("postgresql:///x", gsd_dir=str(repo)).namespace == "chosen"


def _dead_requester() -> Requester:
    """An owner that ran on this boot and in this PID namespace, and is gone."""
    import subprocess

    gone = subprocess.Popen(["true"])
    gone.wait()
    return Requester(gone.pid, ownership.details_of(gone.pid))


def test_claim_reclaim_dead_takes_a_gone_owners_feature_in_order(backend: Any) -> None:
    dead = _dead_requester()
    backend.try_acquire("a", dead)
    backend.try_acquire("b", Requester(os.getpid(), ownership.details_of(os.getpid())))
    assert backend.try_claim(["a", "b", "c"], me()).held.feature == "c"
    backend.release("c", os.getpid())
    taken = backend.try_claim(["a", "b", "c"], me(), reclaim_dead=True)
    assert taken.held.feature == "a" and taken.replaced.pid == dead.pid


def test_clean_reclaim_dead_removes_only_a_gone_owners_lock(backend: Any) -> None:
    dead = _dead_requester()
    backend.try_acquire("gone", dead)
    backend.try_acquire("live", me())
    assert backend.clean() == []  # age alone: both active
    removed = backend.clean(reclaim_dead=True)
    assert [(entry.feature, entry.removed) for entry in removed] == [("gone", True)]
    assert backend.inspect("live").state == "active"


def test_the_same_pid_on_another_host_is_someone_else(make_backend: Callable[..., Any]) -> None:
    """Fails before the fix: the lock layer took a holder with the caller's pid for the caller
    itself ("already held by you", and ``lock run`` gave up instead of waiting), though it ran
    on another host (containers reuse small pids all the time)."""
    from mahabharatha import locks
    from mahabharatha.backends.base import AlreadyHeldError, LockHeldError

    there, here = make_backend(), make_backend()
    there._host = "another-host"  # a second machine: its backend records its own host name
    mine = ownership.details_of(os.getpid())  # "yours" needs our boot and namespace recorded
    there.try_acquire("feat", Requester(os.getpid(), mine))
    with pytest.raises(LockHeldError) as stopped:
        locks.acquire("feat", backend=here, pid=os.getpid(), timeout=0)
    assert not isinstance(stopped.value, AlreadyHeldError)
    assert stopped.value.info.host == "another-host"
    there.release("feat", os.getpid())
    here.try_acquire("feat", Requester(os.getpid(), mine))
    with pytest.raises(AlreadyHeldError):  # on this host it is the caller's own
        locks.acquire("feat", backend=here, pid=os.getpid(), timeout=0)
