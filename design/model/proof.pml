/*
 * The proof of life (mahabharatha/owner/proof.py), checked with SPIN: design/model/README.md,
 * "The proof of life". One feature folder; R is `lock run` (publishes once, holding its proof,
 * starts CMD's work, which inherits the proof, and releases after the work); C is another
 * worker with --reclaim-dead (publishes, and when that fails judges the lock by the proof and
 * reclaims it under the guard). R may crash (SIGKILL) after any step; the work ends when it
 * ends, whatever happens to R.
 *
 * Property (a): C never holds the lock while R holds it alive, or while R's work runs.
 *
 * Mutants that MUST fail (non-vacuity):
 *   MUT_PENDING_AFTER_LINK  the publisher takes no proof before its link (only after it)
 *   MUT_NO_WORK_WAIT        lock run releases as soon as CMD ends, not when its proof is free
 *   MUT_PROOF_ON_LOCKFILE   the proof lives on the lock file, and a refresh (rename) loses the
 *                           work's copy
 */

#ifndef ROUNDS
#define ROUNDS 2
#endif

bool lk_exists = 0;
byte lk_ino = 0;          /* identity of .lock (0: none) */
byte next_ino = 1;
bool guard = 0;

/* open-file-description locks of the folder: R's own, the work's copy, C's own */
bool r_pending = 0, r_life = 0;
bool w_life = 0;          /* the work's copy (LIFE, PENDING and WORK bytes) */
bool c_pending = 0, c_life = 0;

bool r_alive = 1, r_holding = 0, work_alive = 0;
bool c_holding = 0;

#define OTHERS_LIFE_FOR_C     (r_life || w_life)
#define OTHERS_PENDING_FOR_C  (r_pending || w_life)

inline publish(pend, life, holding, ok) {
    atomic {
        if
        :: !lk_exists -> lk_exists = 1; lk_ino = next_ino; next_ino++; holding = 1; ok = 1
        :: else -> ok = 0
        fi
    }
}

#define MAYBE_CRASH  if :: true -> goto crashed :: true -> skip fi

active proctype Runner() {
    bool ok = 0, r_guard = 0;
#ifndef MUT_PENDING_AFTER_LINK
    r_pending = 1;
    MAYBE_CRASH;
#endif
    publish(r_pending, r_life, r_holding, ok);
    MAYBE_CRASH;
    if
    :: !ok -> r_pending = 0; goto out
    :: else -> skip
    fi;
#ifdef MUT_PENDING_AFTER_LINK
    r_pending = 1;
    MAYBE_CRASH;
#endif
    r_life = 1;                       /* LIFE, before PENDING could ever be dropped */
    MAYBE_CRASH;
    /* CMD starts with its own copy of the proof; R closes its copy of the work's descriptor */
    atomic { work_alive = 1; w_life = 1 };
    MAYBE_CRASH;
#ifdef MUT_PROOF_ON_LOCKFILE
    /* a refresh renames a new file over .lock: the work's copy was on the old inode */
    atomic { lk_ino = next_ino; next_ino++; w_life = 0 };
    MAYBE_CRASH;
#endif
    /* CMD itself ends here (its work may run on); R waits for the work's proof */
#ifndef MUT_NO_WORK_WAIT
    (!w_life);
#endif
    atomic { !guard -> guard = 1; r_guard = 1 };
    MAYBE_CRASH;
    atomic {    /* the unlink: from this step on R holds nothing */
        if
        :: lk_exists && r_holding -> lk_exists = 0; lk_ino = 0; r_holding = 0
        :: else -> skip
        fi
    };
    atomic { guard = 0; r_guard = 0; r_holding = 0; r_life = 0; r_pending = 0 };
    goto out;
crashed:
    /* SIGKILL: its descriptors close (proof and guard); what it published stays on disk */
    atomic { r_alive = 0; r_life = 0; r_pending = 0;
             if :: r_guard -> guard = 0; r_guard = 0 :: else -> skip fi };
out:
    skip
}

active proctype Work() {
    /* the work ends when it ends (every process holding its copy of the proof exits) */
end_idle:
    work_alive -> atomic { work_alive = 0; w_life = 0 }
}

active proctype Contender() {
    byte round = 0, judged = 0;
    bool ok = 0, dead = 0;
    do
    :: round < ROUNDS ->
        round++;
        c_pending = 1;
        publish(c_pending, c_life, c_holding, ok);
        if
        :: ok -> c_life = 1;
                 assert(!((r_alive && r_holding) || work_alive));   /* (a) */
                 atomic { !guard -> guard = 1 };
                 atomic { lk_exists = 0; lk_ino = 0; c_holding = 0 };
                 atomic { guard = 0; c_life = 0; c_pending = 0 }
        :: else ->
            c_pending = 0;
            judged = lk_ino;          /* read the lock first, then look at the proof */
            dead = 0;
            if
            :: OTHERS_LIFE_FOR_C -> skip            /* held: alive */
            :: else ->
                if
                :: OTHERS_PENDING_FOR_C -> skip     /* a publisher mid-publish: alive (or wait) */
                :: else -> dead = 1
                fi
            fi;
            if
            :: dead && judged != 0 ->
                atomic { !guard -> guard = 1 };
                /* under the guard: the same entry, and its proof still free */
                if
                :: lk_exists && lk_ino == judged && !OTHERS_LIFE_FOR_C && !OTHERS_PENDING_FOR_C ->
                    lk_exists = 0; lk_ino = 0;
                    c_pending = 1;
                    publish(c_pending, c_life, c_holding, ok);
                    guard = 0;
                    if
                    :: ok -> c_life = 1;
                             assert(!((r_alive && r_holding) || work_alive));   /* (a) */
                             atomic { !guard -> guard = 1 };
                             atomic { lk_exists = 0; lk_ino = 0; c_holding = 0 };
                             atomic { guard = 0; c_life = 0; c_pending = 0 }
                    :: else -> c_pending = 0
                    fi
                :: else -> guard = 0
                fi
            :: else -> skip
            fi
        fi
    :: else -> break
    od
}
