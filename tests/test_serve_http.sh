#!/bin/sh
# test_serve_http.sh - kvq serve's HTTP front under hostile and odd clients,
# on loopback, bounded in time (every server stops by itself at the end):
#  1. slow clients: a request trickled one byte a second, headers or body,
#     is closed within --timeout, with a log line, and the server still
#     answers meanwhile;
#  2. connection limits: --max-conns-per-ip N and --max-conns N refuse the
#     N+1th connection with one log line, and take it once one closes;
#  3. the API key: any case of the Bearer scheme, a wrong key refused;
#  4. /tokenize and /detokenize equal `kvq tokenize`, every byte kept (NUL
#     included); an id outside the vocabulary is a 400 naming the field;
#  5. Retry-After on 429 (a full queue) and on 503 (draining).
name=test_serve_http.sh
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_BUILD:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
kvq=$build/bin/kvq
model=$root/models/kvq-tiny-llama
conns=$root/tests/serve_conns.cjs
. "$root/tests/serve_lib.sh" # ok, bad, skip, check, finish, start_server
tmp=$(mktemp -d) || exit 1
pid=""; helpers=""
cleanup() {
    [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
    for p in $helpers; do kill -KILL "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT

if ! command -v curl >/dev/null 2>&1 || [ ! -x "$kvq" ]; then
    skip "kvq serve: no curl or no $kvq"
    finish
fi
have_node=0
command -v node >/dev/null 2>&1 && have_node=1

stop_server() {
    kill -TERM "$pid" 2>/dev/null
    wait "$pid"
    stop_rc=$?
    pid=""
}
# status METHOD PATH [BODY] [curl args]: the HTTP status; body in $tmp/body, headers in $tmp/head.
status() {
    m=$1; p=$2; shift 2
    b=""
    if [ $# -gt 0 ]; then b=$1; shift; fi
    if [ -n "$b" ]; then
        curl -s -o "$tmp/body" -D "$tmp/head" -w '%{http_code}' -X "$m" --max-time 30 \
            -H 'Content-Type: application/json' --data-binary "$b" "$@" "$url$p"
    else
        curl -s -o "$tmp/body" -D "$tmp/head" -w '%{http_code}' -X "$m" --max-time 30 "$@" "$url$p"
    fi
}
metric() { curl -s --max-time 10 "$url/metrics" | sed -n "s/^$1 //p"; }
# wait_metric NAME VALUE: polls /metrics up to 10 s.
wait_metric() {
    i=0
    while [ $i -lt 100 ]; do
        [ "$(metric "$1")" = "$2" ] && return 0
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}
# wait_line FILE PATTERN: polls FILE up to 10 s.
wait_line() {
    i=0
    while [ $i -lt 100 ]; do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}
# json_get FILE EXPR: a value of the JSON in FILE (node; EXPR over j).
json_get() { node -e "const j = JSON.parse(require('fs').readFileSync('$1', 'utf8')); process.stdout.write(String($2));" 2>/dev/null; }

# ---- 1. slow clients ------------------------------------------------------------
if [ $have_node = 0 ]; then
    skip "slow clients: node is not installed"
elif start_server "$tmp/log1" --timeout 2; then
    for what in headers body; do
        node "$conns" trickle "$port" $what 12 >"$tmp/trickle.$what" 2>&1 &
        helpers="$helpers $!"
    done
    node "$conns" hold "$port" 1 12 >"$tmp/idle" 2>&1 &
    helpers="$helpers $!"
    sleep 1
    check "a request answered while two are trickled in" "$(status GET /health)" 200
    for what in headers body; do
        wait_line "$tmp/trickle.$what" 'closed\|still'
        s=$(sed -n 's/^closed after \([0-9]*\).*/\1/p' "$tmp/trickle.$what")
        # the deadline is 2 s + 1.5 s of grace and the check runs every 0.1 s: closed well before 5
        [ -n "$s" ] && [ "$s" -lt 5 ] && ok "trickled $what closed at its deadline ($(cat "$tmp/trickle.$what"))" ||
            bad "trickled $what: $(cat "$tmp/trickle.$what")"
    done
    wait_line "$tmp/log1" 'sent no whole request within --timeout 2 s' &&
        ok "slow clients: one log line: $(grep -m1 'no whole request' "$tmp/log1")" ||
        bad "slow clients: no log line: $(cat "$tmp/log1")"
    wait_line "$tmp/idle" closed
    s=$(sed -n 's/^closed after \([0-9]*\).*/\1/p' "$tmp/idle")
    [ -n "$s" ] && [ "$s" -lt 5 ] && ok "an idle connection closed after --timeout 2 ($(grep closed "$tmp/idle"))" ||
        bad "idle connection: $(cat "$tmp/idle")"
    check "the server answers after the slow clients" "$(status GET /health)" 200
    # the deadline is for receiving: an answer may take longer (here ~3x --timeout on a laptop)
    check "a generation longer than --timeout is not cut" "$(curl -s -o "$tmp/gen" -w '%{http_code}' --max-time 120 \
        -d '{"prompt":"x","max_tokens":3000,"ignore_eos":true}' "$url/v1/completions"):$(grep -c '"completion_tokens":3000' "$tmp/gen")" \
        200:1
    stop_server
    # the two slow clients are logged (the first at once, the second when
    # the server stops); the idle one is closed by the idle timeout, unlogged
    check "slow clients logged: 2 in all" \
        "$(sed -n 's/.*closed \([0-9]*\) connections* that sent no whole request.*/\1/p' "$tmp/log1" | awk '{ n += $1 } END { print n + 0 }')" 2
else
    bad "kvq serve did not start: $(cat "$tmp/log1")"
fi

# ---- 2. connection limits ---------------------------------------------------------
# hold N connections idle from 127.0.0.1, then one more must be refused
limit_case() { # FLAG N LOGPATTERN
    flag=$1; n=$2; pattern=$3
    if [ $have_node = 0 ]; then
        skip "$flag: node is not installed"
        return
    fi
    extra=""
    [ "$flag" = --max-conns ] && extra="--max-conns-per-ip 0"
    log=$tmp/log2$flag
    if ! start_server "$log" "$flag" "$n" $extra; then
        bad "kvq serve $flag $n did not start: $(cat "$log")"
        return
    fi
    node "$conns" hold "$port" "$n" 20 >"$tmp/hold" 2>&1 &
    hp=$!
    helpers="$helpers $hp"
    if wait_line "$tmp/hold" ready; then
        sleep 0.3 # the server has accepted them (they came first)
        check "$flag $n: the connection past the limit is refused" \
            "$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 "$url/health")" 000
        wait_line "$log" "$pattern" && ok "$flag $n: one log line: $(grep -m1 refused "$log")" ||
            bad "$flag $n: no log line: $(cat "$log")"
    else
        bad "$flag $n: the idle connections did not connect: $(cat "$tmp/hold")"
    fi
    kill "$hp" 2>/dev/null
    wait "$hp" 2>/dev/null
    i=0; code=000
    while [ $i -lt 50 ] && [ "$code" != 200 ]; do # their close reaches the server within a poll
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 "$url/health")
        [ "$code" = 200 ] || sleep 0.1
        i=$((i + 1))
    done
    check "$flag $n: a connection is taken again once they closed" "$code" 200
    stop_server
}
limit_case --max-conns-per-ip 3 'refused 1 connection: the client 127.0.0.1 already holds 3 (--max-conns-per-ip 3)'
limit_case --max-conns 3 'refused 1 connection: 3 connections are open (--max-conns 3)'
check "--max-conns 0: exit 2" \
    "$(timeout 30 "$kvq" serve --model "$model" --port 0 --max-conns 0 2>/dev/null; echo $?)" 2
# more connections than the open-file limit can ever allow: refused at the start, naming both
(ulimit -n 100 && timeout 30 "$kvq" serve --model "$model" --port 0 --max-conns 200) 2>"$tmp/nofile"
rc=$?
check "--max-conns over ulimit -n: exit 2 with the reason" \
    "$rc:$(grep -c 'max-conns 200 needs 216 open files; this process may have 100' "$tmp/nofile")" 2:1

# ---- 3-5. the API key, /tokenize and /detokenize, Retry-After ---------------------------
if start_server "$tmp/log3" --api-key sekrit --max-seqs 1 --max-queue 1; then
    tz=/tokenize; dz=/detokenize
    check "no key: 401" "$(status POST $tz '{"content":"x"}')" 401
    check "a wrong key: 401" "$(status POST $tz '{"content":"x"}' -H 'Authorization: Bearer sekrit2')" 401
    check "a key that is a prefix: 401" "$(status POST $tz '{"content":"x"}' -H 'Authorization: Bearer sekri')" 401
    check "the key without a scheme: 401" "$(status POST $tz '{"content":"x"}' -H 'Authorization: sekrit')" 401
    check "'Authorization: bearer KEY': 200" "$(status POST $tz '{"content":"x"}' -H 'Authorization: bearer sekrit')" 200
    check "'Authorization: BEARER KEY' on completions: 200" "$(status POST /v1/completions \
        '{"prompt":"x","max_tokens":2}' -H 'Authorization: BEARER sekrit')" 200
    A='Authorization: Bearer sekrit'
    printf 'nul \000 inside' >"$tmp/nul.txt"
    want=$("$kvq" tokenize --model "$model" --file "$tmp/nul.txt" | tr ' ' ,)
    want_nobos=$("$kvq" tokenize --model "$model" --file "$tmp/nul.txt" --no-bos | tr ' ' ,)
    check "/tokenize with add_special: the ids of kvq tokenize --file (NUL kept)" \
        "$(status POST $tz '{"content":"nul \u0000 inside","add_special":true}' -H "$A"):$(cat "$tmp/body")" \
        "200:{\"tokens\":[$want]}"
    check "/tokenize (add_special off, llama-server's default): the ids of --no-bos" \
        "$(status POST $tz '{"content":"nul \u0000 inside"}' -H "$A"):$(cat "$tmp/body")" "200:{\"tokens\":[$want_nobos]}"
    status POST $tz '{"content":"nul \u0000 inside","add_special":true}' -H "$A" >/dev/null
    check "/tokenize gives 8 tokens for 'nul \\u0000 inside'" "$(grep -o '[0-9][0-9]*' "$tmp/body" | wc -l | tr -d ' ')" 8
    if [ $have_node = 1 ]; then
        status POST $tz '{"content":"nul \u0000 inside","with_pieces":true}' -H "$A" >/dev/null
        check "/tokenize with_pieces: ids and pieces" \
            "$(json_get "$tmp/body" "j.tokens.map((t) => t.id).join(',') + ' ' + JSON.stringify(j.tokens.map((t) => t.piece).join(''))")" \
            "$want_nobos \" nul \\u0000 inside\""
        "$kvq" tokenize --model "$model" --decode "$want" >"$tmp/decoded"
        status POST $dz "{\"tokens\":[$want]}" -H "$A" >/dev/null
        json_get "$tmp/body" "j.content + '\\n'" >"$tmp/detok"
        cmp -s "$tmp/decoded" "$tmp/detok" && ok "/detokenize equals kvq tokenize --decode, byte for byte" ||
            bad "/detokenize: $(od -c "$tmp/detok" | head -3) vs $(od -c "$tmp/decoded" | head -3)"
    else
        skip "/tokenize pieces and /detokenize bytes: node is not installed"
    fi
    check "/detokenize of /tokenize's ids gives the text back, NUL included" \
        "$(status POST $dz "{\"tokens\":[$want_nobos]}" -H "$A"):$(cat "$tmp/body")" '200:{"content":"nul \u0000 inside"}'
    check "/detokenize of an id outside the vocabulary: 400" "$(status POST $dz '{"tokens":[1,99999]}' -H "$A")" 400
    grep -q '"param":"tokens"' "$tmp/body" && grep -q "'tokens'\[1\] = 99999" "$tmp/body" &&
        ok "the 400 names the field and the id" || bad "OOV body: $(cat "$tmp/body")"
    check "/detokenize of a negative id: 400" "$(status POST $dz '{"tokens":[-1]}' -H "$A")" 400
    check "/detokenize of a non-integer id: 400" "$(status POST $dz '{"tokens":[1.5]}' -H "$A")" 400
    check "/detokenize of nothing: 200 and empty" "$(status POST $dz '{"tokens":[]}' -H "$A"):$(cat "$tmp/body")" \
        '200:{"content":""}'
    check "/tokenize without content: 400" "$(status POST $tz '{"add_special":true}' -H "$A")" 400
    grep -q '"param":"content"' "$tmp/body" && ok "the 400 names content" || bad "body: $(cat "$tmp/body")"
    check "/tokenize with add_special not a boolean: 400" "$(status POST $tz '{"content":"x","add_special":1}' -H "$A")" 400
    check "/tokenize with parse_special false (it would change the answer): 400" \
        "$(status POST $tz '{"content":"x","parse_special":false}' -H "$A")" 400
    check "/tokenize with a lone surrogate: 400" "$(status POST $tz '{"content":"\ud800"}' -H "$A")" 400
    check "/tokenize with malformed JSON: 400" "$(status POST $tz '{"content":' -H "$A")" 400
    check "GET /tokenize: 405" "$(status GET $tz "" -H "$A")" 405
    grep -qi '^Allow: POST' "$tmp/head" && ok "405 says Allow: POST" || bad "405 headers: $(cat "$tmp/head")"

    # 429: one sequence runs, one waits (--max-seqs 1 --max-queue 1), a third is refused
    long='{"prompt":"x","max_tokens":4000,"ignore_eos":true}'
    curl -s -o "$tmp/long1" --max-time 120 -H "$A" -d "$long" "$url/v1/completions" &
    c1=$!
    wait_metric kvq_running_sequences 1
    curl -s -o "$tmp/long2" --max-time 120 -H "$A" -d '{"prompt":"y","max_tokens":2}' "$url/v1/completions" &
    c2=$!
    helpers="$helpers $c1 $c2"
    if wait_metric kvq_waiting_requests 1; then
        check "a full queue: 429" "$(status POST /v1/completions '{"prompt":"z","max_tokens":2}' -H "$A")" 429
        grep -qi '^Retry-After: [0-9][0-9]*' "$tmp/head" && ok "429 carries $(grep -i '^Retry-After' "$tmp/head" | tr -d '\r')" ||
            bad "429 without Retry-After: $(cat "$tmp/head")"
        # SIGTERM while they run: the drain answers new requests 503
        kill -TERM "$pid"
        i=0; code=""
        while [ $i -lt 50 ] && [ "$code" != 503 ]; do
            code=$(status POST /v1/completions '{"prompt":"z","max_tokens":2}' -H "$A")
            [ "$code" = 503 ] || sleep 0.1
            i=$((i + 1))
        done
        check "draining: 503" "$code" 503
        grep -qi '^Retry-After: [0-9][0-9]*' "$tmp/head" && ok "503 carries $(grep -i '^Retry-After' "$tmp/head" | tr -d '\r')" ||
            bad "503 without Retry-After: $(cat "$tmp/head")"
    else
        bad "429: the second request never waited (the first one finished too soon?)"
        kill -TERM "$pid"
    fi
    wait $c1 $c2
    grep -q '"completion_tokens":4000' "$tmp/long1" && grep -q '"object":"text_completion"' "$tmp/long2" &&
        ok "the running and the waiting request were answered" || bad "answers: $(head -c 200 "$tmp/long1") / $(head -c 200 "$tmp/long2")"
    # one SIGTERM only: a second one while it exits would kill it
    wait "$pid"
    stop_rc=$?
    pid=""
    check "the server exits 0 after the drain" "$stop_rc" 0
else
    bad "kvq serve did not start: $(cat "$tmp/log3")"
fi
finish
