#!/bin/sh
# Checks the Debian packages kvq builds against; installs the missing ones
# when running as root, otherwise prints the exact apt-get line and fails.
set -u
missing=""
have_header() { echo "#include <$1>" | ${CC:-cc} -E -x c - >/dev/null 2>&1; }
have_header fftw3.h       || missing="$missing libfftw3-dev"
have_header cblas.h       || missing="$missing libopenblas-dev"
have_header cjson/cJSON.h || missing="$missing libcjson-dev"
command -v gnuplot >/dev/null 2>&1 || missing="$missing gnuplot-nox"
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
