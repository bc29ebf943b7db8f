#!/usr/bin/env bash
# Coverage-guided fuzzing of reprolm with libFuzzer on the stable toolchain (no cargo-fuzz,
# no nightly): libfuzzer-sys builds libFuzzer with the system C++ compiler, and rustc's
# sanitizer-coverage pass instruments the code through -Cpasses/-Cllvm-args.
#
#   bash fuzz/fuzz.sh build                 # build every target (slow: instrumented reprolm)
#   bash fuzz/fuzz.sh run TARGET [SECONDS] [libFuzzer flags...]   # fuzz one target, growing its corpus
#   bash fuzz/fuzz.sh cmin TARGET           # minimize fuzz/corpus/TARGET in place
#   bash fuzz/fuzz.sh replay                # run every corpus file through its target once
#
# Targets: gguf state tokenizer chat sampler grammar (fuzz/src/targets.rs says what each
# does), and request: the server's request bodies, a Python target (fuzz/python/request_fuzz.py)
# run by atheris (`pip install atheris`), with $REPROLM_PYTHON (default python3), which must
# import reprolm (the installed wheel, or PYTHONPATH=python after the dev build) and atheris.
# Everything runs under `nice -n 15` (REPROLM_FUZZ_NICE to change it).
set -euo pipefail
cd "$(dirname "$0")"
TARGETS="gguf state tokenizer chat sampler grammar"
PYTHON="${REPROLM_PYTHON:-python3}"
NICE="nice -n ${REPROLM_FUZZ_NICE:-15}"
TRIPLE="$(rustc -vV | sed -n 's/^host: //p')"
BIN="target/$TRIPLE/release"
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
 -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing"

# Per-target libFuzzer settings: input size limit, per-input timeout (s), memory limits (MB;
# chat templates get more: minijinja lets one operation build a 100 MB string or a 10^8-item
# list, see README "Hostile files").
flags() {
    case "$1" in
        gguf) echo "-max_len=65536 -timeout=10 -rss_limit_mb=4096" ;;
        state) echo "-max_len=100000 -timeout=10 -rss_limit_mb=4096" ;;
        tokenizer) echo "-max_len=4096 -timeout=10 -rss_limit_mb=4096" ;;
        chat) echo "-max_len=16384 -timeout=10 -rss_limit_mb=6144 -malloc_limit_mb=6144" ;;
        sampler) echo "-max_len=1024 -timeout=10 -rss_limit_mb=4096" ;;
        grammar) echo "-max_len=4096 -timeout=10 -rss_limit_mb=4096" ;;
        request) echo "-max_len=16384 -timeout=10 -rss_limit_mb=4096" ;;
        *) echo "unknown target $1" >&2; exit 2 ;;
    esac
}

build() { $NICE cargo build --release --bins --target "$TRIPLE"; }

# The command that runs target $1 (the Python target needs no build). libFuzzer runs its own
# command again for a merge, so the Python target's is an executable script (in target/).
fuzzer() {
    if [ "$1" = request ]; then
        mkdir -p target
        printf '#!/bin/sh\nREPROLM_FUZZ_SELF=%s exec %s %s "$@"\n' "$PWD/target/request-fuzzer" "$PYTHON" \
            "$PWD/python/request_fuzz.py" > target/request-fuzzer
        chmod +x target/request-fuzzer
        echo "target/request-fuzzer"
    else
        build >&2; echo "$BIN/$1"
    fi
}

case "${1:-}" in
    build) build ;;
    run)
        t="$2"; secs="${3:-60}"; shift $(( $# < 3 ? $# : 3 ))
        cmd="$(fuzzer "$t")"
        mkdir -p "corpus/$t" "artifacts/$t"
        # shellcheck disable=SC2046,SC2086
        $NICE $cmd $(flags "$t") -max_total_time="$secs" -print_final_stats=1 \
            -artifact_prefix="artifacts/$t/" "$@" "corpus/$t"
        ;;
    cmin)
        t="$2"; cmd="$(fuzzer "$t")"
        rm -rf "corpus/$t.min"; mkdir -p "corpus/$t.min"
        # shellcheck disable=SC2046,SC2086
        $NICE $cmd $(flags "$t") -merge=1 "corpus/$t.min" "corpus/$t"
        # A merge that kept nothing failed: the corpus stays as it was.
        if [ -z "$(ls -A "corpus/$t.min")" ]; then echo "cmin $t kept no input" >&2; exit 1; fi
        rm -rf "corpus/$t"; mv "corpus/$t.min" "corpus/$t"
        ;;
    replay)
        build
        for t in $TARGETS; do
            # shellcheck disable=SC2046
            $NICE "$BIN/$t" $(flags "$t") -runs=0 "corpus/$t"
        done
        $NICE "$PYTHON" python/request_fuzz.py --replay corpus/request
        ;;
    *) sed -n '2,14p' "$(basename "$0")"; exit 2 ;;
esac
