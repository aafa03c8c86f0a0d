"""One simulated host's worker (run under ``unshare --uts --pid --fork``): it names its host,
says ``ready``, waits for ``go`` on stdin, then works and prints what it did.

``claim FEATURES_FILE``: claim features until none is free, printing each won, then marking it
done; ``lost FEATURE`` when the mark found the lock no longer this host's (another host took it
meanwhile: a feature claimed twice, which the test counts, so the storm goes on).
``hammer FEATURE ROUNDS MARKER``: take the lock ROUNDS times; inside, create MARKER exclusively
(an overlap if it already exists), remove it, release; print the number of overlaps.
"""

from __future__ import annotations

import os
import socket
import sys

from mahabharatha.backends.base import NotHeldError, NotOwnerError, Requester
from mahabharatha.backends.postgres.backend import PostgresBackend
from mahabharatha.owner import ownership

WAIT_SECONDS = 0.25
"""A waiter sleeps on LISTEN at most this long between tries (a missed wake-up costs this)."""


def main() -> int:
    url, namespace, host, mode, *rest = sys.argv[1:]
    socket.sethostname(host)
    backend = PostgresBackend(url, namespace=namespace)
    me = Requester(os.getpid(), ownership.details_of(os.getpid()))
    backend.inspect("warm-up")  # connect before the start line
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    if mode == "claim":
        with open(rest[0]) as names:
            features = names.read().split()
        while (won := backend.try_claim(features, me)) is not None:
            assert won.held is not None
            print(won.held.feature, flush=False)
            try:
                backend.done(won.held.feature, os.getpid())
            except (NotHeldError, NotOwnerError):
                print("lost", won.held.feature, flush=False)
    else:
        feature, rounds, marker = rest[0], int(rest[1]), rest[2]
        overlaps = 0
        for _ in range(rounds):
            while (held := backend.try_acquire(feature, me).held) is None:
                backend.wait_for_release(feature, WAIT_SECONDS)
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                overlaps += 1
            else:
                os.unlink(marker)
            backend.release_held(held)
        print(f"overlaps {overlaps}")
    sys.stdout.flush()
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
