#!/bin/sh
# device_round.sh - everything pending on the GPU machine in two `run` calls
# (2026-12: its prebuilt bundle no longer fits a call beside the ~58 MiB
# tracked tree, each binary carrying ~12 MB of sm_90a code; `prepare` warns.
# bench/device_kit.sh builds on the GPU machine instead, as
# bench/prefill_cuda.sh does)
# of at most 9 minutes each, with the results coming back as a few files.
#
#   sh bench/device_round.sh prepare      HERE (nvcc, npm): builds BUILD (default
#                                         build-gpu, KVQ_DEVICE_BUILD=DIR) with
#                                         nvcc, bundles it (bench/cuda_bundle.sh,
#                                         python/bundle.sh), fetches the tokenizer
#                                         data and writes .devbundle/round/
#                                         (git-ignored); prints the two calls
#   sh bench/device_round.sh run1 OUT     ON THE DEVICE, run 1 (about 9 min), two lanes
#       at once, each on half of the cores:
#       GPU lane: (1) bench/run_cuda.sh DEV W test (test_cuda, test_backend_ops
#                 -o encode,attend,attend-window, test_decoder_cuda), then
#                 run_cuda.sh's sanitize stage (memcheck + racecheck on
#                 test_cuda and test_backend_ops, KVQ_CUDA_TEST_SMALL=1), then
#                 (5) the server on the GPU (bench/bench_serve.sh, FULL) if
#                 time is left (a skip line if the machine has no curl)
#       CPU lane: (2) tokenizer references (tests/tokenizer/make_refs.py
#                 --compare tests/tokenizer/expected: skipped unless
#                 prepared with KVQ_TOKREF_FULL=1, the tokenizers being too
#                 big to travel with the rest; make_chat_refs.py, its
#                 renders compared with the committed ones), (1) test_batch and
#                 test_batch_share (mostly the CPU decoder; their CUDA cases
#                 come last), (3) model references (tests/models/make_refs.py)
#       OUT gets: summary.txt, logs.tar.gz (every log, run_cuda's run.log,
#                 bench_serve.json), tokrefs.tar.gz (tok/, chat/), model_refs.tar
#                 (models/FAMILY/...; `tar xf model_refs.tar -C tests` puts it
#                 in place)
#   sh bench/device_round.sh run2 OUT     ON THE DEVICE, run 2: (4) the Python
#       backend, python/run_device.sh (tests + transformers bench, ~8 min).
#       OUT gets: summary.txt, py.tar.gz (log.txt, tests.json, bench.json)
#
# The calls `prepare` prints (run tool; carry = the bundle files only):
#   run  command="sh bench/device_round.sh run1 $OUT"  timeout_s=540
#        carry=[".devbundle/round/dev.tar.xz", ".devbundle/round/tokref.tgz",
#               ".devbundle/round/MANIFEST"]
#   run  command="sh bench/device_round.sh run2 $OUT"  timeout_s=540
#        carry=[".devbundle/round/pydev.tar.xz", ".devbundle/round/MANIFEST"]
#
# Each step runs under a deadline (KVQ_DEVICE_BUDGET seconds from the start,
# default 500; unpacking counts, packing the results takes the rest of
# the 540 s call): it gets min(its cap, time left), is
# skipped when less than its minimum is left, and on time-out its whole
# process tree is killed (run_cuda.sh's own `timeout`s make process groups
# of their own, so a plain `timeout` would leave them running). A failing
# step does not stop the others. summary.txt (one line a step: name,
# ok/FAIL/skip/timeout, seconds, a note) is rewritten after every step, so a
# run cut short still says how far it got. Progress lines carry the UTC time.
# KVQ_DEVICE_STEPS=cuda,batch,... runs only those steps (names: cuda batch
# sanitize serve tokrefs chatrefs modelrefs pyback).
# KVQ_DEVICE_DRY=1: no GPU needed; checks that every file and command the
# run needs is there and prints what it would run.
set -u
round=.devbundle/round
build=${KVQ_DEVICE_BUILD:-build-gpu}
tokdata=${KVQ_TOKDATA:-build/tokenizer-data}
FAMILIES="llama2 llama3 qwen3 gemma3 deepseek_v3 gptoss"
DEV_BINS="kvq tests/test_cuda tests/test_decoder_cuda tests/test_backend_ops tests/test_batch tests/test_batch_share tests/test_sample_cuda bench/bench_cuda bench/bench_prefill_cuda bench/bench_decoder_cuda"
dry=${KVQ_DEVICE_DRY:-0}
t0=$(date +%s)

now() { date -u +%H:%M:%S; }
say() { echo "[$(now) +$(($(date +%s) - t0))s] $*"; }
die() { echo "device_round: $*" >&2; exit 2; }

# ---------------------------------------------------------------- prepare
prepare() {
    { [ -f bench/run_cuda.sh ] && [ -f python/bundle.sh ]; } || die "run from the repository root"
    nvcc=$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)
    [ -x "$nvcc" ] || die "prepare needs nvcc (the GPU build is made here)"
    say "make BUILD=$build -j2 all tests benches (nvcc: $nvcc)"
    mkdir -p "$build"
    make BUILD="$build" -j2 all tests benches >"$build/prepare-make.log" 2>&1 || {
        tail -n 30 "$build/prepare-make.log"; die "make failed (log: $build/prepare-make.log)"; }
    nm -A "$build/lib/libkvq.a" 2>/dev/null | grep -q 'cuda_cache\.o:.* T kvq_cuda_cache_create' ||
        die "$build/lib/libkvq.a has no CUDA code: is nvcc 12+ found by make? ($build/prepare-make.log)"
    say "bench/cuda_bundle.sh $build"
    rm -rf "${build:?}/dev"
    sh bench/cuda_bundle.sh "$build" >"$build/prepare-bundle.log" 2>&1 || { tail -n 20 "$build/prepare-bundle.log"; die "cuda_bundle.sh failed"; }
    for b in $DEV_BINS; do
        [ -x "$build/dev/$b" ] || die "the bundle lacks $b ($build/prepare-bundle.log)"
    done
    say "python/bundle.sh $build"
    sh python/bundle.sh "$build" >"$build/prepare-pybundle.log" 2>&1 || { tail -n 20 "$build/prepare-pybundle.log"; die "python/bundle.sh failed"; }
    say "tests/tokenizer/fetch.sh $tokdata"
    sh tests/tokenizer/fetch.sh "$tokdata"
    rm -rf "$round"
    mkdir -p "$round"
    say "packing into $round (xz -9e: a minute or two)"
    tar cf - -C "$build" dev | xz -9e -T2 >"$round/dev.tar.xz" || die "packing dev failed"
    tar cf - -C "$build" pydev | xz -9e -T2 >"$round/pydev.tar.xz" || die "packing pydev failed"
    fams=""
    for f in $FAMILIES; do
        if [ -s "$tokdata/$f/tokenizer.json" ]; then fams="$fams tokenizer-data/$f"; else say "tokenizer data: $f missing, its references will be skipped"; fi
    done
    tokparent=$(dirname "$tokdata")
    [ "$(basename "$tokdata")" = tokenizer-data ] || die "KVQ_TOKDATA must end in /tokenizer-data"
    # The working tree travels with every call (tracked files, ~60 MB of the
    # 64 MiB a call may carry), so by default only the chat templates go
    # (tokenizer_config.json: what chatrefs needs); KVQ_TOKREF_FULL=1 packs
    # the tokenizers too, for the tokrefs step, in a call of its own
    # (KVQ_DEVICE_STEPS=tokrefs, carrying tokref.tgz and MANIFEST only).
    if [ "${KVQ_TOKREF_FULL:-0}" = 1 ]; then
        # shellcheck disable=SC2086
        [ -n "$fams" ] && tar czf "$round/tokref.tgz" -C "$tokparent" $fams
    else
        cfgs=""
        for f in $fams; do cfgs="$cfgs $f/tokenizer_config.json"; done
        # shellcheck disable=SC2086
        [ -n "$fams" ] && tar czf "$round/tokref.tgz" -C "$tokparent" $cfgs
    fi
    [ -n "$fams" ] || tar czf "$round/tokref.tgz" -T /dev/null
    {
        echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"
        echo "prepared $(date -u '+%F %T') UTC from $build"
        echo "tokenizer families:$fams"
        (cd "$round" && for f in dev.tar.xz pydev.tar.xz tokref.tgz; do echo "$f $(wc -c <"$f") $(sha256sum "$f" | cut -c1-16)"; done)
    } >"$round/MANIFEST"
    cat "$round/MANIFEST"
    tracked=$(git ls-files -z | xargs -0 cat 2>/dev/null | wc -c)
    s1=$((tracked + $(wc -c <"$round/dev.tar.xz") + $(wc -c <"$round/tokref.tgz")))
    s2=$((tracked + $(wc -c <"$round/pydev.tar.xz")))
    [ $s1 -le 67108864 ] && [ $s2 -le 67108864 ] ||
        say "WARNING: a call would carry more than 64 MiB (tracked files $((tracked / 1048576)) MiB): the device tool will refuse it"
    say "what travels, tracked files included: run1 $((s1 / 1048576)).$((s1 % 1048576 * 10 / 1048576)) MiB, run2 $((s2 / 1048576)).$((s2 % 1048576 * 10 / 1048576)) MiB (limit 64 MiB a call)"
    cat <<EOF

The two device calls (run tool), each with timeout_s=540:
  1) command: sh bench/device_round.sh run1 \$OUT
     carry:   [".devbundle/round/dev.tar.xz", ".devbundle/round/tokref.tgz", ".devbundle/round/MANIFEST"]
  2) command: sh bench/device_round.sh run2 \$OUT
     carry:   [".devbundle/round/pydev.tar.xz", ".devbundle/round/MANIFEST"]
Check first, here:  KVQ_DEVICE_DRY=1 sh bench/device_round.sh run1 /tmp/dr1 (and run2)
EOF
}

# ------------------------------------------------------------- the device
# Process tree below $1 (from /proc; ps may be missing there), deepest last.
tree_pids() {
    awk -v root="$1" 'FNR == 1 { f = FILENAME; sub(/^\/proc\//, "", f); sub(/\/stat$/, "", f); s = $0; sub(/.*\) /, "", s); split(s, a, " "); par[f] = a[2] }
        END { out[root] = 1; print root; changed = 1
              while (changed) { changed = 0; for (p in par) if (!(p in out) && (par[p] in out)) { out[p] = 1; print p; changed = 1 } } }' \
        /proc/[0-9]*/stat 2>/dev/null
}

# record NAME STATUS SECONDS NOTE: one summary line, kept in W/res (sorted by step order)
record() {
    printf '%-10s %-7s %4ss  %s\n' "$1" "$2" "$3" "$4" >"$W/res/$(order "$1")-$1"
    say "$1: $2 after $3 s${4:+ ($4)}"
    write_summary
}
order() {
    i=0
    for s in env cuda batch sanitize serve tokrefs chatrefs modelrefs pyback; do
        i=$((i + 1)); [ "$s" = "$1" ] && { echo "$i"; return; }
    done
    echo 99
}
write_summary() {
    # one temporary file per step: the two lanes write at the same time
    tmp="$OUT/.summary.${name:-head}"
    { cat "$W/head"; cat "$W"/res/* 2>/dev/null || :; } >"$tmp" && mv "$tmp" "$OUT/summary.txt"
}
wanted() { [ -z "${KVQ_DEVICE_STEPS:-}" ] && return 0; case ",$KVQ_DEVICE_STEPS," in *",$1,"*) return 0 ;; esac; return 1; }

# step NAME CAP MIN FUNCTION: runs FUNCTION in the background with its output
# in W/logs/NAME.log, for at most min(CAP, time left) seconds.
step() {
    name=$1 cap=$2 min=$3 fn=$4
    wanted "$name" || return 0
    left=$((deadline - $(date +%s)))
    if [ "$left" -lt "$min" ]; then
        record "$name" skip 0 "only $left s left, needs $min"
        return 0
    fi
    lim=$cap
    [ "$left" -lt "$lim" ] && lim=$left
    if [ "$dry" = 1 ]; then
        say "$name: would run (up to $lim s): $(describe "$fn")"
        record "$name" dry 0 "$(describe "$fn")"
        return 0
    fi
    say "$name: start (up to $lim s)"
    s0=$(date +%s)
    : >"$W/note.$name"
    ("$fn" "$lim") >"$W/logs/$name.log" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null && [ $(($(date +%s) - s0)) -lt "$lim" ]; do sleep 1; done
    if kill -0 "$pid" 2>/dev/null; then
        pids=$(tree_pids "$pid")
        # shellcheck disable=SC2086
        kill -TERM $pids 2>/dev/null
        sleep 3
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null
        wait "$pid" 2>/dev/null
        record "$name" timeout $(($(date +%s) - s0)) "killed at $lim s; $(cat "$W/note.$name")"
        return 0
    fi
    wait "$pid"
    rc=$?
    st=ok
    [ $rc -eq 0 ] || st=FAIL
    [ $rc -eq 77 ] && st=skip
    why=""
    if [ $st = FAIL ]; then
        n=$(cat "$W/note.$name")
        why="exit $rc; ${n:+$n; }last line: $(grep -v '^[[:space:]]*$' "$W/logs/$name.log" | tail -n 1 | cut -c1-160)"
    fi
    record "$name" $st $(($(date +%s) - s0)) "${why:-$(cat "$W/note.$name")}"
}
note() { printf '%s' "$*" >>"$W/note.$name"; }
# the step's command lines, for the dry run
describe() {
    case $1 in
    s_cuda) echo "sh bench/run_cuda.sh $DEV $W/cuda test" ;;
    s_batch) echo "$cpu $DEV/tests/test_batch; $cpu $DEV/tests/test_batch_share" ;;
    s_sanitize) echo "KVQ_SANITIZE_TIMEOUT=60 sh bench/run_cuda.sh $DEV $W/cuda sanitize" ;;
    s_serve) echo "KVQ_BENCH_SERVE_DEVICE=cuda KVQ_BENCH_SERVE_FULL=1 KVQ_BENCH_JSON_DIR=$W/serve sh bench/bench_serve.sh $W/servebuild ($W/servebuild/bin/kvq -> $DEV/kvq)" ;;
    s_tokrefs) echo "$cpu python3 tests/tokenizer/make_refs.py --data $W/tokenizer-data --out $W/refs/tok --compare tests/tokenizer/expected" ;;
    s_chatrefs) echo "$cpu python3 tests/tokenizer/make_chat_refs.py --data $W/tokenizer-data --out $W/refs/chat" ;;
    s_modelrefs) echo "$cpu python3 tests/models/make_refs.py --out $W/models/models" ;;
    s_pyback) echo "sh python/run_device.sh $W/py $PYDEV" ;;
    esac
}

# the tests' closing lines ("test_cuda: 3 passed, 0 failed, 8 skipped"), short
counts() { grep -hE "^$1: [0-9]+ passed" "$2" 2>/dev/null | sed 's/ passed, /p /; s/ failed, /f /; s/ skipped/s/' | tr '\n' ' '; }
s_cuda() {
    sh bench/run_cuda.sh "$DEV" "$W/cuda" test
    rc=$?
    note "$(counts 'test_[a-z_]*' "$W/logs/cuda.log")"
    return $rc
}
s_batch() {
    rc=0
    # both are mostly CPU work (the CPU decoder, with the bundle's plain-loop
    # BLAS), their CUDA cases last: test_batch gets 3/5 of the time
    lim=$(($1 * 3 / 5))
    for t in test_batch test_batch_share; do
        echo "== $t"
        b0=$(date +%s)
        # shellcheck disable=SC2086
        $cpu timeout "$lim" "$DEV/tests/$t"
        r=$?
        case $r in 0) how=ok ;; 124) how="timed out at $lim s" ;; *) how="exit $r" ;; esac
        note "${sep:-}$t $how ($(grep -c '^ok' "$W/logs/batch.log") cases ok so far)"
        sep="; "
        [ $r -eq 0 ] || rc=1
        lim=$(($1 - ($(date +%s) - b0) - 5))
    done
    return $rc
}
s_sanitize() {
    KVQ_SANITIZE_TIMEOUT=60 sh bench/run_cuda.sh "$DEV" "$W/cuda" sanitize
    rc=$?
    note "$(grep -E '^(memcheck|racecheck) .*exit' "$W/logs/sanitize.log" | sed 's/ (bench helpers)/ bench/; s/ exit / /' | tr '\n' ',' | sed 's/,$//')"
    return $rc
}
s_serve() {
    command -v curl >/dev/null 2>&1 || { note "no curl on this machine"; return 77; }
    mkdir -p "$W/servebuild/bin" "$W/serve"
    ln -sf "$DEV/kvq" "$W/servebuild/bin/kvq"
    KVQ_BENCH_SERVE_DEVICE=cuda KVQ_BENCH_SERVE_FULL=1 KVQ_BENCH_JSON_DIR="$W/serve" sh bench/bench_serve.sh "$W/servebuild" &&
        [ -s "$W/serve/bench_serve.json" ]
}
s_tokrefs() {
    [ -d "$W/tokenizer-data" ] || { note "no tokenizer data in tokref.tgz"; return 77; }
    ls "$W"/tokenizer-data/*/tokenizer.json >/dev/null 2>&1 ||
        { note "tokref.tgz has the chat templates only (prepare with KVQ_TOKREF_FULL=1)"; return 77; }
    # shellcheck disable=SC2086
    $cpu python3 tests/tokenizer/make_refs.py --data "$W/tokenizer-data" --out "$W/refs/tok" --compare tests/tokenizer/expected || return 1
    note "$(grep -c 'cases agree' "$W/logs/tokrefs.log") files compared, $(grep -c 'differ:' "$W/logs/tokrefs.log") differ"
}
s_chatrefs() {
    [ -d "$W/tokenizer-data" ] || { note "no tokenizer data in tokref.tgz"; return 77; }
    # shellcheck disable=SC2086
    $cpu python3 tests/tokenizer/make_chat_refs.py --data "$W/tokenizer-data" --out "$W/refs/chat" || return 1
    # the renders against the committed ones (the generator line names versions)
    note "$(python3 - "$W/refs/chat" tests/tokenizer/expected <<'PY'
import json, os, sys
new, old = sys.argv[1], sys.argv[2]
names = sorted(f for f in os.listdir(new) if f.endswith(".json"))
def renders(path):
    try:
        return json.load(open(path, encoding="utf-8"))["renders"]
    except (OSError, ValueError, KeyError):
        return None
diff = [f for f in names if renders(os.path.join(new, f)) != renders(os.path.join(old, f))]
print("%d of %d files render as the committed ones%s" % (len(names) - len(diff), len(names),
      "; differ: " + " ".join(diff) if diff else ""))
PY
)"
}
s_modelrefs() {
    # shellcheck disable=SC2086
    $cpu python3 tests/models/make_refs.py --out "$W/models/models"
    rc=$?
    note "$(find "$W/models/models" -name reference.json 2>/dev/null | wc -l) families written"
    return $rc
}
# run_device.sh itself exits 0 when it got through: its "tests: exit N" and
# "bench: exit N" lines say how the two parts went
s_pyback() {
    sh python/run_device.sh "$W/py" "$PYDEV" || return 1
    log=$W/py/log.txt
    note "$(grep -E 'passed, .* failed' "$log" | tail -n 1); $(grep -m 1 '^tests: exit' "$log"); $(grep -m 1 -E '^(bench: exit|== bench skipped)' "$log")"
    grep -qE '^tests: exit 0' "$log" && grep -qE '^bench: exit 0' "$log"
}

# lane STEP... : steps one after the other (each: NAME CAP MIN FUNCTION)
lane_gpu1() {
    step cuda 300 60 s_cuda
    step sanitize 240 90 s_sanitize
    step serve 400 90 s_serve
}
# test_batch and test_batch_share are here: mostly CPU work (69 s for
# test_batch on 2 busy cores of the build machine), their CUDA cases short
lane_cpu1() {
    step tokrefs 200 20 s_tokrefs
    step chatrefs 120 10 s_chatrefs
    step batch 180 30 s_batch
    step modelrefs 420 60 s_modelrefs
}

# xz -dc, or Python's lzma where the machine has no xz
unxz() {
    if command -v xz >/dev/null 2>&1; then xz -dc "$1"; else
        python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$1"; fi
}

need() { # need FILE...: missing ones are listed in W/missing
    for f in "$@"; do [ -e "$f" ] || echo "$f" >>"$W/missing"; done
}

device() {
    which=$1
    OUT=${2:?usage: sh bench/device_round.sh $which OUT}
    [ -f bench/run_cuda.sh ] || die "run from the repository root"
    mkdir -p "$OUT" || die "cannot create $OUT"
    OUT=$(cd "$OUT" && pwd)
    budget=${KVQ_DEVICE_BUDGET:-500}
    deadline=$((t0 + budget))
    base=${KVQ_DEVICE_WORK:-/tmp/kvq-round}
    rm -rf "${base:?}/$which"
    W=$base/$which
    mkdir -p "$W/logs" "$W/res" "$W/refs" "$W/models" || die "cannot create $W"
    # the device's Python with torch, and compute-sanitizer, may not be on PATH
    if ! python3 -c 'import torch' >/dev/null 2>&1 && [ -x /opt/torch/.venv/bin/python3 ]; then
        PATH=/opt/torch/.venv/bin:$PATH
    fi
    [ -d /usr/local/cuda/bin ] && PATH=$PATH:/usr/local/cuda/bin
    export PATH
    : >"$W/missing"
    {
        echo "device_round $which  $(date -u '+%F %T') UTC  budget ${budget}s$( [ "$dry" = 1 ] && echo '  DRY RUN')"
        echo "bundle: $(head -n 2 "$round/MANIFEST" 2>/dev/null | tr '\n' ';')"
        echo "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -n 1 || :)"
        echo "python: $(python3 -c 'import sys, torch, transformers; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)' 2>&1 | tail -n 1)"
        for c in nvidia-smi compute-sanitizer curl taskset xz; do
            command -v $c >/dev/null 2>&1 || printf 'no %s; ' $c
        done
        python3 -c 'import importlib.util as u
m = [n for n in ("torch", "transformers", "tokenizers", "safetensors", "jinja2", "numpy") if u.find_spec(n) is None]
print("no python module %s; " % ", ".join(m) if m else "", end="")' 2>/dev/null
        echo
        echo "step       status   time  note"
    } >"$W/head"
    cat "$W/head"
    write_summary
    cpu=""
    ncpu=$(nproc 2>/dev/null || echo 1)
    # the CPU lane on the upper half of the cores; make_refs.py asks torch
    # for a thread per core anyway, so its OpenMP threads must not spin
    if command -v taskset >/dev/null 2>&1 && [ "$ncpu" -ge 8 ]; then
        cpu="env OMP_WAIT_POLICY=PASSIVE taskset -c $((ncpu / 2))-$((ncpu - 1))"
    fi
    DEV=$base/dev
    PYDEV=$base/pydev
    if [ "$which" = run1 ]; then
        need "$round/dev.tar.xz" "$round/tokref.tgz" bench/run_cuda.sh bench/bench_serve.sh tests/tokenizer/make_refs.py \
            tests/tokenizer/make_chat_refs.py tests/tokenizer/expected tests/models/make_refs.py models/kvq-tiny-llama/config.json \
            models/passkey-3500.txt
        if [ -f "$round/dev.tar.xz" ]; then
            if [ "$dry" = 1 ]; then
                list=$(unxz "$round/dev.tar.xz" | tar tf -)
                for b in $DEV_BINS lib/; do echo "$list" | grep -qx "dev/$b" || echo "$round/dev.tar.xz: dev/$b" >>"$W/missing"; done
            else
                rm -rf "$DEV" && unxz "$round/dev.tar.xz" | tar xf - -C "$base" || echo "unpacking dev.tar.xz" >>"$W/missing"
            fi
        fi
        if [ -f "$round/tokref.tgz" ]; then
            if [ "$dry" = 1 ]; then
                say "tokref.tgz: $(tar tzf "$round/tokref.tgz" | grep -c 'tokenizer_config.json$') families"
                mkdir -p "$W/tokenizer-data"
            else
                tar xzf "$round/tokref.tgz" -C "$W"
            fi
        fi
    else
        need "$round/pydev.tar.xz" python/run_device.sh python/tests/runner.py python/bench_hf.py
        if [ -f "$round/pydev.tar.xz" ]; then
            if [ "$dry" = 1 ]; then
                list=$(unxz "$round/pydev.tar.xz" | tar tf -)
                for b in pydev/kvq pydev/lib/libkvq.so.0; do echo "$list" | grep -qx "$b" || echo "$round/pydev.tar.xz: $b" >>"$W/missing"; done
            else
                rm -rf "$PYDEV" && unxz "$round/pydev.tar.xz" | tar xf - -C "$base" || echo "unpacking pydev.tar.xz" >>"$W/missing"
            fi
        fi
    fi
    if [ -s "$W/missing" ]; then
        say "missing: $(tr '\n' ' ' <"$W/missing")"
        echo "MISSING: $(tr '\n' ' ' <"$W/missing")" >>"$W/head"
        write_summary
        [ "$dry" = 1 ] && exit 1
    fi
    export LD_LIBRARY_PATH="$DEV/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
    if [ "$which" = run1 ]; then
        # the GPU lane's binaries (the CPU decoder in test_decoder_cuda, with
        # the bundle's OpenMP BLAS shim) on the other half: no spinning
        # threads fighting over the CPU lane's cores
        (OMP_NUM_THREADS=$(((ncpu + 1) / 2)) OMP_WAIT_POLICY=PASSIVE; export OMP_NUM_THREADS OMP_WAIT_POLICY; lane_gpu1) &
        g=$!
        lane_cpu1 &
        c=$!
        wait $g $c
    else
        step pyback 495 120 s_pyback
    fi
    # pack: logs (long ones cut to head + tail), then the results
    [ "$dry" = 1 ] && { say "dry run done; $OUT/summary.txt:"; cat "$OUT/summary.txt"; return 0; }
    for f in "$W"/logs/*.log "$W"/cuda/*.log "$W"/py/log.txt; do
        [ -f "$f" ] && [ "$(wc -c <"$f")" -gt 4000000 ] && { head -c 1000000 "$f"; echo; echo "... cut by device_round.sh ..."; tail -c 1000000 "$f"; } >"$f.cut" && mv "$f.cut" "$f"
    done
    cp "$OUT/summary.txt" "$W/summary.txt"
    if [ "$which" = run1 ]; then
        (cd "$W" && for d in cuda serve; do [ -d $d ] || mkdir $d; done && tar czf "$OUT/logs.tar.gz" summary.txt logs cuda serve)
        [ -n "$(ls "$W/refs")" ] && (cd "$W/refs" && tar czf "$OUT/tokrefs.tar.gz" ./*)
        [ -d "$W/models/models" ] && (cd "$W/models" && tar cf "$OUT/model_refs.tar" models)
    else
        (cd "$W" && mkdir -p py && tar czf "$OUT/py.tar.gz" summary.txt logs py)
    fi
    for f in "$OUT"/*; do
        [ "$(wc -c <"$f")" -gt 16000000 ] && echo "WARNING: $(basename "$f") is $(wc -c <"$f") bytes, over the 16 MiB a file the device tool returns" >>"$OUT/summary.txt"
    done
    say "done in $(($(date +%s) - t0)) s; OUT: $(cd "$OUT" && echo *)"
    cat "$OUT/summary.txt"
}

case ${1:-} in
prepare) prepare ;;
run1 | run2) device "$1" "${2:-}" ;;
*) die "usage: sh bench/device_round.sh prepare | run1 OUT | run2 OUT (KVQ_DEVICE_DRY=1 checks without a GPU)" ;;
esac
