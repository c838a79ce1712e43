#!/bin/sh
# Every relative link and image of every Markdown page resolves to a file of
# the tree, and every docs/... path that a page, script, benchmark or source
# comment names exists. Written when the result data moved from docs/ into
# docs/results/ and the measurement logs into docs/history/: a path missed in
# a page, a gnuplot script or bench/frontier.py would otherwise only show as
# a broken link on the web, or a plot written to the old place.
# Outputs a command would write (not files of the tree) are listed in
# `outputs` below. No build needed.
name=test_doc_links.sh
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/tests/tally.sh"
# dead WHAT: one more broken link or path
dead() { bad "$1"; broken=$((broken + 1)); }
cd "$root" || exit 1
# Paths named as what a command writes (docs/eval.md: kvq eval --plot PREFIX.png
# writes PREFIX-DATASET.png).
outputs=" docs/results/eval.png "

# The tree's own files: git's list in a clone, else every file outside the
# build directories (a copy without .git).
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    files() { git ls-files -- "$@"; }
else
    files() { find . \( -name 'build*' -o -name .git -o -name node_modules -o -name '.venv*' \) -prune -o -type f -print |
              sed 's|^\./||' | while read -r f; do for p in "$@"; do case $f in $p) echo "$f"; break ;; esac; done; done; }
fi

# 1. Links and images: [text](target) and ![alt](target), relative ones only.
n=0; broken=0
for md in $(files '*.md'); do
    dir=$(dirname "$md")
    # one target a line: what sits between "](" and the next ")" or space
    for t in $(grep -o '\](\([^)[:space:]]*\)' "$md" | sed 's/^](//'); do
        case $t in http://*|https://*|mailto:*|\#*) continue ;; esac
        path=${t%%#*}
        n=$((n + 1))
        [ -e "$dir/$path" ] || dead "$md: link '$t' ($dir/$path does not exist)"
    done
done
[ "$n" -gt 100 ] || bad "only $n relative links found: is the link pattern still right?"
[ "$broken" -eq 0 ] && ok "Markdown: $n relative links and images resolve"

# 1b. Their #anchors name a heading of the page linked (GitHub's ids: lower
#     case, punctuation dropped, spaces to '-', "-1", "-2" for repeats), so a
#     heading renamed or moved to docs/history/ cannot leave a dead anchor.
#     Python for the Unicode classes of GitHub's rule.
if command -v python3 >/dev/null 2>&1; then
    out=$(files '*.md' | python3 -c '
import os, re, sys, unicodedata
def slugs(path, cache={}):
    if path not in cache:
        seen, ids, fence = {}, set(), False
        for line in open(path, encoding="utf-8"):
            if line.startswith("```"):
                fence = not fence
            m = None if fence else re.match(r"#{1,6} +(.*?) *#* *$", line)
            if not m:
                continue
            text = re.sub(r"`|\*\*|\[([^]]*)\]\([^)]*\)", lambda g: g.group(1) or "", m.group(1)).lower()
            s = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LMN").replace(" ", "-")
            k = seen.get(s, 0); seen[s] = k + 1
            ids.add(s if k == 0 else "%s-%d" % (s, k))
        cache[path] = ids
    return cache[path]
n = bad = 0
for md in sys.stdin.read().split():
    for t in re.findall(r"\]\(([^)\s]*#[^)\s]*)\)", open(md, encoding="utf-8").read()):
        if re.match(r"(https?|mailto):", t):
            continue
        path, anchor = t.split("#", 1)
        target = os.path.normpath(os.path.join(os.path.dirname(md), path)) if path else md
        if not target.endswith(".md") or not os.path.isfile(target):
            continue
        n += 1
        if anchor not in slugs(target):
            bad += 1
            print("FAIL %s: anchor \"%s\" is no heading of %s" % (md, t, target))
print("ANCHORS %d %d" % (n, bad))
')
    echo "$out" | grep '^FAIL'
    set -- $(echo "$out" | sed -n 's/^ANCHORS //p')
    nfail=$(echo "$out" | grep -c '^FAIL')
    failed=$((failed + nfail))
    if [ "${1:-0}" -lt 20 ]; then
        bad "only ${1:-0} links with anchors found: is the pattern still right?"
    elif [ "$nfail" -eq 0 ]; then
        ok "Markdown: $1 #anchors name headings of their pages"
    fi
else
    skip "#anchors (no python3)"
fi

# 2. docs/... paths named in pages, scripts, benchmarks, tests, the Makefile
#    and source comments (a path followed by a file extension).
n=0; broken=0
for f in $(files '*.md' '*.sh' '*.py' '*.gp' '*.c' '*.h' '*.cu' '*.cuh' 'Makefile' 'mk/*' '.ci/*'); do
    for p in $(grep -oE '(^|[^A-Za-z0-9_./-])docs/[A-Za-z0-9_./-]*\.(md|json|dat|png|log|gp|c|txt)' "$f" |
               sed -E 's|^[^d]*docs/|docs/|' | sort -u); do
        n=$((n + 1))
        case $outputs in *" $p "*) continue ;; esac
        [ -e "$p" ] || dead "$f names $p, which does not exist"
    done
done
[ "$n" -gt 20 ] || bad "only $n docs/ paths found: is the path pattern still right?"
[ "$broken" -eq 0 ] && ok "paths: $n docs/... names in pages, scripts and sources exist"

# 3. The layout: result data under docs/results/, none left at the top of
#    docs/ (where pages are), and an index line for every file there.
stray=$(files 'docs/*' | grep -E '^docs/[^/]*\.(json|dat|log|gp)$')
if [ -z "$stray" ]; then
    ok "docs/: no result data or log at the top (pages only)"
else
    bad "docs/: result data or logs at the top, not in docs/results/ or docs/history/: $(echo $stray)"
fi
if [ -f docs/results/README.md ]; then
    missing=
    for r in $(files 'docs/results/*'); do
        b=${r#docs/results/}
        [ "$b" = README.md ] && continue
        grep -q "](${b})" docs/results/README.md || missing="$missing $b"
    done
    if [ -z "$missing" ]; then
        ok "docs/results/README.md indexes every file of docs/results/"
    else
        bad "docs/results/README.md has no line linking:$missing"
    fi
else
    bad "no docs/results/README.md"
fi
finish
