#!/usr/bin/env bash
# Writes src/symbol-order.txt, the order in which the linker places perch's hottest code: the
# functions and constants a dist build touches while it starts, answers a message, connects
# two, three and four channels and idles, most common first. Run it after a toolchain or
# dependency upgrade, or when tests/figures.sh warns that fewer than 95% of the names match.
#
# It needs root: it turns the readahead of the device holding the build off while it measures
# (and puts it back), so that what a process has resident is what it touched. It takes two dist
# links and the figures' start and idle runs: about three quarters of an hour on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
export PERCH_CACHE="${PERCH_CACHE:-$HOME/.cache/perch}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PERCH_CACHE/target}"
features=(--features sandbox-double,failpoints,discord-rest-proxy)
[[ "$(id -u)" == 0 ]] || { echo "tests/symbol-order.sh: needs root (it sets the device's readahead)" >&2; exit 1; }
./.ci/setup
dist_target="${PERCH_FIGURES_TARGET:-$PERCH_CACHE/target-release}"

# The dist build with every function aligned to a page, so a touched page names one function.
# Only the final crate gets the option, and cargo keeps its symbol names (arguments after `--`
# do not enter the hash in them), so the names are the ordinary dist build's.
CARGO_TARGET_DIR="$dist_target" cargo rustc --locked --profile dist --bin perch -- \
  -C llvm-args=-align-all-functions=12
aligned="$dist_target/dist/perch.aligned"
cp "$dist_target/dist/perch" "$aligned"

synapse_dir="$(mktemp -d "${TMPDIR:-/tmp}/perch-synapse.XXXXXX")"
readahead=
sampler=
restore() {
  [[ -z "$sampler" ]] || kill "$sampler" 2>/dev/null || true
  [[ -z "$readahead" ]] || echo "$readahead" > "$queue/read_ahead_kb"
  ./.ci/synapse stop "$synapse_dir"
  rm -rf "$synapse_dir"
}
trap restore EXIT
PERCH_TEST_SYNAPSE_URL="$(./.ci/synapse start "$synapse_dir")"
PERCH_TEST_SYNAPSE_SECRET="$(cat "$synapse_dir/shared-secret")"
export PERCH_TEST_SYNAPSE_URL PERCH_TEST_SYNAPSE_SECRET

device="/sys/dev/block/$(stat -c '%Hd:%Ld' "$aligned")"
queue="$device/queue"
[[ -e "$queue/read_ahead_kb" ]] || queue="$device/../queue"
readahead="$(cat "$queue/read_ahead_kb")"
echo 0 > "$queue/read_ahead_kb"
echo "readahead of $(realpath "$queue/..") off for the measurement (was $readahead KiB)"

sample="$dist_target/dist/symbol-order.sample.json"
cargo test --locked "${features[@]}" --test all --no-run
python3 tests/symbol-order.py sample "$aligned" "$sample" &
sampler=$!
for figure in figure_start_to_first_message_answered figure_idle_with_telegram_and_discord_connected \
  figure_idle_with_three_channels_connected figure_idle_with_four_channels_connected; do
  PERCH_FIGURES_BIN="$aligned" cargo test --locked "${features[@]}" --test all -- --ignored \
    --exact "suite::figures::$figure" >/dev/null
done
kill "$sampler"
wait "$sampler"
sampler=

python3 tests/symbol-order.py write "$aligned" "$sample" src/symbol-order.txt
echo "wrote src/symbol-order.txt; tests/figures.sh builds and measures with it"
