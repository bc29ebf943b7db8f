#!/usr/bin/env bash
# The fuzzing smoke run of the test command: every corpus file replayed through its target,
# then REPROLM_FUZZ_SMOKE_SECONDS (default 10) seconds of random corpus mutations per target
# (seven targets: a little over a minute). The Rust targets run inside the cargo
# integration-test binary that `cargo test --profile fasttest` already built, so they need no
# fuzzer and no extra build; the server's request target (fuzz/python/request_fuzz.py) runs
# with $REPROLM_PYTHON (default .venv/bin/python, which must import reprolm) and needs no
# atheris. It fails on any panic, broken property, allocation beyond the bound or request
# not answered as the server must, and saves the failing input under target/fuzz-smoke/.
# Coverage-guided runs: `bash fuzz/fuzz.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --profile fasttest --test integration fuzz_corpora -- --include-ignored --test-threads=1 --nocapture
"${REPROLM_PYTHON:-.venv/bin/python}" fuzz/python/request_fuzz.py --smoke "${REPROLM_FUZZ_SMOKE_SECONDS:-10}" fuzz/corpus/request
