#!/bin/sh
# Removes what deploy/install.sh installed: the binary, the runtime pair, the unit and the instances enabled from
# it, the udev rule and the example environment file. The agents and everything they own stay
# (/var/lib/perch: the agents, the microsandbox home with their VM disks, the cache; /etc/perch:
# their tokens and keys; drop-ins in /etc/systemd/system/perch@.service.d; the agents' users perch-NAME),
# unless --purge. Idempotent: a second run says `absent` for each step and `nothing changed`.
set -eu

usage() {
	cat <<'EOF'
usage: deploy/uninstall.sh [OPTIONS]

Stops every perch@ instance, then removes /usr/local/bin/perch, the microsandbox runtime in
/usr/local/lib/perch, perch@.service and the instances enabled from it, 99-perch-kvm.rules and /etc/perch/env.example. Keeps
/var/lib/perch (agents, microsandbox home, cache), /etc/perch (tokens and keys), the unit's
drop-ins and the agents' users perch-NAME. With DESTDIR set, works on that staged tree instead.

  --purge        also remove /var/lib/perch, /etc/perch, the drop-ins, the users perch-NAME (and an older
                 install's perch) and the group perch
                 (the group kvm stays: other users of KVM may rely on it)
  --no-systemd   do not stop instances or run systemctl daemon-reload and udevadm
  -h, --help     this help
EOF
}

fail() {
	echo "uninstall: $*" >&2
	exit 1
}

DESTDIR=${DESTDIR:-}
DESTDIR=${DESTDIR%/}
purge=
no_systemd=
while [ $# -gt 0 ]; do
	case "$1" in
	--purge) purge=1; shift ;;
	--no-systemd) no_systemd=1; shift ;;
	-h | --help) usage; exit 0 ;;
	*) usage >&2; fail "unknown argument $1" ;;
	esac
done

if [ -z "$DESTDIR" ] && [ "$(id -u)" != 0 ]; then
	fail "run it as root (sudo deploy/uninstall.sh ...), or set DESTDIR to work on a staged tree"
fi

systemd=
if [ -n "$no_systemd" ]; then
	why="--no-systemd"
elif [ -n "$DESTDIR" ]; then
	why="DESTDIR is set"
elif [ ! -d /run/systemd/system ]; then
	why="systemd is not running"
else
	systemd=1
fi

changes=0
report() {
	printf '  %-10s %s\n' "$1" "$2"
	case "$1" in absent | kept | skipped) ;; *) changes=$((changes + 1)) ;; esac
}

remove() {
	if [ -e "$DESTDIR$1" ] || [ -L "$DESTDIR$1" ]; then
		rm -rf "$DESTDIR$1"
		report removed "$1"
	else
		report absent "$1"
	fi
}

echo "perch: uninstalling from ${DESTDIR:-/}"

# 1. Stop the instances, so nothing runs a binary that is about to go.
if [ -n "$systemd" ]; then
	running=$(systemctl list-units 'perch@*.service' --all --state=active,activating,deactivating,reloading --plain --no-legend 2>/dev/null | awk '{print $1}')
	if [ -z "$running" ]; then
		report absent "running perch@ instances"
	else
		for instance in $running; do
			systemctl stop "$instance"
			report stopped "$instance"
		done
	fi
else
	report skipped "stopping perch@ instances ($why)"
fi

# 2. The instances enabled from the template (their .wants/ links), then the files.
found=
for link in "$DESTDIR"/etc/systemd/system/*.wants/perch@*.service; do
	[ -L "$link" ] || [ -e "$link" ] || continue
	found=1
	remove "${link#"$DESTDIR"}"
done
[ -n "$found" ] || report absent "enabled perch@ instances"
remove /usr/local/bin/perch
remove /usr/local/lib/perch
remove /etc/systemd/system/perch@.service
remove /etc/udev/rules.d/99-perch-kvm.rules
remove /etc/perch/env.example

# 3. What the agents own.
if [ -n "$purge" ]; then
	remove /etc/systemd/system/perch@.service.d
	remove /var/lib/perch
	remove /etc/perch
	if [ -n "$DESTDIR" ]; then
		report skipped "users perch-NAME and perch (DESTDIR is set)"
	else
		users=$(getent passwd | cut -d: -f1 | grep -E '^perch(-[A-Za-z0-9_-]+)?$' || true)
		[ -n "$users" ] || report absent "users perch-NAME and perch"
		for user in $users; do
			userdel "$user"
			report removed "user $user"
		done
		if getent group perch >/dev/null; then
			groupdel perch
			report removed "group perch"
		fi
	fi
else
	for kept in /var/lib/perch/agents /var/lib/perch/msb /var/lib/perch/cache /etc/perch /etc/systemd/system/perch@.service.d; do
		if [ -e "$DESTDIR$kept" ]; then report kept "$kept (--purge removes it)"; fi
	done
	if [ -z "$DESTDIR" ]; then
		for user in $(getent passwd | cut -d: -f1 | grep -E '^perch(-[A-Za-z0-9_-]+)?$' || true); do
			report kept "user $user (--purge removes it)"
		done
	fi
fi

# 4. systemd and udev.
if [ -z "$systemd" ]; then
	report skipped "systemd and udev reload ($why)"
elif [ "$changes" -eq 0 ]; then
	report skipped "systemd and udev reload (nothing was removed)"
else
	systemctl daemon-reload
	systemctl reset-failed 'perch@*.service' 2>/dev/null || true
	report reloaded "systemd (systemctl daemon-reload)"
	if command -v udevadm >/dev/null; then
		udevadm control --reload
		udevadm trigger --subsystem-match=misc --sysname-match=kvm
		report reloaded "udev rules (/dev/kvm gets the distribution's owner and mode back)"
	fi
fi

if [ "$changes" -eq 0 ]; then
	echo "nothing changed"
else
	echo "$changes changed"
fi
