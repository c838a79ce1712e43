#!/bin/sh
# The README's library example compiles, links and runs exactly as written:
# the C block under "Using the library" is saved as app.c and built with the
# command its first line gives ("cc app.c $(pkg-config ...) -lm") after the
# README's `export PKG_CONFIG_PATH=$PWD/build/lib`, run at the top of the
# tree: pkg-config must find the build's kvq-uninstalled.pc there (before,
# the line worked only after `make install`; this test made its own .pc and
# never noticed). The program must record the SONAME libkvq.so.0 and, with
# no LD_LIBRARY_PATH (the .pc's rpath), print "ok: 300 tokens". The same
# line is built once more against a kvq.pc made from mk/kvq.pc.in, as `make
# install` writes it, with the prefix pointing into the tree.
# KVQ_BUILD names the build directory (default: build).
name=test_readme.sh
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_BUILD:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
. "$root/tests/tally.sh"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

if ! command -v pkg-config >/dev/null 2>&1 || ! command -v cc >/dev/null 2>&1 || [ ! -f "$build/lib/libkvq.so" ]; then
    skip "needs pkg-config, cc and $build/lib/libkvq.so"
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
# The README's line for an uninstalled tree, up to its comment.
export_line=$(awk '/^Using the library/ { want = 1 } want && /^```c$/ { exit }
                   want && /^export PKG_CONFIG_PATH=/ { sub(/ *#.*/, ""); print; exit }' "$root/README.md")
case $export_line in
'export PKG_CONFIG_PATH=$PWD/build/lib') ok "README: before make install, '$export_line'" ;;
*) bad "README: no 'export PKG_CONFIG_PATH=\$PWD/build/lib' before the example (got '$export_line')"; finish ;;
esac

# A sanitized libkvq.so needs its runtime in the program too.
extra=
nm -D "$build/lib/libkvq.so" 2>/dev/null | grep -q ' U __asan_init' && extra="-fsanitize=address,undefined"
# build_app DIR: runs $line in DIR with the PKG_CONFIG_PATH already exported.
build_app() {
    (cd "$1" && sh -c "$line $extra -o app" > build.log 2>&1)
}
# runs APP WHAT [LIBDIR]: the program prints the expected line and exits 0,
# with LD_LIBRARY_PATH=LIBDIR, or none at all without LIBDIR.
runs() {
    if [ -n "$3" ]; then
        out=$(env LD_LIBRARY_PATH="$3" ASAN_OPTIONS=detect_leaks=0 "$1" 2>&1); rc=$?
    else
        out=$(env -u LD_LIBRARY_PATH ASAN_OPTIONS=detect_leaks=0 "$1" 2>&1); rc=$?
    fi
    case $out in
    "ok: 300 tokens cached, out[0][0] = "*) [ "$rc" -eq 0 ] && ok "README: $2: $out" || bad "README: $2: exit $rc: $out" ;;
    *) bad "README: $2 printed '$out' (exit $rc)" ;;
    esac
}

# 1. As the README says, in the tree: the export at the top (a BUILD other
#    than build/ has its .pc in its own lib/), then the cc line elsewhere.
mkdir -p "$tmp/uninst"
cp "$tmp/app.c" "$tmp/uninst/"
rel=${build#"$root"/}
if [ "$rel" = "$build" ]; then
    pc_line=$(echo "$export_line" | sed "s|\$PWD/build/lib|$build/lib|")
else
    pc_line=$(echo "$export_line" | sed "s|/build/lib|/$rel/lib|")
fi
# pkg-config must take the tree's .pc, not an installed kvq.pc further on.
want_libdir=$(cd "$build/lib" && pwd -P)
got_libdir=$(cd "$root" && eval "$pc_line" && pkg-config --variable=libdir kvq 2>&1)
[ "$got_libdir" = "$want_libdir" ]
check_libdir=$?
if [ "$check_libdir" -eq 0 ]; then
    ok "README: after '$pc_line', pkg-config's kvq is the build's ($got_libdir)"
else
    bad "README: after '$pc_line', pkg-config's kvq libdir is '$got_libdir', not $want_libdir (no kvq-uninstalled.pc?)"
fi
if [ "$check_libdir" -eq 0 ] && (cd "$root" && eval "$pc_line" && cd "$tmp/uninst" && build_app .); then
    ok "README: '$line' builds after '$pc_line' (kvq-uninstalled.pc)"
else
    bad "README: '$line' after '$pc_line' failed:"
    sed 's/^/     /' "$tmp/uninst/build.log" 2>/dev/null | head -n 20
    finish
fi
if readelf -d "$tmp/uninst/app" 2>/dev/null | grep -q 'NEEDED.*\[libkvq\.so\.0\]'; then
    ok "README: the program records the SONAME libkvq.so.0"
else
    bad "README: the program does not need libkvq.so.0 (SONAME missing?)"
fi
runs "$tmp/uninst/app" "uninstalled, run with no LD_LIBRARY_PATH"

# 2. As installed: kvq.pc from mk/kvq.pc.in with its prefix in the tree.
mkdir -p "$tmp/prefix" "$tmp/pc" "$tmp/inst"
cp "$tmp/app.c" "$tmp/inst/"
ln -s "$root/include" "$tmp/prefix/include"
ln -s "$build/lib" "$tmp/prefix/lib"
sed -e "s|@PREFIX@|$tmp/prefix|" -e 's|@VERSION@|0|' -e 's|@LIBS@||' "$root/mk/kvq.pc.in" > "$tmp/pc/kvq.pc"
if (export PKG_CONFIG_PATH="$tmp/pc"; build_app "$tmp/inst"); then
    ok "README: '$line' builds against kvq.pc as make install writes it"
else
    bad "README: '$line' against the installed-style kvq.pc failed:"
    sed 's/^/     /' "$tmp/inst/build.log" | head -n 20
    finish
fi
runs "$tmp/inst/app" "installed-style, run" "$build/lib"
finish
