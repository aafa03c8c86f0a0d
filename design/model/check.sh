#!/usr/bin/env bash
# Model-check the feature-lock protocol with SPIN (see README.md in this folder).
#
#   bash design/model/check.sh
#
# Needs `spin` and `gcc` on PATH (Debian: apt-get install -y spin gcc); installs nothing.
# Everything is generated in a temporary directory that is removed at exit, so nothing
# lands in the repository. Two lanes run in parallel (2 cores); about 40 s and < 2.5 GiB.
#
# Exit status 0 only if
#   - lock.pml passes every check (0 errors, search complete), and
#   - every run that MUST fail does fail: lock_broken.pml (the old design) on (a) and (b),
#     and the non-vacuity checks of lock.pml (NAIVE property, three mutants).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

for tool in spin gcc; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "check.sh: '$tool' is not on PATH (Debian: apt-get install -y spin gcc)" >&2
        exit 2
    fi
done

work="$(mktemp -d "${TMPDIR:-/tmp}/lock-model.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cp "$here/lock.pml" "$here/lock_broken.pml" "$here/proof.pml" "$work/"

# run NAME EXPECT MODEL "SPIN_FLAGS" "CC_FLAGS" "PAN_FLAGS"
#   EXPECT = pass: pan must report 0 errors and a complete search
#   EXPECT = fail: pan must report at least one error; its trail is narrated
run() {
    local name="$1" expect="$2" model="$3" sflags="$4" cflags="$5" pflags="$6"
    local dir="$work/$name" verdict detail
    mkdir -p "$dir"
    cp "$work/$model" "$dir/"
    (
        cd "$dir"
        local t0 t1
        t0=$(date +%s.%N)
        # shellcheck disable=SC2086
        spin $sflags -a "$model" >spin.log 2>&1 || { echo "FAIL $name: spin -a failed" >result; cat spin.log >>result; exit 0; }
        # shellcheck disable=SC2086
        gcc -w -O2 $cflags -o pan pan.c >gcc.log 2>&1 || { echo "FAIL $name: gcc failed" >result; cat gcc.log >>result; exit 0; }
        # shellcheck disable=SC2086
        ./pan $pflags >pan.log 2>&1 || true
        t1=$(date +%s.%N)
        local errors states secs
        errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' pan.log | tail -1)
        states=$(awk '/states, stored/ {print $1; exit}' pan.log)
        secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
        detail="errors: ${errors:-?}, states stored: ${states:-?}, ${secs} s (spin+gcc+pan)"
        if [ -z "$errors" ]; then
            verdict="FAIL $name: pan gave no verdict"
        elif grep -q "max search depth too small" pan.log; then
            verdict="FAIL $name: search incomplete (depth limit) -- $detail"
        elif [ "$expect" = pass ]; then
            if [ "$errors" = 0 ]; then verdict="PASS $name: holds -- $detail"
            else verdict="FAIL $name: MUST hold but pan found a violation -- $detail"; fi
        else
            if [ "$errors" != 0 ]; then verdict="PASS $name: violated as expected -- $detail"
            else verdict="FAIL $name: MUST be violated but pan found nothing -- $detail"; fi
        fi
        {
            echo "$verdict"
            grep -E "^pan:1:" pan.log | head -1 | cut -c1-160 | sed 's/^/      /' || true
            if [ "$errors" != "0" ] && [ -n "$errors" ]; then
                echo "      counterexample (printf narration of the trail):"
                # shellcheck disable=SC2086
                spin $sflags -t "$model" 2>&1 \
                    | grep -E '^ +P[0-9]|START OF CYCLE|assertion violated' \
                    | sed -e 's/^ */        /' | tail -n 14 || true
            fi
        } >result
    )
}

SAFE="-DSAFETY -DCOLLAPSE"
LIVE_CC="-DNFAIR=3 -DCOLLAPSE"

lane1() {
    # the main exhaustive SAFETY run: (a) (a2) (b) (b2) + no blocking for ever
    run lock-safety          pass lock.pml "-DMAXT=4 -DCYCLES=2 -DROUNDS=3 -DNREF=1" "$SAFE" "-m100000 -w26"
    # liveness (c_dead): a crashed holder's stale lock ends with a live winner
    run lock-live-c_dead     pass lock.pml "-DLIVE -DMAXT=4 -DROUNDS=3 -DNREF=1" "$LIVE_CC" "-a -f -m1000000 -N c_dead"
    # the old design must fail (a) and (b); BFS gives the shortest counterexample
    run broken-a             fail lock_broken.pml "-DONLY_A" "-DSAFETY -DBFS" ""
    run broken-b             fail lock_broken.pml "-DONLY_B" "-DSAFETY -DBFS" ""
    run broken-a-no-window   fail lock_broken.pml "-DONLY_A -DATOMIC_CREATE -DATOMIC_READ" "-DSAFETY -DBFS" ""
    run broken-b-no-window   fail lock_broken.pml "-DONLY_B -DATOMIC_CREATE -DATOMIC_READ" "-DSAFETY -DBFS" ""
    # the proof of life (proof.pml): holds; each mutant MUST fail
    run proof-safety         pass proof.pml "-DROUNDS=3" "-DSAFETY" "-m100000"
    run proof-pending-after-link fail proof.pml "-DMUT_PENDING_AFTER_LINK" "-DSAFETY -DBFS" ""
    run proof-no-work-wait   fail proof.pml "-DMUT_NO_WORK_WAIT" "-DSAFETY -DBFS" ""
    run proof-on-lockfile    fail proof.pml "-DMUT_PROOF_ON_LOCKFILE" "-DSAFETY -DBFS" ""
}

lane2() {
    # a second SAFETY run: longer clock, two heartbeats per hold, one cycle each
    run lock-safety-wide     pass lock.pml "-DMAXT=5 -DCYCLES=1 -DROUNDS=3 -DNREF=2" "$SAFE" "-m100000"
    # liveness (c): no stale lock blocks waiters for ever
    run lock-live-c          pass lock.pml "-DLIVE -DMAXT=4 -DROUNDS=3 -DNREF=1" "$LIVE_CC" "-a -f -m1000000 -N c"
    # non-vacuity: these MUST fail
    run lock-naive-exclusion fail lock.pml "-DNAIVE -DMAXT=4 -DROUNDS=3" "-DSAFETY -DBFS" ""
    run mutant-no-recheck    fail lock.pml "-DMUT_NO_RECHECK -DMAXT=4 -DROUNDS=3" "-DSAFETY -DBFS" ""
    run mutant-no-guard      fail lock.pml "-DMUT_NO_GUARD -DMAXT=4 -DROUNDS=3" "-DSAFETY -DBFS" ""
    run mutant-guard-kept    fail lock.pml "-DMUT_GUARD_SURVIVES_CRASH -DMAXT=4 -DROUNDS=3" "-DSAFETY -DBFS" ""
    run mutant-guard-kept-live fail lock.pml "-DLIVE -DMUT_GUARD_SURVIVES_CRASH -DMAXT=4 -DROUNDS=3" "$LIVE_CC" "-a -f -m1000000 -N c_dead"
}

start=$(date +%s)
lane1 & p1=$!
lane2 & p2=$!
wait "$p1"
wait "$p2"
end=$(date +%s)

order="lock-safety lock-safety-wide lock-live-c lock-live-c_dead
lock-naive-exclusion mutant-no-recheck mutant-no-guard mutant-guard-kept mutant-guard-kept-live
broken-a broken-b broken-a-no-window broken-b-no-window
proof-safety proof-pending-after-link proof-no-work-wait proof-on-lockfile"

passed=0
failed=0
for name in $order; do
    if [ -f "$work/$name/result" ]; then
        cat "$work/$name/result"
        if head -1 "$work/$name/result" | grep -q '^PASS'; then
            passed=$((passed + 1))
        else
            failed=$((failed + 1))
        fi
    else
        echo "FAIL $name: did not run"
        failed=$((failed + 1))
    fi
done
echo "wall time: $((end - start)) s"
echo "model: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
