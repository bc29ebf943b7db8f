#!/usr/bin/env bash
# The fuzzing smoke run of the test command: every corpus file replayed through its target,
# then REPROLM_FUZZ_SMOKE_SECONDS (default 10) seconds of random corpus mutations per target
# (five targets: about a minute). It runs inside the cargo integration-test binary that
# `cargo test --profile fasttest` already built, so it needs no fuzzer and no extra build;
# it fails on any panic, broken property or allocation beyond the bound, and saves the
# failing input under target/fuzz-smoke/. Coverage-guided runs: `bash fuzz/fuzz.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --profile fasttest --test integration fuzz_corpora -- --include-ignored --test-threads=1 --nocapture
