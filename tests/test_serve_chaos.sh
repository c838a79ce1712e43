#!/bin/sh
# test_serve_chaos.sh - `kvq serve` under clients that give up (issue 36), on
# loopback, bounded in count and time, the server killed by the trap if a
# check leaves it running. Two slots, so most rounds also queue:
#  1. the issue's reproduction: clients that give up while queued behind two
#     long answers, which are themselves cut while decoding;
#  2. random disconnects while prefilling long prompts (--chunk 64: many
#     steps each, some sharing a prompt start that another is still prefilling,
#     some taking over a prefix that --prefix-cache kept from one that completed);
#  3. random disconnects while decoding;
#  4. random disconnects while streaming;
#  after each round every request is accounted for (completed or cancelled,
#  none failed), a fresh request gets exactly the solo run's answer, and
#  /metrics shows nothing waiting or running and every page of the pool free;
#  5. SIGTERM with a stream in flight inside --drain-timeout: it finishes,
#     exit 0; with requests in flight past --drain-timeout 2: the server exits
#     within the deadline (and a margin) with the status `kvq help serve`
#     states (1), and the cut clients get a 503 instead of a hang.
# The disconnect times come from awk's generator with a fixed seed
# (KVQ_CHAOS_SEED, printed), so a failing run can be repeated.
name=test_serve_chaos.sh
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_BUILD:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
kvq=$build/bin/kvq
model=$root/models/kvq-tiny-llama
seed=${KVQ_CHAOS_SEED:-36}
. "$root/tests/serve_lib.sh" # ok, bad, skip, check, finish, start_server
tmp=$(mktemp -d) || exit 1
pid=""
clients=""
cleanup() {
    for c in $clients; do kill -KILL "$c" 2>/dev/null; done
    [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

if ! command -v curl >/dev/null 2>&1 || [ ! -x "$kvq" ]; then
    skip "kvq serve chaos: no curl or no $kvq"
    finish
fi

# stop_within S: SIGTERM, then waits at most S s for the exit (a server that
# hangs in its drain is killed and reported); sets stop_rc and stop_s.
stop_within() {
    t0=$(date +%s)
    kill -TERM "$pid" 2>/dev/null
    i=0
    while kill -0 "$pid" 2>/dev/null && [ $i -lt $(($1 * 10)) ]; do sleep 0.1; i=$((i + 1)); done
    if kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        stop_rc=hung
    else
        wait "$pid"
        stop_rc=$?
    fi
    stop_s=$(($(date +%s) - t0))
    pid=""
}


metrics() { curl -s --max-time 10 "$url/metrics" >"$tmp/metrics"; }
m() { sed -n "s/^$1 //p" "$tmp/metrics"; }
finished() { m "kvq_sequences_finished_total{how=\"$1\"}"; }

# idle: nothing waiting or running, every page free but those the prefix
# cache keeps (the pool's idle count), nothing reserved beyond them; polls
# for up to 10 s (a disconnect is seen within 50 ms, its pages go within a step).
idle() {
    i=0
    while [ $i -lt 100 ]; do
        metrics
        # idle: nothing reserved beyond the pages held, every held page a
        # cached prefix's (two cached prefixes may share pages: each counts
        # them, the pool once), and no page held by none (a leak would make
        # used + shared exceed the references)
        if [ "$(m kvq_waiting_requests)" = 0 ] && [ "$(m kvq_running_sequences)" = 0 ] &&
            [ -n "$(m kvq_kv_pages_total)" ] && [ "$(m kvq_kv_pages_reserved)" = "$(m kvq_kv_pages_used)" ] &&
            [ "$(m kvq_kv_pages_referenced)" = "$(m kvq_prefix_cache_pages)" ] &&
            [ $(($(m kvq_kv_pages_used) + $(m kvq_kv_pages_shared))) -le "$(m kvq_kv_pages_referenced)" ]; then
            return 0
        fi
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

# The fresh request every round ends with, and its solo answer.
fresh_body='{"prompt":"Once upon a time","max_tokens":8,"temperature":0}'
fresh() {
    curl -s --max-time 20 -H 'Content-Type: application/json' -d "$fresh_body" "$url/v1/completions" |
        sed -n 's/.*"choices":\(.*\),"usage".*/\1/p'
}

# timeouts N LO HI K: N client timeouts in [LO, HI) seconds from stream K of the seed.
timeouts() {
    awk -v s="$seed" -v k="$4" -v n="$1" -v lo="$2" -v hi="$3" \
        'BEGIN { srand(s * 100 + k); for (i = 0; i < n; i++) printf "%.2f\n", lo + (hi - lo) * rand() }'
}

# client TAG TIMEOUT BODYFILE [curl args]: one request in the background that
# gives up after TIMEOUT s; its curl status lands in $tmp/rc.TAG.
client() {
    tag=$1; t=$2; f=$3; shift 3
    (
        curl -s -o /dev/null --max-time "$t" -H 'Content-Type: application/json' --data-binary "@$f" "$@" \
            "$url/v1/completions"
        echo $? >"$tmp/rc.$tag"
    ) &
    clients="$clients $!"
}

# round NAME N: waits for the clients, then checks what every round must leave.
before() { metrics; c0=$(finished completed); x0=$(finished cancelled); f0=$(finished failed); }
round() {
    wait $clients
    clients=""
    gaveup=$(cat "$tmp"/rc.* 2>/dev/null | grep -c '^28$')
    rm -f "$tmp"/rc.*
    if idle; then ok "$1: nothing waiting or running, the pool at its idle count ($(m kvq_prefix_cache_pages) cached)"
    else bad "$1: the engine is not idle: $(grep -E '^kvq_(kv_pages|running|waiting|prefix_cache_pages)' "$tmp/metrics" | tr '\n' ' ')"; fi
    c=$(finished completed); x=$(finished cancelled); f=$(finished failed)
    check "$1: $2 requests, $gaveup gave up: each completed or cancelled, none failed" \
        "$((c - c0 + x - x0)):$((f - f0))" "$2:0"
    [ "$((x - x0))" -ge 1 ] && ok "$1: $((x - x0)) cancelled" || bad "$1: no request was cancelled"
    check "$1: a fresh request gets the solo answer" "$(fresh)" "$solo"
}

echo "  chaos seed $seed (KVQ_CHAOS_SEED)"
t_start=$(date +%s)
if ! start_server "$tmp/log" --max-seqs 2 --chunk 64 --prefix-cache 2 --drain-timeout 10; then
    bad "kvq serve did not start: $(cat "$tmp/log")"
    finish
fi
solo=$(fresh)
[ -n "$solo" ] && ok "solo answer" || bad "no solo answer"
long=$(tr -d '"\\\n' <"$root/models/passkey-3500.txt")

# ---- 1. give up while queued (the issue's reproduction, widened) -----------
printf '{"prompt":"x","max_tokens":1500,"ignore_eos":true,"temperature":0}' >"$tmp/hold.json"
printf '{"prompt":"y","max_tokens":5}' >"$tmp/y.json"
before
client h1 2 "$tmp/hold.json"
client h2 2 "$tmp/hold.json"
sleep 0.3
k=0
for t in $(timeouts 6 0.1 1.0 1); do
    client "q$k" "$t" "$tmp/y.json"
    k=$((k + 1))
done
round "queued" 8

# ---- 2. give up while prefilling ---------------------------------------------
before
k=0
for t in $(timeouts 6 0.1 2.5 2); do
    off=$(((k % 3) * 400 + 1)) # three prompts, two clients each: one may wait to share the other's start
    printf '{"prompt":"%s","max_tokens":4,"temperature":0}' "$(printf '%s' "$long" | cut -c "$off-$((off + 2400))")" \
        >"$tmp/p$k.json"
    client "p$k" "$t" "$tmp/p$k.json"
    k=$((k + 1))
done
round "prefilling" 6

# ---- 3. give up while decoding -------------------------------------------------
printf '{"prompt":"Once upon a time","max_tokens":1000,"ignore_eos":true,"temperature":0.8,"seed":3}' >"$tmp/d.json"
before
k=0
for t in $(timeouts 6 0.2 1.2 3); do
    client "d$k" "$t" "$tmp/d.json"
    k=$((k + 1))
done
round "decoding" 6

# ---- 4. give up while streaming ------------------------------------------------
printf '{"prompt":"Once upon a time","max_tokens":1000,"ignore_eos":true,"stream":true}' >"$tmp/s.json"
before
k=0
for t in $(timeouts 8 0.2 1.2 4); do
    client "s$k" "$t" "$tmp/s.json" -N
    k=$((k + 1))
done
round "streaming" 8

# ---- 5. SIGTERM with requests in flight --------------------------------------
# within the deadline: the running stream finishes, exit 0
curl -s -N --max-time 30 -H 'Content-Type: application/json' \
    -d '{"prompt":"Once upon a time","max_tokens":40,"ignore_eos":true,"stream":true}' \
    "$url/v1/completions" >"$tmp/drain0.out" 2>/dev/null &
cpid=$!
clients=$cpid
i=0
while [ $i -lt 100 ] && ! grep -q '^data: {' "$tmp/drain0.out" 2>/dev/null; do sleep 0.05; i=$((i + 1)); done
stop_within 15
wait $cpid
clients=""
check "SIGTERM inside --drain-timeout 10: exit 0" "$stop_rc" 0
grep -q '"finish_reason":"length"' "$tmp/drain0.out" && tail -n 2 "$tmp/drain0.out" | grep -q '^data: \[DONE\]' &&
    ok "the running stream finished before the exit" || bad "drained stream: $(tail -c 300 "$tmp/drain0.out")"

# past the deadline: two long streams and two queued requests (3000 tokens
# each, on one thread: about 10 s apiece here) meet --drain-timeout 2. What
# the drain cuts depends on the machine's speed, so the checks count: every
# stream ends either finished ("length", [DONE]) or cut (the 503 error event,
# [DONE]); a queued request gets 200 or 503 (or nothing, when its response was
# queued as the listener closed); the log's count of cut requests is exactly
# the number not finished; the exit status is 1 when that count is not 0
# (kvq help serve), and the server exits within the deadline and a margin.
if start_server "$tmp/log5" --max-seqs 2 --drain-timeout 2 --threads 1; then
    for k in 1 2; do
        curl -s -N --max-time 30 -H 'Content-Type: application/json' \
            -d '{"prompt":"Once upon a time","max_tokens":3000,"ignore_eos":true,"stream":true}' \
            "$url/v1/completions" >"$tmp/cut$k.out" 2>/dev/null &
        clients="$clients $!"
    done
    for k in 3 4; do
        curl -s -o "$tmp/cut$k.out" -w '%{http_code}' --max-time 30 -H 'Content-Type: application/json' \
            -d '{"prompt":"Once upon a time","max_tokens":3000,"ignore_eos":true}' "$url/v1/completions" \
            >"$tmp/cut$k.code" 2>/dev/null &
        clients="$clients $!"
    done
    i=0
    while [ $i -lt 100 ] && ! { grep -q '^data: {' "$tmp/cut1.out" 2>/dev/null && grep -q '^data: {' "$tmp/cut2.out" 2>/dev/null; }; do
        sleep 0.05; i=$((i + 1))
    done
    metrics
    check "two streams running, two requests queued" "$(m kvq_running_sequences):$(m kvq_waiting_requests)" "2:2"
    stop_within 8
    t_clients=$(date +%s)
    wait $clients
    clients=""
    [ "$stop_s" -le 4 ] && ok "it exited in $stop_s s (deadline 2 s)" || bad "it took $stop_s s to exit"
    [ $(($(date +%s) - t_clients)) -le 2 ] && ok "every client had its answer by then" || bad "clients hung after the exit"
    cut=0 done_=0 odd=""
    for k in 1 2; do
        if grep -q '"message":"the server shut down before the request finished' "$tmp/cut$k.out" &&
            tail -n 2 "$tmp/cut$k.out" | grep -q '^data: \[DONE\]'; then
            cut=$((cut + 1))
        elif grep -q '"finish_reason":"length"' "$tmp/cut$k.out" && tail -n 2 "$tmp/cut$k.out" | grep -q '^data: \[DONE\]'; then
            done_=$((done_ + 1))
        else
            odd="$odd stream $k: $(tail -c 200 "$tmp/cut$k.out")"
        fi
    done
    lost=0
    for k in 3 4; do
        case $(cat "$tmp/cut$k.code") in
        200) done_=$((done_ + 1)) ;;
        503) cut=$((cut + 1)) ;;
        *) lost=$((lost + 1)) ;;
        esac
    done
    check "every stream ended finished or with the 503 error event and [DONE]" "$odd" ""
    echo "  cut: $cut (+ $lost queued whose 503 was lost as the listener closed), finished: $done_"
    [ $((cut + lost)) -ge 1 ] && ok "the drain cut $((cut + lost)) of 4 requests" || bad "nothing was cut: the requests finished within 2 s"
    grep -q "drain-timeout 2 s passed: $((cut + lost)) request" "$tmp/log5" &&
        ok "the log says $((cut + lost)) requests were cut" || bad "log: $(cat "$tmp/log5")"
    check "past --drain-timeout 2 with requests cut: exit 1" "$stop_rc" 1
else
    bad "kvq serve did not start: $(cat "$tmp/log5")"
fi
echo "  chaos rounds: $(($(date +%s) - t_start)) s"
finish
