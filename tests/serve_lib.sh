# serve_lib.sh - what the kvq serve tests share (sourced; POSIX sh): the
# tallies and their last line ($name: N passed, N failed, N skipped), and
# start_server.
passed=0; failed=0; skipped=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
bad() { echo "FAIL $1"; failed=$((failed + 1)); }
skip() { echo "skip $1"; skipped=$((skipped + 1)); }
# check NAME GOT WANT
check() { if [ "$2" = "$3" ]; then ok "$1"; else bad "$1: got '$2', want '$3'"; fi; }
finish() {
    echo "$name: $passed passed, $failed failed, $skipped skipped"
    exit 0
}
# start_server LOG ARGS...: kvq serve ($kvq, --model $model) on a free
# loopback port, its stderr in LOG; sets pid, port, url; fails when no
# port appeared within 10 s.
start_server() {
    log=$1; shift
    rm -f "$log" # not the port of an earlier server
    "$kvq" serve --model "$model" --port 0 "$@" 2>"$log" &
    pid=$!
    port=""
    i=0
    while [ $i -lt 100 ] && [ -z "$port" ]; do
        port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" 2>/dev/null)
        [ -n "$port" ] || sleep 0.1
        i=$((i + 1))
    done
    url=http://127.0.0.1:$port
    [ -n "$port" ]
}
