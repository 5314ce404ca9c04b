#!/usr/bin/env bash
# Builds the wire fuzzer with clang and runs it for PUSH_FUZZ_SECONDS (600 by default) from
# the kept corpus (tests/dist/fuzz_corpus/). Fails on any finding (the crashing input is
# left in the build folder, named by libFuzzer). With --merge, folds what it found into the
# kept corpus (the inputs that add coverage, minimized).
#   tests/dist/fuzz/run.sh BUILD_DIR [--merge]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
corpus=$here/../fuzz_corpus
build=${1:?usage: run.sh BUILD_DIR [--merge]}
merge=${2:-}
seconds=${PUSH_FUZZ_SECONDS:-600}
command -v clang++ >/dev/null || { echo "run.sh: clang++ is needed (apt-get install clang)" >&2; exit 1; }
cmake -S "$here" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  ${CMAKE_PREFIX_PATH:+-DCMAKE_PREFIX_PATH="$CMAKE_PREFIX_PATH"} >/dev/null
cmake --build "$build"
found=$build/found
mkdir -p "$found"
cd "$build"
# Each input at most 1 s and 2 GiB; one job on one core (CI has two).
./push_fuzz_wire -max_total_time="$seconds" -timeout=1 -rss_limit_mb=2048 -print_final_stats=1 "$found" "$corpus"
if [ "$merge" = --merge ]; then
  ./push_fuzz_wire -merge=1 "$corpus" "$found"
fi
