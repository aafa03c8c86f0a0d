"""The configuration home, shared by every layer: folders and the files a feature folder holds,
the environment variables read, and the time limits."""

from typing import Final

GSD_DIR: Final = ".gsd"
"""Where feature specs, their locks and the current-feature marker live."""

STATE_DIR: Final = ".mahabharatha/state"
"""Per-feature state files; the newest one names the feature being worked on."""

AUDIT_LOG_NAME: Final = "lock-audit.jsonl"
"""One JSON line per reclaim, forced release and clean, in the gsd folder."""

COMPLETED_MARKER_NAME: Final = ".completed"
"""A finished feature's marker in its folder (an ISO-8601 time, like the repository's other
sentinels ``.started`` and ``.plan-complete``): ``claim`` never hands such a feature out. Both
backends mean the same by done: on PostgreSQL a local marker counts too."""

# --------------------------------------------------------------------------- environment

# The lock server for every entry point (none may use files while it names one: two holders).
LOCK_URL_ENV: Final = "MAHABHARATHA_LOCK_URL"
NAMESPACE_ENV: Final = "MAHABHARATHA_LOCK_NAMESPACE"  # PostgreSQL: whose locks these are
SCHEMA_ENV: Final = "MAHABHARATHA_LOCK_SCHEMA"  # PostgreSQL: the lock tables' schema
FEATURE_ENV_VAR: Final = "MAHABHARATHA_FEATURE"  # names the current feature
GRACE_ENV: Final = "MAHABHARATHA_RUN_GRACE"  # another WORK_GRACE_SECONDS
# CMD's descriptor of its proof of life (a CMD whose ``subprocess`` work must count passes it on
# with ``pass_fds``: Python closes descriptors by default).
PROOF_FD_ENV: Final = "MAHABHARATHA_LOCK_PROOF_FD"
TOKEN_ENV: Final = "MAHABHARATHA_LOCK_TOKEN"  # CMD's copy of its lock's fencing token

# --------------------------------------------------------------------------- time limits

# A holder rewrites its timestamp this often: at least every 60 s (the contract), so a clock
# jump of a minute cannot make a live lock stale.
HEARTBEAT_SECONDS: Final = 30.0
# How long a command waits for a lock server (to connect, and for any one answer).
CONNECT_TIMEOUT_SECONDS: Final = 5.0
# A pool worker keeps its server connection this long into each command, then lets go of it
# until the command ends: a long command holds no connection slot while it runs.
POOL_CONNECTION_GRACE_SECONDS: Final = 0.25
# Waiters poll from 2 ms up to 25 ms apart (jittered): a released lock is taken within tens of
# milliseconds, and a crowd of waiters does not poll in step.
BACKOFF_FIRST_SECONDS: Final = 0.002
BACKOFF_MAX_SECONDS: Final = 0.025
# After 10 s of waiting, at most 4 polls a second: a waiter left for an hour costs no CPU.
PATIENT_AFTER_SECONDS: Final = 10.0
PATIENT_MAX_SECONDS: Final = 0.25
# A holder whose refreshes do not get through declares its lock lost this long (at most a
# quarter of the lease) before its lease can run out on the server, counted from when it sent
# the last statement that set the lease: CMD is gone before the lock can be given away.
CUT_OFF_NOTICE_SECONDS: Final = 11.0
# A backend that wakes waiters on release is waited on at most this long between tries.
WAKE_UP_SLICE_SECONDS: Final = 0.25
# Where no release wakes a waiter: how long it sleeps between claims.
POLL_SECONDS: Final = 0.05
# Even where releases wake waiters, a waiter claims again at least this often: a lock that goes
# stale or whose owner dies is not released, so nothing says so.
RECHECK_SECONDS: Final = 1.0
# A failed feature rests this long before its next attempt (``lock work --retry-delay``).
RETRY_DELAY_SECONDS: Final = 1.0
# How often a worker with nothing else to claim asks whether work left by a failed command has
# ended (a proof of life gives no wake-up of its own).
LEFT_WORK_POLL_SECONDS: Final = 0.1
# After SIGTERM for a lost lock, CMD may take this long to stop cleanly before SIGKILL.
LOST_KILL_GRACE_SECONDS: Final = 10.0
# After CMD ended, what it left running (holding its proof of life) gets this long to finish
# before its process group is SIGKILLed (``GRACE_ENV`` sets another).
WORK_GRACE_SECONDS: Final = 5.0
WORK_KILL_WAIT_SECONDS: Final = 2.0  # after that SIGKILL: for the kernel to take them down
WORK_POLL_SECONDS: Final = 0.02  # how often the proof is looked at while waiting for the work
SETPRIV_PROBE_SECONDS: Final = 5.0  # a hang guard for the one probe
WATCH_SECONDS: Final = 1.0  # how often ``status --watch`` looks again
REDRAW_SECONDS: Final = 1.0  # the waiting line shows whole seconds
# How often a waiter asks whether the holder still runs (the polls themselves skip that).
JUDGE_EVERY_SECONDS: Final = 1.0
# How long the end of an attempt waits for its tagged output to be written out (work the
# command left behind may keep the pipe open for ever; its later lines still go out).
PUMP_JOIN_SECONDS: Final = 5.0
# The kernel's lease-break time where the setting cannot be read, and a margin beyond it (the
# kernel times the break from the first refused open and may act a little late).
DEFAULT_LEASE_BREAK_SECONDS: Final = 45.0
LEASE_BREAK_MARGIN_SECONDS: Final = 5.0
# Pauses between release tries under a kernel lease (doubling).
RELEASE_RETRY_FIRST_SECONDS: Final = 0.1
RELEASE_RETRY_MAX_SECONDS: Final = 2.0
