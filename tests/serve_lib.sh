# serve_lib.sh - what the kvq serve tests share (sourced; POSIX sh).
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
