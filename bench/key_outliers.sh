#!/bin/sh
# key_outliers.sh BUILD - the Qwen2 k_proj-bias case (issue 20): mean and
# 99th-percentile KL against an f32 cache and top-1 agreement for f16, q8_0,
# q4_0 and tq3j/tq3 caches (no recent window), on tests/models/qwen2_kbias
# (first and last layers' k_proj bias 30x the median norm) with the
# key-outlier guard (the default: those layers' keys in f16) and without it
# (--no-key-outlier-f16), and on qwen2_yarn (the same family without the
# outlier bias, where the guard marks nothing) for comparison. The fixtures carry no
# tokenizer: a copy of each gets a byte-level one (vocabulary 256 = bytes),
# and the text is the bundled model's valid.txt (ctx 128, 4096 tokens).
# KVQ_DEVICE=cuda runs the same on the GPU; BUILD may also be the kvq binary.
build=${1:-build}
kvq=$build/bin/kvq
[ -f "$build" ] && kvq=$build
[ -x "$kvq" ] || { echo "key_outliers: no $kvq"; exit 1; }
device=${KVQ_DEVICE:-cpu}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
python3 - "$tmp/tokenizer.json" <<'PY' || exit 1
import json, sys
# GPT-2's bytes-to-unicode alphabet: what the ByteLevel pre-tokenizer emits
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
vocab = {chr(c): b for b, c in zip(bs, cs)}
bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
json.dump({"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": bl, "post_processor": None,
           "decoder": bl, "model": {"type": "BPE", "vocab": vocab, "merges": [], "byte_fallback": False,
                                   "fuse_unk": False, "ignore_merges": False}},
          open(sys.argv[1], "w"), ensure_ascii=False)
PY
printf '%-12s %-24s %10s %10s %8s\n' model "cache" "mean KL" "p99 KL" "top-1"
for m in qwen2_yarn qwen2_kbias; do
    cp -r tests/models/$m "$tmp/$m" && cp "$tmp/tokenizer.json" "$tmp/$m/"
    for conf in "f16/f16" "q8_0/q8_0" "q8_0/q8_0 --no-key-outlier-f16" "q4_0/q4_0" "q4_0/q4_0 --no-key-outlier-f16" \
        "tq3j/tq3" "tq3j/tq3 --no-key-outlier-f16"; do
        t=${conf%% *}
        extra=""
        [ "$t" != "$conf" ] && extra=${conf#* }
        [ "$m" = qwen2_yarn ] && [ -n "$extra" ] && continue
        # shellcheck disable=SC2086
        line=$("$kvq" ppl --model "$tmp/$m" --file models/kvq-tiny-llama/reference/valid.txt --ctx 128 \
            --max-tokens 4096 --kl-divergence --no-kv-recent-f16 --quiet --device "$device" \
            -ctk "${t%/*}" -ctv "${t#*/}" $extra 2>/dev/null |
            grep 'KL vs')
        echo "$line" | awk -v m=$m -v c="$t${extra:+ (no guard)}" '{for (i = 1; i <= NF; i++) {
            if ($i == "mean") mean = $(i + 1); if ($i == "p99") p99 = $(i + 1); if ($i == "agreement") top = $(i + 1) }
            printf "%-12s %-24s %10s %10s %8s\n", m, c, mean, p99, top}'
    done
done
