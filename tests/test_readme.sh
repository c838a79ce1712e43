#!/bin/sh
# The README's library example compiles, links and runs exactly as written:
# the C block under "Using the library" is saved as app.c and built with the
# command its first line gives ("cc app.c $(pkg-config ...) -lm"), against
# this build's libkvq.so through a kvq.pc made from mk/kvq.pc.in (as `make
# install` would write it, with the prefix pointing into the tree). The
# program must record the SONAME libkvq.so.0 and print "ok: 300 tokens".
# KVQ_BUILD names the build directory (default: build).
name=test_readme.sh
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_BUILD:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
passed=0; failed=0; skipped=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
bad() { echo "FAIL $1"; failed=$((failed + 1)); }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
finish() { echo "$name: $passed passed, $failed failed, $skipped skipped"; [ "$failed" -eq 0 ]; exit $?; }

if ! command -v pkg-config >/dev/null 2>&1 || ! command -v cc >/dev/null 2>&1 || [ ! -f "$build/lib/libkvq.so" ]; then
    echo "skip: needs pkg-config, cc and $build/lib/libkvq.so"
    skipped=1
    finish
fi

awk '/^Using the library/ { want = 1 } want && /^```c$/ { inside = 1; next }
     inside && /^```$/ { exit } inside { print }' "$root/README.md" > "$tmp/app.c"
line=$(sed -n '1s|^/\* app.c: \(.*\) \*/$|\1|p' "$tmp/app.c")
if [ -s "$tmp/app.c" ] && [ -n "$line" ]; then
    ok "README: the example and its build line ($line)"
else
    bad "README: no C block under 'Using the library' starting with /* app.c: BUILD LINE */"
    finish
fi

mkdir -p "$tmp/prefix" "$tmp/pc"
ln -s "$root/include" "$tmp/prefix/include"
ln -s "$build/lib" "$tmp/prefix/lib"
sed -e "s|@PREFIX@|$tmp/prefix|" -e 's|@VERSION@|0|' -e 's|@LIBS@||' "$root/mk/kvq.pc.in" > "$tmp/pc/kvq.pc"
# A sanitized libkvq.so needs its runtime in the program too.
extra=
nm -D "$build/lib/libkvq.so" 2>/dev/null | grep -q ' U __asan_init' && extra="-fsanitize=address,undefined"
if (cd "$tmp" && PKG_CONFIG_PATH="$tmp/pc" sh -c "$line $extra -o app" > build.log 2>&1); then
    ok "README: the example compiles and links as written"
else
    bad "README: '$line' failed:"
    sed 's/^/     /' "$tmp/build.log" | head -n 20
    finish
fi
if readelf -d "$tmp/app" 2>/dev/null | grep -q 'NEEDED.*\[libkvq\.so\.0\]'; then
    ok "README: the program records the SONAME libkvq.so.0"
else
    bad "README: the program does not need libkvq.so.0 (SONAME missing?)"
fi
out=$(LD_LIBRARY_PATH="$build/lib" ASAN_OPTIONS=detect_leaks=0 "$tmp/app" 2>&1); rc=$?
case $out in
"ok: 300 tokens cached, out[0][0] = "*) [ "$rc" -eq 0 ] && ok "README: the program runs: $out" ||
                                          bad "README: exit $rc: $out" ;;
*) bad "README: the program printed '$out' (exit $rc)" ;;
esac
finish
