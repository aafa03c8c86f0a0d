/*
 * lock.pml -- SPIN model of mahabharatha's hardened feature lock:
 * mahabharatha/backends/files/lockfile.py (publish, publish_or_reclaim, remove_if_unchanged,
 * release_at, remove_judged, replace_if_unchanged) as driven by mahabharatha/locks.py
 * (acquire, FeatureLock.refresh, FeatureLock.release).
 *
 * One feature folder, one entry `.lock`, three processes, a movable clock.
 *
 *   .lock     lk_exists, lk_ino (identity), lk_pid + lk_ts (the bytes "pid:ts").
 *             Records are always complete: link() publishes a fully written file and
 *             rename() swaps in a fully written file, so no reader ever sees a partial
 *             or corrupt record (CORRUPT/WRITING/NOT_A_FILE only come from old-code
 *             writers or foreign files, which are not modelled).
 *   guard     the flock on the feature folder: 0 free, else holder pid + 1. The
 *             kernel drops it when its holder dies.
 *   now       the wall clock, moved forward by `clock`, 1..MAXT. A jump by k is k
 *             clock steps with no process step in between.
 *   identity  every link()/rename() creates a NEW inode. Identities are compared only
 *             with identities somebody remembers (.lock itself, a holder's own lock,
 *             a judged snapshot, a snapshot re-read under the guard), so a new inode
 *             gets the smallest number that nobody remembers (new_ino). Every
 *             comparison then has the same outcome as with an ever-growing counter (a
 *             re-created lock is never equal to any earlier one), while states that
 *             differ only in forgotten inode numbers coincide. Since a number is never
 *             reused while remembered, it also determines the bytes:
 *             identity (inode, bytes) == lk_ino here (LockSnapshot.same_entry).
 *
 * Crashes: a process may stop for ever after any step that touches shared state (a
 * crash between two purely local steps equals a crash at the next crash point). Its
 * guard is freed; .lock and every other file stay as they are. See CP/CPG below.
 *
 * Build variants (cpp macros):
 *   (none)   SAFETY run. Every process does CYCLES x { try_acquire ; if won:
 *            [refresh]^{0..NREF} ; release } with MAX_ROUNDS = ROUNDS. Checks (a),
 *            (a2), (b), (b2), and that no process ever blocks for ever (pan's
 *            invalid-end-state check: every guard wait ends).
 *   LIVE     LIVENESS run. Every process waits like locks.acquire(timeout=None):
 *            try_acquire again and again until it wins, then holds, refreshes,
 *            releases and stops. Checks the LTL properties c and c_dead under weak
 *            fairness (pan -a -f).
 *   ALLCRASH SAFETY run with a crash branch after every shared step (not only where
 *            the guard is held). Same verdict, more states.
 *
 * Checks that MUST fail (they show the properties are not vacuous; check.sh runs them):
 *   NAIVE                     monitor "never two live holders" (freshness ignored):
 *                             a holder whose record went stale does get displaced.
 *   MUT_NO_RECHECK            reclaim unlinks without re-reading the identity: (b).
 *   MUT_NO_GUARD              reclaim takes no guard (re-check kept): (b), (a).
 *   MUT_GUARD_SURVIVES_CRASH  a dead process's flock is never dropped (e.g. a forked
 *                             child still holds the folder descriptor): SAFETY run
 *                             deadlocks (release/refresh wait for ever), LIVE run
 *                             violates c_dead.
 *
 * PROPERTIES (the precise statements)
 *
 *   A process p is a HOLDER from the step in which its link() (in _publish) succeeds
 *   until it unlinks its lock in release, or learns that it lost the lock (refresh
 *   returned None -> LockLostError; release found another entry). my_ts[p] is the
 *   timestamp in the record it last wrote (publish or refresh), my_ino[p] that
 *   record's identity. p is a LIVE FRESH HOLDER iff
 *            alive[p] && holding[p] && now - my_ts[p] <= STALE,
 *   i.e. a live holder that, reading the one clock, finds its own record not stale.
 *
 *   (a)  MUTUAL EXCLUSION: no reachable state has two live fresh holders.
 *        A holder whose own record has gone stale (it stopped refreshing, was paused,
 *        or the clock jumped past STALE) has no protection: a reclaimer may take the
 *        lock from it, and the model shows that this happens. The protocol promises
 *        exclusion only to holders that are fresh by their own record.
 *   (a2) A live fresh holder's record IS the current .lock
 *        (lk_exists && lk_ino == my_ino[p]). (a2) implies (a).
 *   (b)  EXACT REMOVAL: every unlink of .lock (reclaim, release_at, remove_judged) and
 *        every rename() over .lock (refresh) removes exactly the entry (identity) that
 *        its remover judged or read.
 *   (b2) A reclaim removes only a lock that is stale at the moment of its removal.
 *   (c)  NO BLOCKING PAST STALE (LIVE run, ltl c): whenever .lock is stale and some
 *        live process is waiting to acquire, eventually .lock stops being stale
 *        (removed, or replaced by a fresh record), or nobody is waiting any more.
 *        ltl c_dead, the crashed-holder case, asks for more: once the lock of a
 *        crashed holder is stale, eventually some live acquirer HAS WON (.lock is the
 *        lock of a live holder), unless nobody is waiting any more.
 */

#define NP      3        /* processes, pids 0..2 (the macros below spell out 3)   */
#define NOPID   255
#ifndef STALE
#define STALE   2        /* a lock is stale when now - ts > STALE                   */
#endif
#ifndef MAXT
#define MAXT    4        /* the clock stops here (bounds the state space)           */
#endif
#ifndef CYCLES
#define CYCLES  2        /* acquire/hold/release cycles per process (SAFETY run)    */
#endif
#ifndef ROUNDS
#define ROUNDS  3        /* MAX_ROUNDS of try_acquire (8 in the code)                */
#endif
#ifndef NREF
#define NREF    1        /* heartbeats per hold, at most                            */
#endif

/* ---------------------------------------------------------------- the file system */
bool lk_exists;
byte lk_ino;             /* identity of .lock (0 when there is none)               */
byte lk_pid;             /* its bytes: owner pid ...                               */
byte lk_ts;              /* ... and timestamp                                      */
byte now = 1;
byte guard;              /* flock on the feature folder: 0 free, else pid + 1      */

/* ---------------------------------------------------------------- per-process snapshots
 * (global only so that new_ino can see every remembered identity) */
byte jino[NP];           /* try_acquire's judged snapshot (the `holder` variable)  */
byte rino[NP];           /* release_at's snapshot read under the guard             */

/* ---------------------------------------------------------------- ghost state (properties) */
bool alive[NP];
bool holding[NP];
byte my_ino[NP];         /* FeatureLock._mine: identity of our own lock            */
byte my_ts[NP];          /* timestamp in our own lock's record                     */
#ifdef LIVE
bool waiting[NP];        /* inside locks.acquire(timeout=None), not yet won        */
#define NOT_WAITING  waiting[me] = false
#else
#define NOT_WAITING  skip
#endif

#define FRESH(p)       (alive[p] && holding[p] && now - my_ts[p] <= STALE)
#define CUR(p)         (lk_exists && lk_ino == my_ino[p])
#define TWO_FRESH      ((FRESH(0) && FRESH(1)) || (FRESH(0) && FRESH(2)) || (FRESH(1) && FRESH(2)))
#define ORPHAN_FRESH   ((FRESH(0) && !CUR(0)) || (FRESH(1) && !CUR(1)) || (FRESH(2) && !CUR(2)))

#define REMEMBERED(v)  ((lk_exists && v == lk_ino) || \
                        v == my_ino[0] || v == my_ino[1] || v == my_ino[2] || \
                        v == jino[0] || v == jino[1] || v == jino[2] || \
                        v == rino[0] || v == rino[1] || v == rino[2])

/* a new inode: the smallest number nobody remembers (used inside atomic blocks) */
inline new_ino(v) {
    v = 1;
    do
    :: REMEMBERED(v) -> v++
    :: else -> break
    od
}

/* link(temp, .lock) succeeded: .lock appears, complete, with record (me, ts);
 * me is the holder from this very step on */
inline link_ok(ts) {
    new_ino(v);
    lk_exists = true; lk_ino = v; lk_pid = me; lk_ts = ts; v = 0;
    holding[me] = true; my_ino[me] = lk_ino; my_ts[me] = ts; NOT_WAITING
}

/* os.unlink(".lock", dir_fd=dfd) -- unlinkat removes WHATEVER entry is there now.
 * (b): that entry must be `expected`, the one the remover judged or read under the
 * guard. With no entry, unlink fails with ENOENT and removes nothing (remove_if_unchanged
 * suppresses FileNotFoundError; in release_at it would raise). */
inline unlink_lock(expected) {
    if
    :: lk_exists ->
        assert(lk_ino == expected);                 /* (b) exactly the judged entry */
        lk_exists = false; lk_ino = 0; lk_pid = 0; lk_ts = 0
    :: else -> skip
    fi
}

/* Crash points. CPG: here the process holds the guard, so a crash also frees the
 * guard -- an effect no mere pause can have -- and these are always explored.
 * CP: here it holds no guard. For the SAFETY properties a crash there is the same as
 * pausing for ever at that point (no process reads another's liveness, and a crashed
 * holder only drops out of the "live" holders, which weakens (a)); pausing for ever is
 * an interleaving SPIN explores anyway. So CP is a real branch only in the LIVE run
 * (fairness would resume a paused process, never a crashed one) or with -DALLCRASH. */
#define CPG if :: skip :: goto crash fi
#if defined(LIVE) || defined(ALLCRASH)
#define CP  if :: skip :: goto crash fi
#else
#define CP  skip
#endif

proctype P(byte me)
{
    byte t;          /* try_acquire's `now`: the record's timestamp AND the judging time */
    byte round;
    byte cyc;
    byte nref;
    byte v;          /* scratch for new_ino */
    bool ok;

cycle:
#ifndef LIVE
    if
    :: cyc == CYCLES -> goto finish
    :: else -> cyc++
    fi;
#else
    waiting[me] = true;
#endif

    /* ======================= try_acquire(dfd, pid, now) ======================= */
    /* locks._try_once: now = _utils.now();  publish_or_reclaim: record = format_record(pid, now) */
    t = now;
top:
    /* for _ in range(MAX_ROUNDS) */
    if
    :: round == ROUNDS -> goto gave_up            /* rounds used up: "held"          */
    :: else -> round++
    fi;
    /* _publish -> _publish_unnamed / _publish_named: the record goes into a private
     * (O_TMPFILE or named temp) file nobody reads -- no shared step -- then
     * link(temp, .lock), which fails with EEXIST (FileExistsError -> None) if .lock exists */
    atomic {
        if
        :: !lk_exists ->
            link_ok(t);
            printf("P%d _publish: link wins ino %d ts %d (now %d)\n", me, lk_ino, t, now);
            goto holder
        :: else -> skip
        fi
    }
    CP;
    /* try_acquire: holder = read_lock(dfd) -- open, fstat(fd), read(fd): one consistent
     * (identity, bytes); state = judge_lock(holder, now) with try_acquire's now = t, a
     * local value, so judging in the same step as the read loses no interleaving */
    atomic {
        if
        :: !lk_exists -> goto top                  /* FREE: released meanwhile, publish again */
        :: lk_exists && t - lk_ts <= STALE ->      /* ACTIVE: may_reclaim is false -> "held"  */
            printf("P%d try_acquire: ino %d active -> held\n", me, lk_ino);
            goto gave_up
        :: lk_exists && t - lk_ts > STALE ->       /* STALE: may_reclaim -> reclaim           */
            jino[me] = lk_ino;
            printf("P%d try_acquire: judged ino %d (pid %d ts %d) stale\n", me, lk_ino, lk_pid, lk_ts)
        fi
    }
    CP;

    /* ======================= the reclaim step (publish_or_reclaim) ======================= */
    /* with guard(dfd, wait=False, until=deadline) as taken: a busy guard is waited for (a
     * remover is mid-removal), until a deadline 0.5 s after the call's first wait; only then
     * "not taken -> None -> held". The wait blocks here until the guard is free; the bound is
     * a nondeterministic give-up that is enabled only while the guard is busy. */
    if
#ifndef MUT_NO_GUARD
    :: atomic { guard == 0 -> guard = me + 1 }
#else
    :: atomic { true -> skip }                       /* MUTANT: reclaim without the guard */
#endif
    :: atomic {
           guard != 0 ->                             /* the deadline passed: "held" */
           printf("P%d reclaim: guard busy past the deadline -> held\n", me);
           jino[me] = 0; goto gave_up
       }
    fi;
    CPG;
    /* remove_if_unchanged: read_lock(dfd).same_entry(judged), under the guard */
#ifndef MUT_NO_RECHECK
    atomic { ok = (lk_exists && lk_ino == jino[me]) }
#else
    atomic { ok = lk_exists }                       /* MUTANT: no identity re-check */
#endif
    CPG;
    if
    :: !ok ->                                        /* _CHANGED: leave the guard, next round */
        atomic { printf("P%d reclaim: changed -> re-judge\n", me); jino[me] = 0; guard = 0 }
        CP;
        goto top
    :: else -> ok = false
    fi;
    /* remove_if_unchanged: os.unlink(".lock", dir_fd=dfd) */
    atomic {
        printf("P%d reclaim: unlink ino %d\n", me, lk_ino);
        assert(!lk_exists || lk_ino == jino[me]);  /* (b)  the judged entry ...     */
        assert(!lk_exists || now - lk_ts > STALE); /* (b2) ... and it is stale now   */
        unlink_lock(jino[me]);
        jino[me] = 0
    }
    CPG;
    /* sweep_orphan_temps(dfd): temp files only, not modelled.
     * _publish(dfd, record), still under the guard: link() of the SAME record (ts = t) */
    atomic {
        if
        :: !lk_exists ->
            link_ok(t); ok = true;
            printf("P%d reclaim: link wins ino %d ts %d (now %d)\n", me, lk_ino, t, now)
        :: else ->                                 /* a fast-path publish slipped in: None */
            printf("P%d reclaim: link EEXIST -> held\n", me)
        fi
    }
    CPG;
    guard = 0;                                       /* leaving `with guard(...)` */
    CP;
    if
    :: ok -> ok = false; goto holder
    :: else -> goto gave_up
    fi;

holder:
    /* ======================= holding (FeatureLock) ======================= */
    atomic { t = 0; round = 0 }
    CP;
    do
    :: nref < NREF ->
        nref++;
        /* FeatureLock.refresh: record = format_record(pid, _utils.now()), before the guard */
        t = now;
        /* replace_if_unchanged: with guard(dfd, wait=True) -- blocking. (Its 0.5 s
         * GuardBusyError only skips one heartbeat: same as not refreshing.) */
        atomic { guard == 0 -> guard = me + 1 }
        CPG;
        /* read_lock(dfd).same_entry(judged = self._mine) */
        atomic { ok = (lk_exists && lk_ino == my_ino[me]) }
        CPG;
        if
        :: ok ->
            /* _write_named_temp (private), then os.rename(temp, .lock): atomic swap */
            atomic {
                /* rename() replaces whatever .lock is now (or creates it) */
                assert(!lk_exists || lk_ino == my_ino[me]);  /* (b) replaces exactly our lock */
                new_ino(v);
                lk_exists = true;
                lk_ino = v; lk_pid = me; lk_ts = t; v = 0;
                my_ino[me] = lk_ino; my_ts[me] = t;          /* self._mine = fresh */
                printf("P%d replace_if_unchanged: rename -> ino %d ts %d (now %d)\n", me, lk_ino, t, now);
                t = 0; ok = false
            }
            CPG;
            guard = 0;
            CP
        :: else ->
            /* None -> LockLostError: self._mine = None; FeatureLock.release then removes
             * nothing, so the hold ends here */
            atomic {
                printf("P%d replace_if_unchanged: not ours any more -> lost\n", me);
                holding[me] = false; my_ino[me] = 0; my_ts[me] = 0;
                t = 0; guard = 0
            }
            CP;
            goto after_release
        fi
    :: break
    od;

    /* ======================= release ======================= */
    if
    :: /* legacy release_feature_lock -> release_at(dfd, pid, now): the pid decides */
        atomic { guard == 0 -> guard = me + 1 }      /* with guard(dfd, wait=True) */
        CPG;
        /* snapshot = read_lock(dfd); judge_lock; record[0] == pid ? */
        atomic {
            if
            :: lk_exists && lk_pid == me -> rino[me] = lk_ino; ok = true
            :: else -> ok = false                   /* NOTHING / NOT_OWNER */
            fi
        }
        CPG;
        if
        :: ok ->                                     /* os.unlink(".lock", dir_fd) */
            atomic {
                assert(rino[me] == my_ino[me]);            /* the pid found OUR lock      */
                printf("P%d release_at: unlink ino %d\n", me, lk_ino);
                unlink_lock(rino[me]);                     /* (b) the entry it read       */
                holding[me] = false; my_ino[me] = 0; my_ts[me] = 0; rino[me] = 0; ok = false
            }
        :: else ->
            atomic {
                printf("P%d release_at: not ours -> left\n", me);
                holding[me] = false; my_ino[me] = 0; my_ts[me] = 0
            }
        fi;
        CPG;
        guard = 0
    :: /* FeatureLock.release -> remove_judged(dfd, mine) -> remove_if_unchanged */
        atomic { guard == 0 -> guard = me + 1 }      /* with guard(dfd, wait=True) */
        CPG;
        atomic { ok = (lk_exists && lk_ino == my_ino[me]) }    /* same_entry(judged) */
        CPG;
        if
        :: ok ->                                     /* os.unlink(".lock", dir_fd) */
            atomic {
                printf("P%d remove_judged: unlink ino %d\n", me, lk_ino);
                unlink_lock(my_ino[me]);                     /* (b) */
                holding[me] = false; my_ino[me] = 0; my_ts[me] = 0; ok = false
            }
        :: else ->
            atomic {
                printf("P%d remove_judged: replaced -> left\n", me);
                holding[me] = false; my_ino[me] = 0; my_ts[me] = 0
            }
        fi;
        CPG;
        guard = 0
    fi;
    CP;
after_release:
    nref = 0;
#ifdef LIVE
    goto finish;
#else
    goto cycle;
#endif

gave_up:
    atomic { t = 0; round = 0 }
    goto cycle;              /* LIVE: locks.acquire(timeout=None) sleeps, then tries again */

crash:
    atomic {
        printf("P%d CRASH\n", me);
        alive[me] = false;
#ifndef MUT_GUARD_SURVIVES_CRASH
        if :: guard == me + 1 -> guard = 0 :: else -> skip fi;   /* the kernel drops the flock */
#endif
        holding[me] = false; my_ino[me] = 0; my_ts[me] = 0; jino[me] = 0; rino[me] = 0;
#ifdef LIVE
        waiting[me] = false;
#endif
        t = 0; round = 0; cyc = 0; nref = 0; ok = false
    }
    goto stop;
finish:
    atomic {
#ifdef LIVE
        waiting[me] = false;
#endif
        t = 0; round = 0; cyc = 0; nref = 0
    }
stop:
    skip
}

/* the movable wall clock: forward only */
proctype clock()
{
    do
    :: now < MAXT -> now++
    :: else -> break
    od
}

#ifndef LIVE
/* (a) and (a2): this monitor can move (and fail) exactly in the violating states */
#ifndef NAIVE
proctype monitor()
{
end_watch:
    atomic {
        (TWO_FRESH || ORPHAN_FRESH) ->
        assert(!TWO_FRESH);        /* (a)  */
        assert(!ORPHAN_FRESH)      /* (a2) */
    }
}
#else
/* NAIVE: "never two live holders", freshness ignored. This MUST fail: it shows that a
 * holder whose record went stale really is displaced, i.e. (a) is not vacuous and
 * the freshness clause in it is needed. */
#define HOLDS(p)   (alive[p] && holding[p])
#define TWO_LIVE   ((HOLDS(0) && HOLDS(1)) || (HOLDS(0) && HOLDS(2)) || (HOLDS(1) && HOLDS(2)))
proctype monitor()
{
end_watch:
    atomic { TWO_LIVE -> assert(!TWO_LIVE) }
}
#endif
#endif

init {
    atomic {
        alive[0] = true; alive[1] = true; alive[2] = true;
        run clock();
#ifndef LIVE
        run monitor();
#endif
        run P(0); run P(1); run P(2)
    }
}

#ifdef LIVE
#define SOMEONE_WAITING  (waiting[0] || waiting[1] || waiting[2])
#define STALE_LOCK       (lk_exists && now - lk_ts > STALE)
#define DEAD_STALE_LOCK  (STALE_LOCK && !alive[lk_pid])
/* (c): a stale lock never blocks waiters for ever */
ltl c      { [] (STALE_LOCK      -> <> (!STALE_LOCK      || !SOMEONE_WAITING)) }
#define LIVE_OWNS(p)     (alive[p] && holding[p] && lk_exists && lk_ino == my_ino[p])
#define A_LIVE_HOLDER    (LIVE_OWNS(0) || LIVE_OWNS(1) || LIVE_OWNS(2))
/* (c_dead): a crashed holder's stale lock: eventually some live acquirer has won
 * (.lock is the lock of a live holder), unless nobody is waiting any more */
ltl c_dead { [] (DEAD_STALE_LOCK -> <> (A_LIVE_HOLDER || !SOMEONE_WAITING)) }
#endif
