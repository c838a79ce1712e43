#!/bin/sh
# bench_serve.sh BUILD - kvq serve under load on the bundled model (CPU):
# aggregate generated tokens/s and p50/p99 time to first token against the
# number of concurrent clients, for f16 and tq3j/tq3 caches (with and
# without the recent f16 window) at one fixed --kv-budget; how many
# sequences the pool admits at once; and the server's decode speed at
# concurrency 1 against `kvq run`'s.
#
# Clients are curl processes, each sending its requests one after the other
# (non-streamed); TTFT is the server's own (queueing + prefill to the first
# token, the "kvq" field of each response). Quick by default (~850-token
# prompts, 1/4/16 clients, 8MiB); KVQ_BENCH_SERVE_FULL=1 runs the issue's
# shape: 3.5K-token prompts, 1..64 clients, 64MiB (slow on a small CPU).
# Another model or the GPU: KVQ_BENCH_SERVE_MODEL=DIR, KVQ_BENCH_SERVE_DEVICE=cuda,
# KVQ_BENCH_SERVE_BUDGET=SIZE, KVQ_BENCH_SERVE_CLIENTS="1 8 64",
# KVQ_BENCH_SERVE_MAX_TOKENS=N (tokens each request decodes, EOS ignored).
# Table on stdout, JSON in $KVQ_BENCH_JSON_DIR/bench_serve.json.
# Then prefix sharing: 8 concurrent requests whose prompts share a
# ~1,500-token start (KVQ_BENCH_SERVE_SHARE_CHARS characters of the passkey
# text) and end in their own question, with --prefix-share on and off: peak
# pages used, prompt tokens not prefilled, wall time, TTFT.
# KVQ_BENCH_SERVE_ONLY=share runs only that part.
build=${1:-build}
kvq=$build/bin/kvq
model=${KVQ_BENCH_SERVE_MODEL:-models/kvq-tiny-llama}
device=${KVQ_BENCH_SERVE_DEVICE:-cpu}
out=${KVQ_BENCH_JSON_DIR:-$build/bench}/bench_serve.json
if [ -n "$KVQ_BENCH_SERVE_FULL" ]; then
    chars=100000; conc="1 2 4 8 16 32 64"; budget=64MiB; max_tokens=64; reqs=2
else
    chars=1800; conc="1 4 16"; budget=8MiB; max_tokens=32; reqs=2
fi
budget=${KVQ_BENCH_SERVE_BUDGET:-$budget}
max_tokens=${KVQ_BENCH_SERVE_MAX_TOKENS:-$max_tokens}
conc=${KVQ_BENCH_SERVE_CLIENTS:-$conc}
maxc=$(echo "$conc" | tr ' ' '\n' | tail -n 1)
command -v curl >/dev/null 2>&1 || { echo "bench_serve: no curl, skipped"; exit 0; }
[ -x "$kvq" ] || { echo "bench_serve: no $kvq"; exit 1; }
tmp=$(mktemp -d) || exit 1
pid=""
trap '[ -n "$pid" ] && kill -KILL $pid 2>/dev/null; rm -rf "$tmp"' EXIT

# without the file's closing question, so that each request decodes all of
# max_tokens (with it the model answers the pass key in ~9 tokens and the
# aggregate measures prefill alone)
prompt=$(head -c "$chars" models/passkey-3500.txt | sed 's/ *What is the pass key?.*//' | tr -d '"\\\n')
# ignore_eos: every request decodes max_tokens, whatever the cache type makes the model say
printf '{"prompt":"%s","max_tokens":%d,"temperature":0,"ignore_eos":true}' "$prompt" "$max_tokens" >"$tmp/long.json"
# the decode-speed probe: 512 tokens whatever the model says, median of 3 requests
printf '{"prompt":"Once upon a time","max_tokens":512,"temperature":0,"ignore_eos":true}' >"$tmp/short.json"

start() {
    "$kvq" serve --model "$model" --device "$device" --port 0 --quiet --max-queue 4096 "$@" 2>"$tmp/log" &
    pid=$!
    port=""
    i=0
    while [ $i -lt 100 ] && [ -z "$port" ]; do
        port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$tmp/log" 2>/dev/null)
        [ -n "$port" ] || sleep 0.1
        i=$((i + 1))
    done
    url=http://127.0.0.1:$port
    [ -n "$port" ] || { echo "bench_serve: the server did not start: $(cat "$tmp/log")"; exit 1; }
}
stop() { kill -TERM $pid; wait $pid; pid=""; }

# one request: prints "http_code ttft_ms completion_tokens seconds pages"
request() {
    curl -s -o "$tmp/r.$1" -w '%{http_code} %{time_total}' --max-time 3600 -H 'Content-Type: application/json' \
        --data-binary "@$2" "$url/v1/completions" >"$tmp/w.$1"
    set -- "$1" $(cat "$tmp/w.$1")
    ttft=$(sed -n 's/.*"time_to_first_token_ms":\([0-9.e+-]*\).*/\1/p' "$tmp/r.$1")
    n=$(sed -n 's/.*"completion_tokens":\([0-9]*\).*/\1/p' "$tmp/r.$1")
    pages=$(sed -n 's/.*"kv_pages_reserved":\([0-9]*\).*/\1/p' "$tmp/r.$1")
    echo "$2 ${ttft:-0} ${n:-0} $3 ${pages:-0}"
}

pct() { sort -n | awk -v p="$1" '{v[NR]=$1} END {if (NR == 0) {print 0; exit} i = int(p * NR + 0.999999); if (i < 1) i = 1; print v[i]}'; }

json="{\"model\": \"$model\", \"device\": \"$device\", \"prompt_chars\": $chars, \"max_tokens\": $max_tokens, \"kv_budget\": \"$budget\", \"requests_per_client\": $reqs, \"configs\": ["
printf '%-16s %5s %7s %9s %10s %10s %7s\n' cache clients admits "tok/s" "ttft p50" "ttft p99" "429/5xx"
first=1
[ "$KVQ_BENCH_SERVE_ONLY" = share ] && conc=""
for conf in "f16:-ctk f16 -ctv f16" "tq3j/tq3:-ctk tq3j -ctv tq3 --no-kv-recent-f16" "tq3j/tq3+win:-ctk tq3j -ctv tq3"; do
    name=${conf%%:*}
    args=${conf#*:}
    [ -z "$conc" ] && continue
    # shellcheck disable=SC2086
    # every client sends the same prompt: sharing would let f16 hold more
    # than its pages allow, so the capacity comparison runs without it
    start $args --kv-budget "$budget" --max-seqs "$maxc" --prefix-share off
    pages_total=$(curl -s "$url/metrics" | sed -n 's/^kvq_kv_pages_total //p')
    bpt=$(curl -s "$url/metrics" | sed -n 's/^kvq_kv_bytes_per_token{[^}]*} //p')
    # decode speed at concurrency 1 (a short prompt), against kvq run's
    request s "$tmp/short.json" >/dev/null
    serve_dec=$(for i in 1 2 3; do
        set -- $(request s "$tmp/short.json")
        echo "$3 $4 $2" | awk '{d = $2 - $3 / 1000; print ((d > 0 && $1 > 1) ? ($1 - 1) / d : 0)}'
    done | pct 0.5)
    # shellcheck disable=SC2086
    run_dec=$(for i in 1 2 3; do
        "$kvq" run --model "$model" --device "$device" -p "Once upon a time" -n 512 --no-eos $args --json 2>/dev/null |
            sed -n 's/.*"decode_tokens_per_s":\([0-9.e+-]*\).*/\1/p'
    done | pct 0.5)
    [ $first = 1 ] || json="$json,"
    first=0
    json="$json{\"cache\": \"$name\", \"args\": \"$args\", \"pages_total\": ${pages_total:-0}, \"bytes_per_token\": ${bpt:-0},"
    json="$json \"decode_tokens_per_s_serve_c1\": $serve_dec, \"decode_tokens_per_s_kvq_run\": ${run_dec:-0}, \"runs\": ["
    rfirst=1
    for c in $conc; do
        t0=$(date +%s.%N)
        k=0
        pids=""
        while [ $k -lt "$c" ]; do
            (r=0; while [ $r -lt $reqs ]; do request "$k.$r" "$tmp/long.json"; r=$((r + 1)); done) >"$tmp/client.$k" &
            pids="$pids $!"
            k=$((k + 1))
        done
        wait $pids
        t1=$(date +%s.%N)
        cat "$tmp"/client.* >"$tmp/all"
        rm -f "$tmp"/client.*
        wall=$(echo "$t0 $t1" | awk '{print $2 - $1}')
        tokens=$(awk '$1 == 200 {s += $3} END {print s + 0}' "$tmp/all")
        busy=$(awk '$1 != 200 {n++} END {print n + 0}' "$tmp/all")
        p50=$(awk '$1 == 200 {print $2}' "$tmp/all" | pct 0.5)
        p99=$(awk '$1 == 200 {print $2}' "$tmp/all" | pct 0.99)
        pages=$(awk '$1 == 200 {print $5; exit}' "$tmp/all")
        admits=$(echo "${pages_total:-0} ${pages:-1} $maxc" | awk '{a = $2 ? int($1 / $2) : 0; print (a < $3 ? a : $3)}')
        tps=$(echo "$tokens $wall" | awk '{print ($2 > 0 ? $1 / $2 : 0)}')
        printf '%-16s %5d %7d %9.1f %8.0f ms %8.0f ms %7d\n' "$name" "$c" "$admits" "$tps" "$p50" "$p99" "$busy"
        [ $rfirst = 1 ] || json="$json,"
        rfirst=0
        json="$json{\"clients\": $c, \"admitted_sequences\": $admits, \"tokens_per_s\": $tps, \"ttft_p50_ms\": $p50,"
        json="$json \"ttft_p99_ms\": $p99, \"refused\": $busy, \"wall_s\": $wall, \"tokens\": $tokens}"
    done
    json="$json]}"
    printf '%-16s decode at 1 client: serve %.1f tok/s, kvq run %.1f tok/s\n' "$name" "$serve_dec" "${run_dec:-0}"
    stop
done
json="$json], \"prefix_share\": ["
# ---- prefix sharing: 8 concurrent requests over one long prompt start ------
if [ -z "$KVQ_BENCH_SERVE_ONLY" ] || [ "$KVQ_BENCH_SERVE_ONLY" = share ]; then
    schars=${KVQ_BENCH_SERVE_SHARE_CHARS:-3300}
    sprefix=$(head -c "$schars" models/passkey-3500.txt | tr -d '"\\\n')
    k=0
    while [ $k -lt 8 ]; do
        printf '{"prompt":"%s Question %d: what is the pass key?","max_tokens":16,"temperature":0}' "$sprefix" \
            "$((k * 37 + 11))" >"$tmp/share$k.json"
        k=$((k + 1))
    done
    printf '%-8s %8s %10s %10s %12s %9s %10s\n' share prompt "peak pages" "shared" "not prefilled" "wall" "ttft p50"
    sfirst=1
    for mode in off on; do
        start --max-seqs 8 --prefix-share $mode
        t0=$(date +%s.%N)
        pids=""
        k=0
        while [ $k -lt 8 ]; do
            request "s$k" "$tmp/share$k.json" >"$tmp/sclient.$k" &
            pids="$pids $!"
            k=$((k + 1))
        done
        wait $pids
        t1=$(date +%s.%N)
        m=$(curl -s "$url/metrics")
        stop
        wall=$(echo "$t0 $t1" | awk '{print $2 - $1}')
        ntok=$(sed -n 's/.*"prompt_tokens":\([0-9]*\).*/\1/p' "$tmp/r.s0")
        peak=$(echo "$m" | sed -n 's/^kvq_kv_pages_used_peak //p')
        speak=$(echo "$m" | sed -n 's/^kvq_kv_pages_shared_peak //p')
        saved=$(echo "$m" | sed -n 's/^kvq_prefix_shared_tokens_total //p')
        prompt_all=$(echo "$m" | sed -n 's/^kvq_prompt_tokens_total //p')
        p50=$(awk '$1 == 200 {print $2}' "$tmp"/sclient.* | pct 0.5)
        ok=$(awk '$1 == 200 {n++} END {print n + 0}' "$tmp"/sclient.*)
        same=0
        [ $mode = off ] && for k in 0 1 2 3 4 5 6 7; do
            sed -n 's/.*"choices":\(.*\),"usage".*/\1/p' "$tmp/r.s$k" >"$tmp/off.$k"
        done
        [ $mode = on ] && for k in 0 1 2 3 4 5 6 7; do
            [ "$(sed -n 's/.*"choices":\(.*\),"usage".*/\1/p' "$tmp/r.s$k")" = "$(cat "$tmp/off.$k")" ] && same=$((same + 1))
        done
        printf '%-8s %8s %10s %10s %6s/%-6s %8.2f s %7.0f ms\n' "$mode" "$ntok" "$peak" "$speak" "$saved" "$prompt_all" \
            "$wall" "$p50"
        [ $mode = on ] && echo "  answers equal with sharing off: $same of 8 ($ok of 8 completed)"
        [ $sfirst = 1 ] || json="$json,"
        sfirst=0
        json="$json{\"prefix_share\": \"$mode\", \"requests\": 8, \"prompt_tokens\": ${ntok:-0}, \"completed\": $ok,"
        json="$json \"pages_used_peak\": ${peak:-0}, \"pages_shared_peak\": ${speak:-0},"
        json="$json \"prompt_tokens_shared\": ${saved:-0}, \"prompt_tokens_total\": ${prompt_all:-0},"
        json="$json \"wall_s\": $wall, \"ttft_p50_ms\": $p50, \"equal_to_unshared\": $same}"
        rm -f "$tmp"/sclient.*
    done
fi
echo "$json]}" >"$out"
echo "bench_serve: $out"
