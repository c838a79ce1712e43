#!/bin/sh
# test_serve.sh - `kvq serve` end to end on loopback, bounded in time:
#  1. the official openai npm client (pinned, installed once under
#     $KVQ_BUILD/npm; skipped in one line when npm is offline) drives
#     completions, chat, streaming, logprobs, seeds and errors; greedy text
#     equals the HF reference of the bundled model (f32 cache);
#  2. raw HTTP with curl: every kind of bad input gets its status in OpenAI's
#     error shape, a request that never completes is dropped, a client that
#     disconnects mid-stream frees its pages, and after each /health answers
#     and every page is back; SIGTERM drains the running stream to
#     data: [DONE] and exits 0;
#  3. load: 32 clients x 8 requests under a small --kv-budget: each request
#     completes with exactly its solo tokens or gets an honest 429/503;
#  4. prefix reuse (--prefix-cache) leaves a second turn's answer unchanged.
#  5. prefix sharing: concurrent requests with one long prompt give the solo
#     answer and hold its pages once;
#  6. sliding windows and Gemma 3: kvq serve answers what kvq run answers;
#  7. speculative decoding (--speculative) answers what plain decoding does.
name=test_serve.sh
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_BUILD:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
kvq=$build/bin/kvq
model=$root/models/kvq-tiny-llama
OPENAI_VERSION=4.104.0
. "$root/tests/serve_lib.sh" # ok, bad, skip, check, finish, start_server
tmp=$(mktemp -d) || exit 1
pid=""
cleanup() {
    [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

if ! command -v curl >/dev/null 2>&1 || [ ! -x "$kvq" ]; then
    skip "kvq serve: no curl or no $kvq"
    finish
fi


# stop_server: SIGTERM, waits; sets stop_rc.
stop_server() {
    kill -TERM "$pid" 2>/dev/null
    wait "$pid"
    stop_rc=$?
    pid=""
}

# status METHOD PATH [BODY] [extra curl args]: prints the HTTP status, body in $tmp/body.
status() {
    m=$1; p=$2; shift 2
    if [ $# -gt 0 ]; then
        b=$1; shift
        curl -s -o "$tmp/body" -w '%{http_code}' -X "$m" --max-time 60 -H 'Content-Type: application/json' \
            --data-binary "$b" "$@" "$url$p"
    else
        curl -s -o "$tmp/body" -w '%{http_code}' -X "$m" --max-time 60 "$@" "$url$p"
    fi
}

# The error body's code and param.
code_of() { sed -n 's/.*"code":"\([^"]*\)".*/\1/p' "$tmp/body"; }
param_of() { sed -n 's/.*"param":"\([^"]*\)".*/\1/p' "$tmp/body"; }
# tokens FILE [--no-bos]: how many ids kvq tokenize gives for FILE's bytes.
tokens() { f=$1; shift; "$kvq" tokenize --model "$model" --file "$f" "$@" | wc -w | tr -d ' '; }

metric() { curl -s --max-time 10 "$url/metrics" | sed -n "s/^$1 //p"; }

# All pages back and nothing running: polls for up to 5 s (a cancelled
# sequence leaves within one step).
pool_clean() {
    i=0
    while [ $i -lt 50 ]; do
        if [ "$(metric kvq_kv_pages_used)" = 0 ] && [ "$(metric kvq_kv_pages_reserved)" = 0 ] &&
            [ "$(metric kvq_running_sequences)" = 0 ] && [ "$(metric kvq_waiting_requests)" = 0 ]; then
            return 0
        fi
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}
after() {
    if [ "$(status GET /health)" = 200 ] && pool_clean; then ok "$1: /health 200, every page back"
    else bad "$1: /health or the pool is not clean: $(curl -s "$url/metrics" | grep -E '^kvq_(kv_pages|running|waiting)')"; fi
}

# ---- 1. the openai npm client ---------------------------------------------
# ChatML: the bundled model has no template of its own.
cat >"$tmp/chatml.jinja" <<'EOF'
{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
EOF
if start_server "$tmp/log1" --api-key sekrit --cache-type-k f32 --cache-type-v f32 --max-seqs 4 \
    --chat-template "$tmp/chatml.jinja"; then
    npm_dir=$build/npm
    if ! command -v node >/dev/null 2>&1; then
        skip "openai client: node is not installed"
    elif [ ! -d "$npm_dir/node_modules/openai" ] && ! { command -v npm >/dev/null 2>&1 &&
        timeout 180 npm install --prefix "$npm_dir" --no-audit --no-fund --no-save --loglevel=error \
            "openai@$OPENAI_VERSION" >"$tmp/npm.log" 2>&1; }; then
        skip "openai client: npm could not install openai@$OPENAI_VERSION (offline?)"
    else
        node "$root/tests/serve_client.cjs" "$npm_dir" "$url" sekrit kvq-tiny-llama \
            "$model/reference/reference.json" 1 >"$tmp/node.out" 2>&1
        cat "$tmp/node.out"
        passed=$((passed + $(grep -c '^ok ' "$tmp/node.out")))
        failed=$((failed + $(grep -c '^FAIL ' "$tmp/node.out")))
        grep -q '^ok \|^FAIL ' "$tmp/node.out" || bad "openai client: no result (see above)"
    fi
    check "401 without a key" "$(status POST /v1/completions '{"prompt":"x"}')" 401
    grep -q '"code":"invalid_api_key"' "$tmp/body" && ok "401 body in OpenAI's shape" || bad "401 body: $(cat "$tmp/body")"
    check "/health needs no key" "$(status GET /health)" 200
    check "chat with a template: 200" "$(status POST /v1/chat/completions \
        '{"messages":[{"role":"user","content":"hi"}],"max_tokens":3}' -H 'Authorization: Bearer sekrit')" 200
    grep -q '"object":"chat.completion"' "$tmp/body" && ok "chat body" || bad "chat body: $(cat "$tmp/body")"
    check "chat template error (a message without content): 400" "$(status POST /v1/chat/completions \
        '{"messages":[{"role":"assistant","content":null}],"max_tokens":3}' -H 'Authorization: Bearer sekrit')" 400
    check "a template error's code" "$(code_of)" chat_template_error
    # content as text parts: joined with "\n" (vLLM) before the template renders
    check "chat content as text parts: 200" "$(status POST /v1/chat/completions \
        '{"messages":[{"role":"user","content":[{"type":"text","text":"Hi"},{"type":"text","text":"there"}]}],"max_tokens":4,"temperature":0}' \
        -H 'Authorization: Bearer sekrit')" 200
    parts=$(sed -n 's/.*"choices":\(.*\),"kvq".*/\1/p' "$tmp/body")
    status POST /v1/chat/completions '{"messages":[{"role":"user","content":"Hi\nthere"}],"max_tokens":4,"temperature":0}' \
        -H 'Authorization: Bearer sekrit' >/dev/null
    joined=$(sed -n 's/.*"choices":\(.*\),"kvq".*/\1/p' "$tmp/body")
    [ -n "$parts" ] && [ "$parts" = "$joined" ] && ok "text parts answer as their join with a newline" ||
        bad "text parts: '$parts' vs '$joined'"
    check "a non-text part: 400" "$(status POST /v1/chat/completions \
        '{"messages":[{"role":"user","content":[{"type":"text","text":"Hi"},{"type":"image_url","image_url":{"url":"x"}}]}]}' \
        -H 'Authorization: Bearer sekrit')" 400
    check "a non-text part: named" "$(param_of):$(code_of)" "messages[0].content[1]:unsupported_value"
    # a NUL in a chat message is a byte of the rendered prompt too
    printf '<|im_start|>user\nnul \000 inside<|im_end|>\n<|im_start|>assistant\n' >"$tmp/chatnul.txt"
    status POST /v1/chat/completions '{"messages":[{"role":"user","content":"nul \u0000 inside"}],"max_tokens":1}' \
        -H 'Authorization: Bearer sekrit' >/dev/null
    check "a NUL in chat content keeps the rest of it" \
        "$(sed -n 's/.*"prompt_tokens":\([0-9]*\).*/\1/p' "$tmp/body")" "$(tokens "$tmp/chatnul.txt" --no-bos)"
    stop_server
    check "SIGTERM on an idle server exits 0" "$stop_rc" 0
else
    bad "kvq serve did not start: $(cat "$tmp/log1")"
fi

# ---- 2. bad input, faults ---------------------------------------------------
if start_server "$tmp/log2" --ctx 512 --max-body 64KiB --timeout 2 -ctk f16 -ctv f16 --max-seqs 4; then
    check "malformed JSON: 400" "$(status POST /v1/completions '{"prompt": "x",')" 400
    check "malformed JSON: its code" "$(code_of)" invalid_json
    grep -q '"type":"invalid_request_error"' "$tmp/body" && ok "400 body in OpenAI's shape" || bad "400 body: $(cat "$tmp/body")"
    check "wrong type: 400" "$(status POST /v1/completions '{"prompt":"x","max_tokens":"ten"}')" 400
    grep -q '"param":"max_tokens"' "$tmp/body" && ok "400 names the field" || bad "400 param: $(cat "$tmp/body")"
    check "prompt missing: 400" "$(status POST /v1/completions '{"max_tokens":3}')" 400
    check "a JSON array body: 400" "$(status POST /v1/completions '[1,2]')" 400
    check "n=2: 400" "$(status POST /v1/completions '{"prompt":"x","n":2}')" 400
    check "token id out of range: 400" "$(status POST /v1/completions '{"prompt":[1,99999]}')" 400
    check "token id out of range: its code" "$(code_of)" token_id_out_of_vocabulary
    check "invalid UTF-8: 400" "$(status POST /v1/completions "$(printf '{"prompt":"bad \377 byte"}')")" 400
    check "invalid UTF-8: named" "$(param_of):$(code_of)" "prompt:invalid_utf8"
    # a NUL is a byte of the prompt: tokenized as kvq tokenize tokenizes the same bytes
    printf 'nul \000 inside' >"$tmp/nul.txt"
    check "a prompt with a NUL: 200" "$(status POST /v1/completions '{"prompt":"nul \u0000 inside","max_tokens":1}')" 200
    check "a prompt with a NUL keeps every byte" "$(sed -n 's/.*"prompt_tokens":\([0-9]*\).*/\1/p' "$tmp/body")" \
        "$(tokens "$tmp/nul.txt")"
    # max_completion_tokens wins over max_tokens (OpenAI, vLLM)
    status POST /v1/completions '{"prompt":"x","max_tokens":2,"max_completion_tokens":5,"ignore_eos":true}' >/dev/null
    check "max_completion_tokens wins over max_tokens" "$(sed -n 's/.*"completion_tokens":\([0-9]*\).*/\1/p' "$tmp/body")" 5
    # fields that would change the answer: refused, naming the field; their neutral values accepted
    for f in '"presence_penalty":0.5' '"frequency_penalty":1' '"repetition_penalty":1.2' \
        '"response_format":{"type":"json_object"}' '"tools":[{"type":"function","function":{"name":"f"}}]' \
        '"tool_choice":"required"' '"echo":true' '"best_of":2' '"n":2' '"suffix":"end"' '"min_p":0.1'; do
        field=$(echo "$f" | sed 's/^"\([a-z_]*\)".*/\1/')
        s=$(status POST /v1/completions "{\"prompt\":\"x\",\"max_tokens\":1,$f}")
        check "$field that changes the answer: 400 naming it" "$s:$(param_of):$(code_of)" "400:$field:unsupported_value"
    done
    # logit_bias (OpenAI's): +100 on one token makes it the answer, greedy or sampled
    force=$("$kvq" tokenize --model "$model" --no-bos --text " the")
    want=$("$kvq" tokenize --model "$model" --decode "$force,$force,$force" --json | sed -n 's/.*"text": *\("[^"]*"\).*/\1/p')
    for s in '"temperature":0' '"temperature":1,"seed":5'; do
        status POST /v1/completions "{\"prompt\":\"The pass key is\",\"max_tokens\":3,$s,\"logit_bias\":{\"$force\":100}}" >/dev/null
        check "logit_bias +100 on token $force ($s): the answer is it three times" \
            "$(sed -n 's/.*"text":\("[^"]*"\).*/\1/p' "$tmp/body")" "$want"
    done
    check "logit_bias with a token id outside the vocabulary: 400" \
        "$(status POST /v1/completions '{"prompt":"x","logit_bias":{"99999":1}}'):$(code_of)" "400:token_id_out_of_vocabulary"
    check "logit_bias over 100: 400 naming it" \
        "$(status POST /v1/completions '{"prompt":"x","logit_bias":{"1":101}}'):$(param_of):$(code_of)" "400:logit_bias:invalid_value"
    check "neutral values of those fields: 200" "$(status POST /v1/completions \
        '{"prompt":"x","max_tokens":1,"n":1,"best_of":1,"presence_penalty":0,"frequency_penalty":0,"repetition_penalty":1,"logit_bias":{},"response_format":{"type":"text"},"tools":[],"tool_choice":"none","echo":false}')" 200
    check "huge max_tokens: 400" "$(status POST /v1/completions '{"prompt":"x","max_tokens":1000000}')" 400
    long=$(head -c 3000 "$root/models/passkey-3500.txt" | tr -d '"\\')
    check "prompt over the context: 400" "$(status POST /v1/completions "{\"prompt\":\"$long\",\"max_tokens\":4}")" 400
    grep -q 'maximum context length' "$tmp/body" && ok "context error says why" || bad "context body: $(cat "$tmp/body")"
    check "prompt over the context: its code" "$(code_of)" context_length_exceeded
    big=$(head -c 100000 /dev/zero | tr '\0' a)
    check "body over --max-body: 413" "$(status POST /v1/completions "{\"prompt\":\"$big\"}")" 413
    check "unknown route: 404" "$(status GET /v2/nothing)" 404
    check "GET on a POST route: 405" "$(status GET /v1/completions)" 405
    check "wrong cache type in the kvq extension: 400" \
        "$(status POST /v1/completions '{"prompt":"x","kvq":{"cache_type_k":"tq3j","cache_type_v":"tq3"}}')" 400
    check "matching kvq extension: 200" \
        "$(status POST /v1/completions '{"prompt":"x","max_tokens":2,"kvq":{"cache_type_k":"f16","cache_type_v":"f16"}}')" 200
    # ignore_eos (vLLM's extension): this prompt's answer ends in EOS after ~10 tokens
    ask='The pass key is 7193825. Remember it. The sky is blue. What is the pass key? The pass key is'
    check "ignore_eos not a boolean: 400" "$(status POST /v1/completions '{"prompt":"x","ignore_eos":1}')" 400
    check "an answer that ends in EOS: 200" \
        "$(status POST /v1/completions "{\"prompt\":\"$ask\",\"max_tokens\":24,\"temperature\":0}")" 200
    grep -q '"finish_reason":"stop"' "$tmp/body" && ok "it stops at EOS" || bad "no EOS stop: $(cat "$tmp/body")"
    check "ignore_eos: 200" "$(status POST /v1/completions \
        "{\"prompt\":\"$ask\",\"max_tokens\":24,\"temperature\":0,\"ignore_eos\":true}")" 200
    grep -q '"completion_tokens":24' "$tmp/body" && grep -q '"finish_reason":"length"' "$tmp/body" &&
        ok "ignore_eos decodes all 24 tokens" || bad "ignore_eos: $(cat "$tmp/body")"
    check "chat without a template: 400" \
        "$(status POST /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}]}')" 400
    check "chat without a template: its code" "$(code_of)" chat_template_missing
    check "chat with a bad role: 400" \
        "$(status POST /v1/chat/completions '{"messages":[{"role":"robot","content":"hi"}]}')" 400
    after "bad input"
    # a request that never completes: the server drops it after --timeout
    if command -v node >/dev/null 2>&1; then
        t0=$(date +%s)
        node -e "
const s = require('net').connect($port, '127.0.0.1', () => s.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro'));
s.on('close', () => process.exit(0)); s.on('data', () => {}); setTimeout(() => process.exit(1), 15000);" 2>/dev/null
        rc=$?; t1=$(date +%s)
        check "a partial request is closed by the server (in $((t1 - t0)) s)" "$rc" 0
    else
        skip "partial request: node is not installed"
    fi
    after "partial request"
    # a client that goes away mid-stream: it closes the socket on the first
    # event, so the test does not depend on how fast this machine generates
    # (500 tokens take under a second on a fast one)
    if command -v node >/dev/null 2>&1; then
        node -e "
const s = require('net').connect($port, '127.0.0.1', () => {
  const b = JSON.stringify({prompt: 'Once upon a time', max_tokens: 500, temperature: 0, stream: true});
  s.write('POST /v1/completions HTTP/1.1\\r\\nHost: x\\r\\nContent-Type: application/json\\r\\nContent-Length: ' + b.length + '\\r\\n\\r\\n' + b);
});
let got = '';
s.on('data', (d) => { got += d; if (got.includes('data: {')) { process.stdout.write(got); s.destroy(); process.exit(0); } });
setTimeout(() => process.exit(1), 15000);" >"$tmp/cut.out" 2>/dev/null
        grep -q '^data: {' "$tmp/cut.out" && ! grep -q 'DONE' "$tmp/cut.out" && ok "disconnect: the stream was cut after its first event" ||
            bad "disconnect: no first event before the cut: $(head -c 300 "$tmp/cut.out")"
        after "client disconnect mid-stream"
        c=$(metric 'kvq_sequences_finished_total{how="cancelled"}')
        [ "${c:-0}" -ge 1 ] && ok "disconnect: counted as cancelled" || bad "disconnect: cancelled = $c"
    else
        skip "disconnect: node is not installed"
    fi
    # SIGTERM with a stream running: it ends with [DONE], the server exits 0
    curl -s -N --max-time 60 -H 'Content-Type: application/json' \
        -d '{"prompt":"Once upon a time","max_tokens":400,"temperature":0,"stream":true}' \
        "$url/v1/completions" >"$tmp/drain.out" 2>/dev/null &
    cpid=$!
    i=0
    while [ $i -lt 50 ] && ! grep -q '^data: {' "$tmp/drain.out"; do sleep 0.1; i=$((i + 1)); done
    stop_server
    wait $cpid
    check "SIGTERM drains, then exits 0" "$stop_rc" 0
    tail -n 2 "$tmp/drain.out" | grep -q '^data: \[DONE\]' && grep -q '"finish_reason":"length"' "$tmp/drain.out" &&
        ok "the running stream finished before the exit" || bad "drained stream: $(tail -c 300 "$tmp/drain.out")"
else
    bad "kvq serve did not start: $(cat "$tmp/log2")"
fi

# ---- 3. load: 32 clients x 8 requests over a small pool -----------------------
# 4 pages of 64 tokens: at most two of these requests hold pages at once.
if start_server "$tmp/log3" -ctk f16 -ctv f16 --kv-budget 1MiB --max-seqs 8 --max-queue 8 --chunk 64; then
    text=$(tr -d '"\\\n' <"$root/models/passkey-3500.txt")
    for k in 0 1 2 3; do
        off=$((k * 97 + 1))
        p=$(printf '%s' "$text" | cut -c "$off-$((off + 250))")
        if [ $((k % 2)) = 0 ]; then s='"temperature":0'; else s='"temperature":0.8,"seed":'$((k + 7)); fi
        printf '{"prompt":"%s","max_tokens":8,%s}' "$p" "$s" >"$tmp/req$k.json"
        curl -s --max-time 60 -H 'Content-Type: application/json' --data-binary "@$tmp/req$k.json" \
            "$url/v1/completions" | sed -n 's/.*"choices":\(.*\),"usage".*/\1/p' >"$tmp/solo$k"
    done
    [ -s "$tmp/solo0" ] && [ -s "$tmp/solo1" ] && ok "load: solo answers" || bad "load: no solo answers"
    t0=$(date +%s)
    c=0
    clients=""
    while [ $c -lt 32 ]; do
        (
            r=0
            while [ $r -lt 8 ]; do
                k=$(((c + r) % 4))
                code=$(curl -s -o "$tmp/out.$c.$r" -w '%{http_code}' --max-time 120 -H 'Content-Type: application/json' \
                    --data-binary "@$tmp/req$k.json" "$url/v1/completions")
                echo "$code $k" >"$tmp/code.$c.$r"
                r=$((r + 1))
            done
        ) &
        clients="$clients $!"
        c=$((c + 1))
    done
    wait $clients
    t1=$(date +%s)
    n200=0; nbusy=0; nbad=0; nsame=0
    for f in "$tmp"/code.*; do
        set -- $(cat "$f")
        o=$tmp/out.${f#"$tmp"/code.}
        case $1 in
        200)
            n200=$((n200 + 1))
            [ "$(sed -n 's/.*"choices":\(.*\),"usage".*/\1/p' "$o")" = "$(cat "$tmp/solo$2")" ] && nsame=$((nsame + 1))
            ;;
        429 | 503) grep -q '"error"' "$o" && nbusy=$((nbusy + 1)) || nbad=$((nbad + 1)) ;;
        *) nbad=$((nbad + 1)) ;;
        esac
    done
    echo "  load: 256 requests in $((t1 - t0)) s: $n200 completed ($nsame equal to solo), $nbusy answered 429/503"
    check "load: every request completed or got 429/503" "$((n200 + nbusy)):$nbad" "256:0"
    check "load: every completed request has its solo tokens" "$nsame" "$n200"
    [ "$n200" -ge 16 ] && ok "load: at least 16 requests completed" || bad "load: only $n200 completed"
    after "load"
    stop_server
    check "load server exits 0" "$stop_rc" 0
else
    bad "kvq serve did not start: $(cat "$tmp/log3")"
fi
# ---- 4. prefix reuse: a second turn takes over the first turn's prompt ------
# tq3j/tq3 with the recent f16 window (the default cache): the second turn's
# answer must equal the one a server without --prefix-cache gives.
turn1=$(tr -d '"\\\n' <"$root/models/passkey-3500.txt" | cut -c 1-1200)
printf '{"prompt":"%s","max_tokens":8,"temperature":0}' "$turn1" >"$tmp/t1.json"
second_turn() { # URL -> the second turn's choices
    a1=$(curl -s --max-time 60 -H 'Content-Type: application/json' --data-binary "@$tmp/t1.json" "$1/v1/completions" |
        sed -n 's/.*"text":"\([^"\\]*\)".*/\1/p')
    printf '{"prompt":"%s%s The pass key is","max_tokens":8,"temperature":0}' "$turn1" "$a1" >"$tmp/t2.json"
    curl -s --max-time 60 -H 'Content-Type: application/json' --data-binary "@$tmp/t2.json" "$1/v1/completions" |
        sed -n 's/.*"choices":\(.*\),"usage".*/\1/p'
}
if start_server "$tmp/log4" --prefix-cache 2 --chunk 64 --max-seqs 4; then
    with=$(second_turn "$url")
    reused=$(metric kvq_prefix_reused_tokens_total)
    stop_server
    check "prefix reuse server exits 0" "$stop_rc" 0
    if start_server "$tmp/log5" --chunk 64 --max-seqs 4; then
        without=$(second_turn "$url")
        stop_server
        [ -n "$with" ] && [ "$with" = "$without" ] && ok "prefix reuse: the second turn's answer is unchanged" ||
            bad "prefix reuse changed the answer: '$with' vs '$without'"
        [ "${reused:-0}" -ge 256 ] && ok "prefix reuse: $reused prompt tokens not prefilled again" ||
            bad "prefix reuse: $reused tokens reused"
    else
        bad "kvq serve did not start: $(cat "$tmp/log5")"
    fi
else
    bad "kvq serve did not start: $(cat "$tmp/log4")"
fi
# ---- 5. prefix sharing: concurrent requests with one long prompt hold it once --
# Four at once after a solo run: each answer equals the solo one, three
# requests share the first one's whole prompt chunks (usage.prompt_tokens_
# details.cached_tokens, the counters), and the pool never held more than
# one copy of them: at most the first request's pages plus the others' own.
share=$(tr -d '"\\\n' <"$root/models/passkey-3500.txt" | cut -c 1-1800)
# 48 tokens each keep the first one running while the others arrive
printf '{"prompt":"%s","max_tokens":48,"temperature":0}' "$share" >"$tmp/share.json"
if start_server "$tmp/log6" --max-seqs 4; then
    curl -s --max-time 60 -H 'Content-Type: application/json' --data-binary "@$tmp/share.json" \
        "$url/v1/completions" >"$tmp/share.solo"
    solo=$(sed -n 's/.*"choices":\(.*\),"usage".*/\1/p' "$tmp/share.solo")
    n=$(sed -n 's/.*"prompt_tokens":\([0-9]*\).*/\1/p' "$tmp/share.solo")
    jobs=""
    for k in 1 2 3 4; do
        curl -s --max-time 60 -H 'Content-Type: application/json' --data-binary "@$tmp/share.json" \
            "$url/v1/completions" >"$tmp/share.$k" &
        jobs="$jobs $!"
    done
    wait $jobs
    same=0; cached=0
    for k in 1 2 3 4; do
        [ -n "$solo" ] && [ "$(sed -n 's/.*"choices":\(.*\),"usage".*/\1/p' "$tmp/share.$k")" = "$solo" ] && same=$((same + 1))
        cached=$((cached + $(sed -n 's/.*"cached_tokens":\([0-9]*\).*/\1/p' "$tmp/share.$k")))
    done
    check "prefix sharing: 4 concurrent answers equal the solo one" "$same" 4
    unit=$(((n - 1) / 256 * 256)) # the whole 256-token chunks before the last prompt token
    check "prefix sharing: 3 requests shared the prompt's $unit-token start" \
        "$(metric kvq_prefix_share_hits_total):$(metric kvq_prefix_shared_tokens_total):$cached" \
        "3:$((3 * unit)):$((3 * unit))"
    own=$(((n + 48 + 63) / 64)) # one request's pages unshared
    peak=$(metric kvq_kv_pages_used_peak); speak=$(metric kvq_kv_pages_shared_peak)
    echo "  prefix sharing: $n-token prompt, peak $peak pages used ($speak shared); unshared 4 x $own"
    [ "${speak:-0}" -ge $((unit / 64)) ] && [ "${peak:-999}" -le $((own + 3 * (own - unit / 64))) ] &&
        ok "prefix sharing: one copy of the shared pages ($speak), peak $peak <= $((own + 3 * (own - unit / 64)))" ||
        bad "prefix sharing: peak $peak pages used, $speak shared"
    after "prefix sharing"
    stop_server
else
    bad "kvq serve did not start: $(cat "$tmp/log6")"
fi
# like_run NAME DIR IDS N SEED [SERVER ARGS]: kvq serve on DIR (--max-seqs 4,
# --seed SEED: kvq run's seed is the codecs' too) answers the prompt IDS
# (token ids) with exactly the text kvq run prints for N tokens, greedy (3
# requests at once) and sampled with seed SEED (one more at once). Leaves
# the server running (0) for the caller's checks, or returns 1.
like_run() {
    lname=$1; ldir=$2; lids=$3; ln=$4; lseed=$5; shift 5
    text_of() { sed -n 's/.*"text":"\([^"]*\)".*/\1/p' "$@"; }
    want_g=$("$kvq" run --model "$ldir" --prompt-ids "$lids" -n "$ln" --seed "$lseed" --json 2>/dev/null | text_of)
    want_s=$("$kvq" run --model "$ldir" --prompt-ids "$lids" -n "$ln" --temp 0.8 --seed "$lseed" --json 2>/dev/null |
        text_of)
    keep=$model; model=$ldir
    start_server "$tmp/log_like" --max-seqs 4 --seed "$lseed" "$@"; started=$?
    model=$keep
    if [ $started -ne 0 ]; then
        bad "$lname: kvq serve did not start: $(cat "$tmp/log_like")"
        return 1
    fi
    printf '{"prompt":[%s],"max_tokens":%d,"temperature":0}' "$lids" "$ln" >"$tmp/like.json"
    printf '{"prompt":[%s],"max_tokens":%d,"temperature":0.8,"seed":%d}' "$lids" "$ln" "$lseed" >"$tmp/like_s.json"
    jobs=""
    for k in 1 2 3; do
        curl -s --max-time 60 -H 'Content-Type: application/json' --data-binary "@$tmp/like.json" \
            "$url/v1/completions" >"$tmp/like.$k" &
        jobs="$jobs $!"
    done
    curl -s --max-time 60 -H 'Content-Type: application/json' --data-binary "@$tmp/like_s.json" \
        "$url/v1/completions" >"$tmp/like_s" &
    wait $jobs $!
    same=0
    for k in 1 2 3; do
        [ -n "$want_g" ] && [ "$(text_of "$tmp/like.$k")" = "$want_g" ] && same=$((same + 1))
    done
    check "$lname: 3 greedy answers at once equal kvq run's" "$same" 3
    check "$lname: a seeded answer equals kvq run's" "$(text_of "$tmp/like_s")" "${want_s:-(kvq run printed no text)}"
    return 0
}
# ids N M: N token ids, (7919 i + 3) mod M
ids() { awk -v n="$1" -v v="$2" 'BEGIN { for (i = 0; i < n; i++) printf "%s%d", i ? "," : "", (i * 7919 + 3) % v }'; }

# ---- 6. sliding windows and Gemma 3 ---------------------------------------
# A Mistral config with a 32-token window (the bundled weights; a prompt of
# 600 tokens: 3 chunks) and Gemma 3 (tests/models/gemma3_text: 8-token
# windows, sandwich norms, the attention scale; a tokenizer written here
# spells its 256 ids t000..t255), which kvq serve refused before.
mkdir -p "$tmp/mw" "$tmp/g3"
for f in "$root"/models/kvq-tiny-llama/*; do
    [ "${f##*/}" = config.json ] || ln -s "$f" "$tmp/mw/"
done
sed 's/"model_type": *"llama"/"model_type": "mistral", "sliding_window": 32/' \
    "$root/models/kvq-tiny-llama/config.json" >"$tmp/mw/config.json"
ln -s "$root/tests/models/gemma3_text/config.json" "$root/tests/models/gemma3_text/model.safetensors" "$tmp/g3/"
awk 'BEGIN { printf "{\"version\":\"1.0\",\"added_tokens\":[],\"decoder\":{\"type\":\"Fuse\"},\"model\":{\"type\":\"BPE\",\"vocab\":{"
             for (i = 0; i < 256; i++) printf "%s\"t%03d\":%d", i ? "," : "", i, i
             printf "},\"merges\":[]}}\n" }' >"$tmp/g3/tokenizer.json"
if like_run "mistral, 32-token window" "$tmp/mw" "$(ids 600 3700)" 24 0; then
    after "mistral, 32-token window"
    stop_server
fi
if like_run "gemma 3" "$tmp/g3" "$(ids 100 256)" 24 0; then
    after "gemma 3"
    stop_server
fi

# A mixture-of-experts model (tests/models/qwen3_moe: 2 sparse layers of 8
# experts, top 2; the same spelled tokenizer) with an expert cache of 3
# slots, fewer than one layer's experts, shared by the sequences: the
# answers are kvq run's without a cache, and /metrics counts the misses.
mkdir -p "$tmp/moe"
ln -s "$root/tests/models/qwen3_moe/config.json" "$root/tests/models/qwen3_moe/model.safetensors" "$tmp/moe/"
cp "$tmp/g3/tokenizer.json" "$tmp/moe/"
if like_run "mixture of experts, 3-slot expert cache" "$tmp/moe" "$(ids 100 256)" 24 0 --expert-cache 40KiB \
    --expert-prefetch on; then
    miss=$(metric 'kvq_expert_fetches_total{result="miss"}'); hit=$(metric 'kvq_expert_fetches_total{result="hit"}')
    rd=$(metric kvq_expert_read_bytes_total)
    [ "${miss:-0}" -gt 0 ] && [ "${rd:-0}" -eq $((miss * 12288)) ] &&
        ok "expert cache: $miss misses ($rd bytes read), $hit hits" ||
        bad "expert cache: misses '$miss', bytes read '$rd', hits '$hit'"
    after "mixture of experts"
    stop_server
fi
check "--expert-cache 0: exit 2" "$(timeout 30 "$kvq" serve --model "$tmp/moe" --port 0 --expert-cache 0 2>/dev/null; echo $?)" 2

# ---- 7. speculative decoding ----------------------------------------------
# --speculative 8: requests verify n-gram drafts in their decode rows (the
# sampled one draws each row at its next uniforms); a prompt that repeats
# itself gives drafts the model keeps. The answers are kvq run's plain
# decoding, and drafts were verified and kept.
if like_run "speculative" "$model" "$(awk 'BEGIN { for (i = 0; i < 240; i++) printf "%s%d", i ? "," : "", 300 + (i % 24) * 37 }')" \
    40 3 --speculative 8; then
    drafted=$(metric kvq_speculative_drafted_tokens_total); kept=$(metric kvq_speculative_accepted_tokens_total)
    [ "${kept:-0}" -gt 0 ] && [ "${drafted:-0}" -ge "${kept:-0}" ] &&
        ok "speculative: $kept of $drafted drafts kept" || bad "speculative: drafted '$drafted', kept '$kept'"
    after "speculative"
    stop_server
fi
check "--speculative past 15: exit 2" \
    "$(timeout 30 "$kvq" serve --model "$model" --port 0 --speculative 16 2>/dev/null; echo $?)" 2

check "--prefix-share with a bad value: exit 2" \
    "$(timeout 30 "$kvq" serve --model "$model" --port 0 --prefix-share maybe 2>/dev/null; echo $?)" 2
check "--prefix-cache with a chunk off the page grid: exit 2" \
    "$(timeout 30 "$kvq" serve --model "$model" --port 0 --prefix-cache 2 --chunk 100 2>/dev/null; echo $?)" 2
finish
