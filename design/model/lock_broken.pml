/*
 * lock_broken.pml -- the OLD lock design (tests/support/old_design.py: check-then-create,
 * release by name), modelled exactly like lock.pml so that the SAME checks
 * can be run on it. They MUST fail: check.sh treats a pass as an error.
 *
 *   acquire_feature_lock: lock_path.exists(); read it BY NAME; if the record parses and
 *     is fresh -> False; otherwise (stale, corrupt, empty, vanished) unlink it BY NAME
 *     (no guard, no identity re-check); os.open(O_CREAT|O_EXCL) -> FileExistsError ->
 *     False; then os.write(fd, "pid:time.time()") into the new file; -> True.
 *   release_feature_lock: lock_path.exists(); read it; if it does not parse or its pid
 *     is ours -> unlink BY NAME.
 *   No heartbeat (the old design had none).
 *
 * Shared state, clock, identities, crash points, the holder definition and the
 * properties are those of lock.pml; see its header. One addition: lk_valid is false
 * between O_EXCL create and the write (readers then see an empty file = corrupt).
 *
 * Expected verdicts:
 *   -DONLY_A  (a) only: two live fresh holders       -> FAILS
 *   -DONLY_B  (b) only: a removal of another lock     -> FAILS
 *   (neither) both checks on                          -> FAILS (first one found)
 *   -DATOMIC_CREATE: create and write in one step (no empty-file window), and
 *   -DATOMIC_READ: exists() and the read in one step (no "vanished" read). With both,
 *   only read-decide-unlink-by-name is left to blame; (a) and (b) must still fail.
 */

#define NP      3
#ifndef STALE
#define STALE   2
#endif
#ifndef MAXT
#define MAXT    4
#endif
#ifndef CYCLES
#define CYCLES  2
#endif

bool lk_exists;
bool lk_valid;           /* false: created by O_EXCL, record not written yet (empty) */
byte lk_ino;
byte lk_pid;
byte lk_ts;
byte now = 1;

byte jino[NP];           /* the entry its remover read (0: read nothing / vanished) */
byte fdino[NP];          /* the inode its O_EXCL descriptor refers to (until the write) */

bool alive[NP];
bool holding[NP];
byte my_ino[NP];
byte my_ts[NP];

#define FRESH(p)       (alive[p] && holding[p] && now - my_ts[p] <= STALE)
#define CUR(p)         (lk_exists && lk_ino == my_ino[p])
#define TWO_FRESH      ((FRESH(0) && FRESH(1)) || (FRESH(0) && FRESH(2)) || (FRESH(1) && FRESH(2)))

#define REMEMBERED(v)  ((lk_exists && v == lk_ino) || \
                        v == my_ino[0] || v == my_ino[1] || v == my_ino[2] || \
                        v == jino[0] || v == jino[1] || v == jino[2] || \
                        v == fdino[0] || v == fdino[1] || v == fdino[2])

#define DROP  holding[me] = false; my_ino[me] = 0; my_ts[me] = 0

#ifdef ONLY_A
#define ASSERT_B(x)  skip
#else
#define ASSERT_B(x)  assert(x)
#endif

inline new_ino(v) {
    v = 1;
    do
    :: REMEMBERED(v) -> v++
    :: else -> break
    od
}

/* no guard exists in this design, so a crash is never more than a pause (see lock.pml) */
#ifdef ALLCRASH
#define CP  if :: skip :: goto crash fi
#else
#define CP  skip
#endif

proctype P(byte me)
{
    byte cyc;
    byte v;
    bool ok;

cycle:
    if
    :: cyc == CYCLES -> goto finish
    :: else -> cyc++
    fi;

    /* ======================= acquire_feature_lock (old) ======================= */
    /* if lock_path.exists(): */
    if
    :: atomic { lk_exists -> skip
#ifndef ATOMIC_READ
        }
        CP;
        atomic {
#endif
        /* content = _safe_read_text(lock_path): read BY NAME, a separate open */
            if
            :: lk_exists && lk_valid && now - lk_ts <= STALE ->   /* parses, fresh: False */
                printf("P%d acquire: ino %d active -> False\n", me, lk_ino);
                goto cycle
            :: lk_exists && lk_valid && now - lk_ts > STALE ->
                jino[me] = lk_ino;
                printf("P%d acquire: judged ino %d (pid %d ts %d) stale\n", me, lk_ino, lk_pid, lk_ts)
            :: lk_exists && !lk_valid ->                          /* empty: corrupt */
                jino[me] = lk_ino;
                printf("P%d acquire: judged ino %d empty -> corrupt\n", me, lk_ino)
            :: !lk_exists ->                                      /* vanished: None -> corrupt */
                jino[me] = 0;
                printf("P%d acquire: read failed (vanished) -> corrupt\n", me)
            fi
        }
        CP;
        /* lock_path.unlink(missing_ok=True): BY NAME, whatever is there now */
        atomic {
            if
            :: lk_exists ->
                ASSERT_B(lk_ino == jino[me]);        /* (b) removes exactly what it judged */
                printf("P%d acquire: unlink ino %d by name\n", me, lk_ino);
                lk_exists = false; lk_valid = false; lk_ino = 0; lk_pid = 0; lk_ts = 0
            :: else -> skip
            fi;
            jino[me] = 0
        }
        CP
    :: atomic { !lk_exists -> skip }
    fi;
    /* fd = os.open(lock_path, O_CREAT | O_EXCL | O_WRONLY): an EMPTY .lock appears */
    atomic {
        if
        :: !lk_exists ->
            new_ino(v);
            lk_exists = true; lk_valid = false; lk_ino = v; lk_pid = 0; lk_ts = 0;
            fdino[me] = v; v = 0;
            printf("P%d acquire: O_EXCL created ino %d\n", me, fdino[me])
        :: else ->                                    /* FileExistsError -> False */
            printf("P%d acquire: O_EXCL EEXIST -> False\n", me);
            goto cycle
        fi
#ifndef ATOMIC_CREATE
    }
    CP;
    atomic {
#endif
    /* os.write(fd, f"{pid}:{time.time()}"); return True -- the write goes to OUR inode,
     * which may already have been unlinked (then nobody ever sees it) */
        if
        :: lk_exists && lk_ino == fdino[me] -> lk_valid = true; lk_pid = me; lk_ts = now
        :: else -> skip                               /* written into an orphaned inode */
        fi;
        holding[me] = true; my_ino[me] = fdino[me]; my_ts[me] = now; fdino[me] = 0;
        printf("P%d acquire: True (ino %d ts %d)\n", me, my_ino[me], now)
    }
    CP;

    /* ======================= holding: no heartbeat in the old design ======================= */

    /* ======================= release_feature_lock (old) ======================= */
    /* As in lock.pml, the caller counts as holder until the step in which release
     * removes the lock or decides to leave it. */
    if
    :: atomic { lk_exists -> skip }                   /* lock_path.exists() */
        CP;
        /* content = _safe_read_text(lock_path); parsed is None or parsed[0] == os.getpid() */
        atomic {
            if
            :: lk_exists && lk_valid && lk_pid != me ->   /* another pid: leave it */
                ok = false; DROP
            :: lk_exists && !(lk_valid && lk_pid != me) -> ok = true; jino[me] = lk_ino
            :: !lk_exists -> ok = true; jino[me] = 0      /* read failed -> None -> unlink */
            fi
        }
        CP;
        if
        :: ok ->
            /* lock_path.unlink(missing_ok=True): BY NAME */
            atomic {
                if
                :: lk_exists ->
                    ASSERT_B(lk_ino == jino[me]);    /* (b) */
                    printf("P%d release: unlink ino %d by name\n", me, lk_ino);
                    lk_exists = false; lk_valid = false; lk_ino = 0; lk_pid = 0; lk_ts = 0
                :: else -> skip
                fi;
                jino[me] = 0; ok = false; DROP
            }
        :: else -> skip
        fi
    :: atomic { !lk_exists -> DROP }
    fi;
    CP;
    goto cycle;

crash:
    atomic {
        printf("P%d CRASH\n", me);
        alive[me] = false;
        holding[me] = false; my_ino[me] = 0; my_ts[me] = 0; jino[me] = 0;
        cyc = 0; fdino[me] = 0; ok = false
    }
    goto stop;
finish:
    cyc = 0;
stop:
    skip
}

proctype clock()
{
    do
    :: now < MAXT -> now++
    :: else -> break
    od
}

#ifndef ONLY_B
proctype monitor()
{
end_watch:
    atomic { TWO_FRESH -> assert(!TWO_FRESH) }     /* (a) */
}
#endif

init {
    atomic {
        alive[0] = true; alive[1] = true; alive[2] = true;
        run clock();
#ifndef ONLY_B
        run monitor();
#endif
        run P(0); run P(1); run P(2)
    }
}
