#!/usr/bin/env bash
# The published figures: builds in release mode and prints each figure beside its target.
# Targets are figures to beat, not gates. Never run by .ci/run (it takes a release build and a
# minute of idling). Usage: tests/figures.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PERCH_CACHE="${PERCH_CACHE:-$HOME/.cache/perch}"
features=(--features sandbox-double,failpoints,discord-rest-proxy)

# Setup (runtime pair, rootfs, Synapse) with the usual target dir; the release builds below get
# their own, so the debug one stays warm.
./.ci/setup
export CARGO_TARGET_DIR="${PERCH_FIGURES_TARGET:-$PERCH_CACHE/target-release}"

synapse_dir="$(mktemp -d "${TMPDIR:-/tmp}/perch-synapse.XXXXXX")"
trap './.ci/synapse stop "$synapse_dir"; rm -rf "$synapse_dir"' EXIT
PERCH_TEST_SYNAPSE_URL="$(./.ci/synapse start "$synapse_dir")"
PERCH_TEST_SYNAPSE_SECRET="$(cat "$synapse_dir/shared-secret")"
export PERCH_TEST_SYNAPSE_URL PERCH_TEST_SYNAPSE_SECRET

echo "perch figures, $(date -u +%Y-%m-%d), $(nproc) cores, $(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"

# The binary users install: the dist profile (fat LTO, one codegen unit, stripped), without the
# test-only features. Only this build is measured: a plain release build for comparison would
# cost another half hour (109.0 MiB stripped on 2026-11-30).
cargo build --locked --profile dist --bin perch
size="$(stat -c %s "$CARGO_TARGET_DIR/dist/perch")"
awk -v bytes="$size" 'BEGIN { printf "stripped dist binary: %.1f MiB (%d bytes); target <= 60 MB\n", bytes / 1048576, bytes }'

# perch run against the fakes and Synapse, in a release build (the namespace double stands in
# for the microVM, which these figures do not touch): start to first answer; idle RSS, PSS, the
# resident breakdown by mapping, the heap, CPU and wakeups over a minute without traffic, with
# three channels and with Telegram and Discord; memory per agent with 1, 10 and 50 agents.
# PERCH_FIGURE_IDLE_SECS shortens the idle minute.
cargo test --locked --release "${features[@]}" --test all -- --ignored --nocapture --test-threads 1 \
  suite::figures:: 2>&1 | grep -oE '(start to first|idle (RSS|heap|CPU|wakeups)|agents per host).*'

# The inbox, per-turn overhead and exec figures.
cargo bench --locked --bench bench "${features[@]}"
cargo bench --locked --bench log_bench "${features[@]}"
