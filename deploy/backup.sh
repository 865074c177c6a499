#!/bin/sh
# Backs up one agent: its directory (.perch/ included: journals, lane logs, channel stores,
# pairings) and its environment file, as one tar archive. A running instance is stopped for
# the copy (it drains: runs in progress finish and every journal is synced) and started again,
# so the archive holds one moment of the agent, never journals from different moments.
# Messages sent meanwhile wait on the platforms and are fetched on start. The agent's own user
# reads its directory; root writes the archive, mode 0600: it holds the agent's tokens.
# Restore with deploy/restore.sh. See deploy/README.md.
set -eu

usage() {
	cat <<'EOF2'
usage: deploy/backup.sh NAME FILE

Writes the agent NAME (/var/lib/perch/agents/NAME and /etc/perch/NAME.env) into the tar
archive FILE (mode 0600), stopping perch@NAME for the copy if it runs and starting it again.
Run it as root. The archive holds the agent's tokens and keys: keep it encrypted.

  -h, --help    this help
EOF2
}

fail() {
	echo "backup: $*" >&2
	exit 1
}

case "${1:-}" in
-h | --help) usage; exit 0 ;;
-*) usage >&2; fail "unknown option $1" ;;
esac
[ $# -eq 2 ] || { usage >&2; fail "name the agent and the archive"; }
[ "$(id -u)" = 0 ] || fail "run it as root (sudo deploy/backup.sh ...)"
name=$1
file=$2
case "$name" in *[!A-Za-z0-9_-]* | -* | "") fail "$name is not an agent's name" ;; esac
dir=/var/lib/perch/agents/$name
user=perch-$name
[ -d "$dir" ] && [ ! -L "$dir" ] || fail "$dir is not an agent's directory"
getent passwd "$user" >/dev/null || fail "the user $user does not exist; deploy/install.sh --agent $name makes it"
[ ! -e "$file" ] || fail "$file exists; name a new file"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
running=
if [ -d /run/systemd/system ] && systemctl is-active --quiet "perch@$name"; then
	running=1
	systemctl stop "perch@$name" || fail "perch@$name did not stop"
	echo "  stopped    perch@$name"
fi
started=$(date +%s)
# The agent's user reads its own directory: root follows nothing in it.
runuser -u "$user" -- tar -C /var/lib/perch/agents -cf - "$name" >"$stage/agent.tar" ||
	{ [ -z "$running" ] || systemctl start "perch@$name"; fail "reading $dir as $user failed"; }
if [ -n "$running" ]; then
	systemctl start "perch@$name" || fail "perch@$name did not start again: journalctl -u perch@$name says why"
	echo "  started    perch@$name (stopped for $(($(date +%s) - started)) s)"
fi
if [ -f "/etc/perch/$name.env" ]; then
	cp "/etc/perch/$name.env" "$stage/$name.env"
else
	: >"$stage/$name.env"
fi
(umask 077 && tar -C "$stage" -cf "$file.partial" agent.tar "$name.env") || fail "writing $file failed"
mv "$file.partial" "$file"
echo "backed up   $name into $file ($(stat -c %s "$file") bytes; it holds the agent's tokens: keep it encrypted)"
