#!/bin/sh
# Restores an agent from deploy/backup.sh's archive onto this machine: its user, directory,
# microsandbox home and environment file made by deploy/install.sh --agent, the directory
# unpacked as the agent's own user (so it owns every file and can write nothing outside its
# directory), the environment file written by root, 0600. The agent's VM is created afresh on
# its first command (nothing durable lives on the VM's disk). See deploy/README.md.
set -eu

usage() {
	cat <<'EOF2'
usage: deploy/restore.sh FILE NAME [INSTALL OPTIONS]

Restores the agent NAME from FILE (made by deploy/backup.sh) into /var/lib/perch/agents/NAME,
which must be empty or absent, and /etc/perch/NAME.env. Runs deploy/install.sh --agent NAME
with INSTALL OPTIONS first (for example --binary /usr/local/bin/perch --no-image). Run it as
root, with perch@NAME stopped; start it afterwards with systemctl start perch@NAME.

  -h, --help    this help
EOF2
}

fail() {
	echo "restore: $*" >&2
	exit 1
}

case "${1:-}" in
-h | --help) usage; exit 0 ;;
-*) usage >&2; fail "unknown option $1" ;;
esac
[ $# -ge 2 ] || { usage >&2; fail "name the archive and the agent"; }
[ "$(id -u)" = 0 ] || fail "run it as root (sudo deploy/restore.sh ...)"
file=$1
name=$2
shift 2
case "$name" in *[!A-Za-z0-9_-]* | -* | "") fail "$name is not an agent's name" ;; esac
here=$(cd "$(dirname "$0")" && pwd)
dir=/var/lib/perch/agents/$name
user=perch-$name
[ -f "$file" ] || fail "$file is not a file"
if [ -d /run/systemd/system ] && systemctl is-active --quiet "perch@$name"; then
	fail "perch@$name is running; stop it first"
fi
if [ -d "$dir" ] && [ -n "$(ls -A "$dir")" ]; then
	fail "$dir is not empty; move it aside first"
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
tar -C "$stage" -xf "$file" agent.tar "$name.env" || fail "$file is not an archive of the agent $name"
"$here/install.sh" "$@" --agent "$name" || fail "deploy/install.sh --agent $name failed"
# The agent's user unpacks: whatever the archive says, it writes only where that user may.
chmod 0755 "$stage"
chmod 0644 "$stage/agent.tar"
runuser -u "$user" -- tar -C /var/lib/perch/agents --no-same-owner -xpf "$stage/agent.tar" "$name" ||
	fail "unpacking $name as $user failed"
# The user's tar cannot keep the directory set-group-id for the group perch (it is not in it);
# agents/ is root's, so the name is still the directory the installer made.
[ ! -L "$dir" ] || fail "$dir became a symbolic link"
chmod 2750 "$dir"
(umask 077 && cp "$stage/$name.env" "/etc/perch/$name.env.partial") && mv "/etc/perch/$name.env.partial" "/etc/perch/$name.env"
echo "restored    $name into $dir (as $user) and /etc/perch/$name.env; start it: systemctl start perch@$name"
