#!/bin/sh
# Upgrades perch in place: stops the running perch@ instances (each drains: runs in progress
# finish, nothing is lost), runs deploy/install.sh with the arguments given and --agent for
# every agent directory (which replaces the binary and the runtime pair, and moves an agent of
# an older install to its own user with perch chown), then starts the instances that were
# running and waits until each is ready. New binaries read old files: there is no migration
# step. Messages sent meanwhile wait on the platforms and are fetched on start. See
# deploy/README.md.
set -eu

usage() {
	cat <<'EOF'
usage: deploy/upgrade.sh [INSTALL OPTIONS]

Stops the running perch@ instances, runs deploy/install.sh with INSTALL OPTIONS (for example
--binary target/dist/perch, --runtime-from DIR) and --agent NAME for every directory in
/var/lib/perch/agents, and starts again the instances that were running. Run it as root.

  -h, --help    this help
EOF
}

fail() {
	echo "upgrade: $*" >&2
	exit 1
}

case "${1:-}" in -h | --help) usage; exit 0 ;; esac
here=$(cd "$(dirname "$0")" && pwd)
# The installer's own check of its options, before anything is stopped.
plan_errors=$("$here/install.sh" --plan "$@" 2>&1 >/dev/null) ||
	fail "$(printf '%s\n' "$plan_errors" | tail -n 1 | sed 's/^install: //')"
[ "$(id -u)" = 0 ] || fail "run it as root (sudo deploy/upgrade.sh ...)"
[ -d /run/systemd/system ] || fail "systemd is not running; use deploy/install.sh"
agents=/var/lib/perch/agents

set -- "$@"
for dir in "$agents"/*; do
	[ -d "$dir" ] && [ ! -L "$dir" ] || continue
	set -- "$@" --agent "$(basename "$dir")"
done

running=$(systemctl list-units 'perch@*.service' --state=active,activating,reloading --plain --no-legend |
	awk '{printf "%s%s", sep, $1; sep = " "}')
echo "perch: upgrading (running: ${running:-none})"
if [ -n "$running" ]; then
	# shellcheck disable=SC2086 # one word per unit
	systemctl stop $running || fail "stopping $running failed; nothing was installed"
	echo "  stopped    $running"
fi

"$here/install.sh" "$@" || {
	[ -z "$running" ] || echo "upgrade: the install failed; starting the instances again on what is installed" >&2
	# shellcheck disable=SC2086 # one word per unit
	[ -z "$running" ] || systemctl start $running
	fail "deploy/install.sh failed"
}

if [ -n "$running" ]; then
	# Type=notify: each start returns once that instance is ready.
	# shellcheck disable=SC2086 # one word per unit
	systemctl start $running || fail "starting $running failed: journalctl -u 'perch@*' says why"
	echo "  started    $running"
fi
echo "upgraded"
