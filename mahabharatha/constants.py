"""The configuration home, shared by every layer: folders and the files a feature folder holds,
the environment variables read, and the time limits."""

from typing import Final

GSD_DIR: Final = ".gsd"  # feature specs, their locks, the current-feature marker
STATE_DIR: Final = ".mahabharatha/state"  # per-feature state; the newest names the feature
AUDIT_LOG_NAME: Final = "lock-audit.jsonl"  # a JSON line per reclaim, forced release, clean
COMPLETED_MARKER_NAME: Final = ".completed"  # a finished feature (ISO-8601): never claimed
ATTEMPTS_RECORD_NAME: Final = ".attempts"  # a feature's failed attempts (JSON)
LAST_LOG_NAME: Final = ".last-log"  # the path of its last log (lock work --log-dir)
# A feature whose attempts failed this often is ``failed``, no longer handed out (``--attempts``).
DEFAULT_ATTEMPTS: Final = 3

# --------------------------------------------------------------------------- environment

# The lock server for every entry point (none may use files while it names one: two holders).
LOCK_URL_ENV: Final = "MAHABHARATHA_LOCK_URL"
NAMESPACE_ENV: Final = "MAHABHARATHA_LOCK_NAMESPACE"  # PostgreSQL: whose locks these are
SCHEMA_ENV: Final = "MAHABHARATHA_LOCK_SCHEMA"  # PostgreSQL: the lock tables' schema
FEATURE_ENV_VAR: Final = "MAHABHARATHA_FEATURE"  # names the current feature
GRACE_ENV: Final = "MAHABHARATHA_RUN_GRACE"  # another WORK_GRACE_SECONDS
PROOF_FD_ENV: Final = "MAHABHARATHA_LOCK_PROOF_FD"  # CMD's proof of life (pass it on: pass_fds)
TOKEN_ENV: Final = "MAHABHARATHA_LOCK_TOKEN"  # CMD's copy of its lock's fencing token

# --------------------------------------------------------------------------- time limits

# A holder rewrites its timestamp this often: at least every 60 s (the contract), so a clock
# jump of a minute cannot make a live lock stale.
HEARTBEAT_SECONDS: Final = 30.0
CONNECT_TIMEOUT_SECONDS: Final = 5.0  # to connect to a lock server, and for any one answer
# A pool worker lets go of its server connection this far into a command: no slot held long.
POOL_CONNECTION_GRACE_SECONDS: Final = 0.25
# Waiters poll from 2 ms up to 25 ms apart (jittered): a release is seen quickly, not in step.
BACKOFF_FIRST_SECONDS: Final = 0.002
BACKOFF_MAX_SECONDS: Final = 0.025
# After 10 s of waiting, at most 4 polls a second: a waiter left for an hour costs no CPU.
PATIENT_AFTER_SECONDS: Final = 10.0
PATIENT_MAX_SECONDS: Final = 0.25
# A holder whose refreshes fail calls its lock lost this long before its server lease can run
# out (from the last statement that set it): CMD is gone before the lock is given away.
CUT_OFF_NOTICE_SECONDS: Final = 11.0
WAKE_UP_SLICE_SECONDS: Final = 0.25  # the longest wait between tries for a waking backend
POLL_SECONDS: Final = 0.05  # between claims where no release wakes a waiter
RECHECK_SECONDS: Final = 1.0  # claim again this often anyway: a stale lock wakes no one
RETRY_DELAY_SECONDS: Final = 1.0  # a failed feature's rest (``lock work --retry-delay``)
LEFT_WORK_POLL_SECONDS: Final = 0.1  # an idle worker asks if a failed command's work ended
LOST_KILL_GRACE_SECONDS: Final = 10.0  # after SIGTERM for a lost lock, before SIGKILL
WORK_GRACE_SECONDS: Final = 5.0  # CMD's left work, before its group's SIGKILL (or GRACE_ENV)
WORK_KILL_WAIT_SECONDS: Final = 2.0  # after that SIGKILL: for the kernel to take them down
WORK_POLL_SECONDS: Final = 0.02  # how often the proof is looked at while waiting for the work
SETPRIV_PROBE_SECONDS: Final = 5.0  # a hang guard for the one probe
WATCH_SECONDS: Final = 1.0  # how often ``status --watch`` looks again
REDRAW_SECONDS: Final = 1.0  # the waiting line shows whole seconds
JUDGE_EVERY_SECONDS: Final = 1.0  # a waiter asks whether the holder runs (polls skip that)
PUMP_JOIN_SECONDS: Final = 5.0  # for an attempt's tagged output (left work may hold the pipe)
# The kernel's lease-break time where it cannot be read, and a margin (the kernel may be late).
DEFAULT_LEASE_BREAK_SECONDS: Final = 45.0
LEASE_BREAK_MARGIN_SECONDS: Final = 5.0
# Pauses between release tries under a kernel lease (doubling).
RELEASE_RETRY_FIRST_SECONDS: Final = 0.1
RELEASE_RETRY_MAX_SECONDS: Final = 2.0
STALE_AFTER_SECONDS: Final = 7200.0  # a lock older than this (strictly): its holder is gone
FUTURE_SKEW_SECONDS: Final = 86400.0  # a timestamp this far ahead is garbage, not clock skew
EMPTY_LOCK_GRACE_SECONDS: Final = 2.0  # an empty lock this young is being written: not corrupt
READ_WAIT_SECONDS: Final = 0.5  # a read refused for a passing reason is retried this long: busy
GUARD_WAIT_SECONDS: Final = 0.5  # a release or refresh waits this long for the folder's guard
TEMP_ORPHAN_SECONDS: Final = 60.0  # a named temp file this old (or whose writer died) is debris
PENDING_WAIT_SECONDS: Final = 0.1  # a proof's PENDING alone, then the lock counts as alive
CREATE_TIME_SLACK_SECONDS: Final = 1.0  # one started this near a lock's time may be its writer
# PostgreSQL leases: acquire and claim cannot refresh (2 h, as files); lock run and FeatureLock
# refresh every third of theirs, so a dead host's lock is free within a minute.
DEFAULT_LEASE_SECONDS: Final = 7200.0
RUN_LEASE_SECONDS: Final = 60.0
MIN_CONNECT_TIMEOUT_SECONDS: Final = 2  # libpq rounds a shorter connect_timeout up to this
WAKE_UP_INTERVAL_SECONDS: Final = 0.25  # one look per this, however many wake-ups (any NOTIFY)
# Doubling, jittered pauses before rerunning a serialization failure or deadlock (40001,
# 40P01), and between connections refused for want of a slot.
SERIALIZATION_FIRST_PAUSE_SECONDS: Final = 0.01
SERIALIZATION_MAX_PAUSE_SECONDS: Final = 0.2
SLOTS_FIRST_PAUSE_SECONDS: Final = 0.02
SLOTS_MAX_PAUSE_SECONDS: Final = 0.5
SLOT_PAUSE_SECONDS: Final = 0.5  # between rounds of refused connecting (each costs a process)
SLOTS_LOOK_SECONDS: Final = 0.5  # how often a claimer asks whether slots are nearly all taken
