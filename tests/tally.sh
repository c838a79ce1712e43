# tally.sh - the tallies of the shell tests that stand alone (sourced; POSIX
# sh; the serve tests have theirs in serve_lib.sh): ok, bad, skip, and
# finish, which prints the line tests/run.sh reads ($name: N passed, N
# failed, N skipped) and exits non-zero when a check failed.
passed=0; failed=0; skipped=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
bad() { echo "FAIL $1"; failed=$((failed + 1)); }
skip() { echo "skip: $1"; skipped=$((skipped + 1)); }
finish() { echo "$name: $passed passed, $failed failed, $skipped skipped"; [ "$failed" -eq 0 ]; exit $?; }
