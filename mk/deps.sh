#!/bin/sh
# Checks the Debian packages kvq builds against; installs the missing ones
# when running as root, otherwise prints the exact apt-get line and fails.
set -u
missing=""
# A header alone is not enough: libblas-dev ships cblas.h without
# libopenblas, so each package is checked by compiling and linking against it.
have_lib() {
    tmp=$(mktemp -d) || return 1
    # (pcre2.h wants its code unit width chosen; the others ignore the macro.)
    printf '#define PCRE2_CODE_UNIT_WIDTH 8\n#include <%s>\nint main(void) { return 0; }\n' "$1" > "$tmp/t.c"
    ${CC:-cc} "$tmp/t.c" -o "$tmp/t" "$2" >/dev/null 2>&1
    rc=$?
    rm -rf "$tmp"
    return $rc
}
# `sh mk/deps.sh fuzz`: what `make fuzz` needs instead, clang with libFuzzer
# (its runtime is a package of its own: clang alone links no -fsanitize=fuzzer).
have_fuzzer() {
    tmp=$(mktemp -d) || return 1
    printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' > "$tmp/f.c"
    ${FUZZ_CC:-clang} -fsanitize=fuzzer,address,undefined "$tmp/f.c" -o "$tmp/f" >/dev/null 2>&1
    rc=$?
    rm -rf "$tmp"
    return $rc
}
if [ "${1:-}" = fuzz ]; then
    have_fuzzer || missing=" clang libclang-rt-dev"
else
have_lib fftw3.h       -lfftw3f  || missing="$missing libfftw3-dev"
have_lib cblas.h       -lopenblas || missing="$missing libopenblas-dev"
have_lib cjson/cJSON.h -lcjson   || missing="$missing libcjson-dev"
have_lib microhttpd.h  -lmicrohttpd || missing="$missing libmicrohttpd-dev"
# The tokenizer's regexes (Split, ByteLevel) and Unicode normalization.
have_lib pcre2.h       -lpcre2-8 || missing="$missing libpcre2-dev"
have_lib utf8proc.h    -lutf8proc || missing="$missing libutf8proc-dev"
command -v gnuplot >/dev/null 2>&1 || missing="$missing gnuplot-nox"
fi
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "kvq: installing missing packages:$missing" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2 && apt-get install -y -qq $missing >&2 && exit 0
    echo "kvq: apt-get failed; install by hand: apt-get install -y$missing" >&2
    exit 1
fi
echo "kvq: missing build dependencies. Run:" >&2
echo "    sudo apt-get install -y$missing" >&2
exit 1
