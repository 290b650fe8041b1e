#!/usr/bin/env bash
# Prints what failed in a go test output file: the failing tests, their
# assertion lines (the controllers' logs left out), panics, races, build
# errors and the failing packages. make test calls it last, so that a CI
# log cut to its tail still says which test failed and why.
set -euo pipefail
log=${1:?usage: hack/test-failures.sh GO-TEST-OUTPUT}
echo "=== what failed (from $log) ==="
grep -E -e '--- FAIL' -e '^[[:space:]]+[A-Za-z0-9_.-]+\.go:[0-9]+: ' -e 'panic:' -e 'WARNING: DATA RACE' \
	-e '^FAIL[[:space:]]' -e 'test timed out' -e '^[^[:space:]]+\.go:[0-9]+:[0-9]+: ' "$log" |
	grep -v -E '^[[:space:]]+logwriter\.go:[0-9]+: ' |
	cut -c1-400 | tail -n 120 || true
