#!/bin/sh
# The module boundaries, checked on the built library and the sources:
#  1. libkvq.so exports exactly the functions the public headers mark
#     KVQ_API (nothing internal leaks, nothing public is missing);
#  2. decoder/, eval/ and tools/ include only public headers (include/kvq/) and
#     headers of their own folder: never a library *_internal.h;
#  3. public headers include only public headers and system headers.
# KVQ_BUILD names the build directory (default: build).
name=test_boundaries.sh
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_BUILD:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
passed=0; failed=0; skipped=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
bad() { echo "FAIL $1"; failed=$((failed + 1)); }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

so=$build/lib/libkvq.so
if ! command -v nm >/dev/null 2>&1 || [ ! -f "$so" ]; then
    echo "SKIP exports: no nm or no $so"
    skipped=$((skipped + 1))
else
    nm -D --defined-only "$so" | awk '{print $3}' | sort -u > "$tmp/exported"
    grep -ho 'KVQ_API[^(;]*\<kvq_[a-z0-9_]*' "$root"/include/kvq/*.h | grep -o 'kvq_[a-z0-9_]*$' |
        sort -u > "$tmp/public"
    comm -23 "$tmp/exported" "$tmp/public" > "$tmp/extra"
    comm -13 "$tmp/exported" "$tmp/public" > "$tmp/missing"
    if [ -s "$tmp/extra" ]; then
        bad "exports: libkvq.so exports $(wc -l < "$tmp/extra") non-public symbols:"
        head -n 20 "$tmp/extra" | sed 's/^/     /'
    else
        ok "exports: no symbol beyond the $(wc -l < "$tmp/public") public functions"
    fi
    if [ -s "$tmp/missing" ]; then
        bad "exports: $(wc -l < "$tmp/missing") public functions not exported:"
        head -n 20 "$tmp/missing" | sed 's/^/     /'
    else
        ok "exports: every public function is exported"
    fi
fi

# Quoted includes of each file in $1 (folders), resolved: a header must be
# public or live in the including file's own top-level folder.
check_includes() {
    top=$1
    find "$root/$top" -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' | sort | while read -r f; do
        grep -o '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]*"' "$f" | sed 's/.*"\(.*\)"/\1/' |
            while read -r h; do
                [ -f "$root/include/kvq/$h" ] && continue
                [ -n "$(find "$root/$top" -name "$(basename "$h")" -print -quit)" ] && continue
                echo "${f#$root/} includes $h"
            done
    done
}
for top in decoder eval tools; do
    [ -d "$root/$top" ] || continue
    check_includes $top > "$tmp/inc_$top"
    if [ -s "$tmp/inc_$top" ]; then
        bad "$top/ includes non-public library headers:"
        sed 's/^/     /' "$tmp/inc_$top"
    else
        ok "$top/ includes only public headers and its own"
    fi
done

for f in "$root"/include/kvq/*; do
    grep -o '^#[[:space:]]*include[[:space:]]*"[^"]*"' "$f" | sed 's/.*"\(.*\)"/\1/' | while read -r h; do
        [ -f "$root/include/kvq/$h" ] || echo "include/kvq/$(basename "$f") includes $h"
    done
done > "$tmp/pub_inc"
if [ -s "$tmp/pub_inc" ]; then
    bad "public headers include private ones:"
    sed 's/^/     /' "$tmp/pub_inc"
else
    ok "public headers include only public headers"
fi

echo "$name: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
