#!/usr/bin/env bash
# The published figures of the binary users install (the dist profile): its size and what it is
# made of, then `perch run` idle with four channels, with three and with two, and many agents on
# one host, each figure beside its target. Targets are figures to beat, not gates. Never run by
# .ci/run (it takes a dist build, about half an hour, and minutes of idling).
#
# Usage: tests/figures.sh [--bench]
#        tests/figures.sh --symbol-order BINARY [ORDER]
#   --bench         also runs the throughput benchmarks in a release build (another half hour)
#   --symbol-order  only counts the names of ORDER (default src/symbol-order.txt) that BINARY
#                   defines, with the warning below; builds and measures nothing
# PERCH_FIGURE_IDLE_SECS shortens each idle minute, to try the figures quickly.
set -euo pipefail

# symbol_order_check BINARY ORDER: how many of ORDER's names BINARY defines (nm), and a warning
# when fewer than 95% do. The linker skips the others without a word (src/build.rs), and the
# code they named lands wherever it falls, so the figures would be of a binary whose hot code
# is scattered again.
symbol_order_check() (
  export LC_ALL=C
  binary=$1 order=$2
  names="$(grep -v '^#' "$order" | sort -u | grep -c . || true)"
  matched="$(grep -v '^#' "$order" | sort -u |
    comm -12 - <(nm --defined-only "$binary" | awk '{ print $3 }' | sort -u) | grep -c . || true)"
  echo "symbol order: $matched of $names names in $order are in this build (tests/symbol-order.sh writes them again)"
  if (( matched * 100 < names * 95 )); then
    echo "warning: only $((matched * 100 / names))% of the names in $order match symbols of $binary (fewer than 95%): the figures are of a binary whose hot code is no longer placed together; run tests/symbol-order.sh (as root), then this again"
  fi
)

if [[ "${1:-}" == --symbol-order ]]; then
  [[ $# -ge 2 && $# -le 3 ]] || { echo "usage: tests/figures.sh --symbol-order BINARY [ORDER]" >&2; exit 2; }
  symbol_order_check "$2" "${3:-$(dirname "$0")/../src/symbol-order.txt}"
  exit 0
fi

cd "$(dirname "$0")/.."
export PERCH_CACHE="${PERCH_CACHE:-$HOME/.cache/perch}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PERCH_CACHE/target}"
features=(--features sandbox-double,failpoints,discord-rest-proxy)
bench=false
[[ "${1:-}" == --bench ]] && bench=true

# Setup (runtime pair, rootfs, Synapse) and the test harness with the usual target dir; the
# dist build gets its own, so the debug one stays warm.
./.ci/setup
dist_target="${PERCH_FIGURES_TARGET:-$PERCH_CACHE/target-release}"

synapse_dir="$(mktemp -d "${TMPDIR:-/tmp}/perch-synapse.XXXXXX")"
trap './.ci/synapse stop "$synapse_dir"; rm -rf "$synapse_dir"' EXIT
PERCH_TEST_SYNAPSE_URL="$(./.ci/synapse start "$synapse_dir")"
PERCH_TEST_SYNAPSE_SECRET="$(cat "$synapse_dir/shared-secret")"
export PERCH_TEST_SYNAPSE_URL PERCH_TEST_SYNAPSE_SECRET

echo "perch figures, $(date -u +%Y-%m-%d), $(git rev-parse --short HEAD), $(nproc) cores, $(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"

# The binary users install: the dist profile without the test-only features, built by the
# command deploy/install.sh and README's install run. It keeps its symbols, which cargo-bloat
# attributes and the symbol order names; the figures are of the binary stripped of them (the
# symbols are in no loaded segment, so what runs and what is resident is the same).
echo "measured binary: cargo build --profile dist --locked --bin perch (what deploy/install.sh and README's install build), then strip --strip-all"
CARGO_TARGET_DIR="$dist_target" cargo build --profile dist --locked --bin perch
strip --strip-all -o "$dist_target/dist/perch.stripped" "$dist_target/dist/perch"
symbol_order_check "$dist_target/dist/perch" src/symbol-order.txt
binary="$dist_target/dist/perch.stripped"
size="$(stat -c %s "$binary")"
awk -v bytes="$size" 'BEGIN { printf "stripped dist binary: %.1f MiB (%d bytes); target <= 60 MB\n", bytes / 1048576, bytes }'
size -A -d "$binary" | awk '$1 ~ /^\.(text|rodata|eh_frame|eh_frame_hdr|gcc_except_table|data\.rel\.ro|rela\.dyn|data|bss)$/ {
  printf "stripped dist binary, section %s: %.1f MiB\n", $1, $2 / 1048576 }'

# Machine code by crate. cargo-bloat is installed under the cache on first use.
if ! [[ -x "$PERCH_CACHE/tools/bin/cargo-bloat" ]]; then
  cargo install --locked --root "$PERCH_CACHE/tools" cargo-bloat
fi
PATH="$PERCH_CACHE/tools/bin:$PATH" CARGO_TARGET_DIR="$dist_target" \
  cargo bloat --locked --profile dist --bin perch --crates -n 25 2>/dev/null |
  sed 's/^/machine code by crate (cargo bloat --crates): /'

# perch run against the fakes and Synapse (the stand-in runtime's home satisfies the start's
# runtime check; no figure boots a machine): start to first answer; idle RSS, PSS, the resident
# breakdown by mapping, the heap, CPU and wakeups over a minute without traffic, with four
# channels (Telegram, Discord, Matrix, Slack), with three (Slack aside) and with Telegram and
# Discord; memory per agent with 1, 10 and 50 agents. The harness is the ordinary test build;
# what it measures is the dist binary.
PERCH_FIGURES_BIN="$binary" cargo test --locked "${features[@]}" --test all -- --ignored --nocapture \
  --test-threads 1 suite::figures:: 2>&1 | grep -oE '(figures of|start to first|idle (RSS|heap|CPU|wakeups|working set)|agents per host).*'

# The inbox, per-turn overhead and exec figures, in a release build.
if $bench; then
  CARGO_TARGET_DIR="$dist_target" cargo bench --locked --bench bench "${features[@]}"
  CARGO_TARGET_DIR="$dist_target" cargo bench --locked --bench log_bench "${features[@]}"
fi
