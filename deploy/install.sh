#!/bin/sh
# Installs perch as a systemd service: the binary, the user perch, the perch@.service template,
# the udev rule for /dev/kvm, the directories under /etc/perch and /var/lib/perch, the
# microsandbox runtime pair and the default image. Idempotent: every step says what it did,
# and a second run says `unchanged` (or `skipped`) for each and `nothing changed` at the end.
# See deploy/README.md.
set -eu
umask 022

usage() {
	cat <<'EOF'
usage: deploy/install.sh [OPTIONS]

Installs perch as a service, one instance per agent directory (perch@NAME runs
/var/lib/perch/agents/NAME). Run it as root from a clone of perch. With DESTDIR set, everything
is staged under that directory instead: no root needed, no user, no owners, no image, no
systemd.

  --binary PATH        install this perch binary instead of building one with
                       `cargo build --release --locked` (build as yourself, then
                       `sudo deploy/install.sh --binary target/release/perch`)
  --runtime-from DIR   copy the microsandbox runtime pair (msb, libkrunfw) from this
                       microsandbox home instead of the PyPI wheel
  --no-runtime         do not install the runtime pair into /var/lib/perch/msb
  --no-image           do not build the default image (perch image build)
  --minimal-image      build the image with `perch image build --minimal`
  --rebuild-image      build the image even if one is built (perch image build --rebuild)
  --no-user            do not create the user perch and the group kvm (they must exist)
  --no-systemd         do not run systemctl daemon-reload, udevadm control --reload and
                       udevadm trigger
  -h, --help           this help

Environment: DESTDIR (stage into this directory), CARGO_TARGET_DIR (where cargo builds).
EOF
}

fail() {
	echo "install: $*" >&2
	exit 1
}

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
DESTDIR=${DESTDIR:-}
DESTDIR=${DESTDIR%/}

binary=
runtime_from=
no_runtime=
no_image=
minimal_image=
rebuild_image=
no_user=
no_systemd=
while [ $# -gt 0 ]; do
	case "$1" in
	--binary) [ $# -ge 2 ] || fail "--binary needs a path"; binary=$2; shift 2 ;;
	--binary=*) binary=${1#--binary=}; shift ;;
	--runtime-from) [ $# -ge 2 ] || fail "--runtime-from needs a directory"; runtime_from=$2; shift 2 ;;
	--runtime-from=*) runtime_from=${1#--runtime-from=}; shift ;;
	--no-runtime) no_runtime=1; shift ;;
	--no-image) no_image=1; shift ;;
	--minimal-image) minimal_image=1; shift ;;
	--rebuild-image) rebuild_image=1; shift ;;
	--no-user) no_user=1; shift ;;
	--no-systemd) no_systemd=1; shift ;;
	-h | --help) usage; exit 0 ;;
	*) usage >&2; fail "unknown argument $1" ;;
	esac
done
[ -z "$runtime_from" ] || [ -z "$no_runtime" ] || fail "--runtime-from and --no-runtime exclude each other"

if [ -z "$DESTDIR" ] && [ "$(id -u)" != 0 ]; then
	fail "run it as root (sudo deploy/install.sh ...), or set DESTDIR to stage the files into a directory"
fi

bin=/usr/local/bin/perch
unit=/etc/systemd/system/perch@.service
rule=/etc/udev/rules.d/99-perch-kvm.rules
etc=/etc/perch
state=/var/lib/perch
agents=$state/agents
msb_home=$state/msb
cache=$state/cache

changes=0
report() {
	printf '  %-10s %s\n' "$1" "$2"
	case "$1" in unchanged | skipped) ;; *) changes=$((changes + 1)) ;; esac
}

mode_of() { printf '%04d' "$(stat -c %a "$1")"; }
owner_of() { stat -c %U:%G "$1"; }

# Owners are set only on a real install: a staged tree belongs to whoever stages it.
owner() { if [ -z "$DESTDIR" ]; then echo "$1"; fi; }

# ensure_dir PATH MODE [OWNER]
ensure_dir() {
	path=$DESTDIR$1
	want_owner=$(owner "${3:-}")
	if [ ! -d "$path" ]; then
		mkdir -p "$path"
		chmod "$2" "$path"
		[ -z "$want_owner" ] || chown "$want_owner" "$path"
		report created "$1/ ($2${want_owner:+ $want_owner})"
		return
	fi
	fixed=
	if [ "$(mode_of "$path")" != "$2" ]; then
		chmod "$2" "$path"
		fixed="mode $2"
	fi
	if [ -n "$want_owner" ] && [ "$(owner_of "$path")" != "$want_owner" ]; then
		chown "$want_owner" "$path"
		fixed="${fixed:+$fixed, }owner $want_owner"
	fi
	if [ -n "$fixed" ]; then report fixed "$1/ ($fixed)"; else report unchanged "$1/"; fi
}

# install_file SOURCE PATH MODE [OWNER]: the file is replaced by a rename, so a running perch
# keeps the binary it started with.
install_file() {
	path=$DESTDIR$2
	want_owner=$(owner "${4:-}")
	mkdir -p "$(dirname "$path")"
	if [ -f "$path" ] && [ ! -L "$path" ] && cmp -s "$1" "$path"; then
		fixed=
		if [ "$(mode_of "$path")" != "$3" ]; then
			chmod "$3" "$path"
			fixed="mode $3"
		fi
		if [ -n "$want_owner" ] && [ "$(owner_of "$path")" != "$want_owner" ]; then
			chown "$want_owner" "$path"
			fixed="${fixed:+$fixed, }owner $want_owner"
		fi
		if [ -n "$fixed" ]; then report fixed "$2 ($fixed)"; else report unchanged "$2"; fi
		return
	fi
	if [ -e "$path" ] || [ -L "$path" ]; then verb=updated; else verb=installed; fi
	partial="$path.partial.$$"
	cp "$1" "$partial"
	chmod "$3" "$partial"
	[ -z "$want_owner" ] || chown "$want_owner" "$partial"
	mv -f "$partial" "$path"
	report "$verb" "$2"
}

echo "perch: installing into ${DESTDIR:-/}"

# 1. The binary.
if [ -z "$binary" ]; then
	command -v cargo >/dev/null ||
		fail "cargo is not on PATH; build as yourself (cargo build --release --locked) and pass --binary target/release/perch"
	echo "  building   cargo build --release --locked (in $repo)"
	(cd "$repo" && cargo build --release --locked --quiet) || fail "cargo build failed"
	binary=${CARGO_TARGET_DIR:-$repo/target}/release/perch
fi
if [ ! -f "$binary" ] || [ ! -x "$binary" ]; then fail "$binary is not an executable file"; fi
install_file "$binary" "$bin" 0755 root:root
binary_changed=$changes

# 2. The user perch and the group kvm, which owns /dev/kvm (99-perch-kvm.rules).
if [ -n "$DESTDIR" ]; then
	report skipped "user perch and group kvm (DESTDIR is set)"
elif [ -n "$no_user" ]; then
	getent passwd perch >/dev/null || fail "the user perch does not exist; create it or drop --no-user"
	getent group kvm >/dev/null || fail "the group kvm does not exist; create it or drop --no-user"
	report skipped "user perch and group kvm (--no-user)"
else
	if getent group kvm >/dev/null; then
		report unchanged "group kvm"
	else
		groupadd --system kvm
		report created "group kvm"
	fi
	if getent passwd perch >/dev/null; then
		report unchanged "user perch"
	else
		nologin=$(command -v nologin || echo /usr/sbin/nologin)
		useradd --system --user-group --home-dir "$state" --no-create-home \
			--shell "$nologin" --comment "perch agents" perch
		report created "user perch (home $state, no login)"
	fi
	if id -nG perch | tr ' ' '\n' | grep -qx kvm; then
		report unchanged "user perch in group kvm"
	else
		usermod --append --groups kvm perch
		report added "user perch to group kvm"
	fi
fi

# 3. Directories. /etc/perch holds the agents' tokens and keys (NAME.env, 0600) and is read by
# systemd as root only; /var/lib/perch is perch's: the agents, the microsandbox home (runtime
# database, VM disks, its TLS CA key) and the cache (images).
ensure_dir "$etc" 0700 root:root
ensure_dir "$state" 0750 root:perch
ensure_dir "$agents" 0750 perch:perch
ensure_dir "$msb_home" 0700 perch:perch
ensure_dir "$cache" 0750 perch:perch

# 4. The unit, the udev rule, the example environment file.
before_unit=$changes
install_file "$here/perch@.service" "$unit" 0644 root:root
unit_changed=$((changes > before_unit))
before_rule=$changes
install_file "$here/99-perch-kvm.rules" "$rule" 0644 root:root
rule_changed=$((changes > before_rule))
install_file "$here/env.example" "$etc/env.example" 0600 root:root

# 5. The runtime pair, msb and libkrunfw, in the microsandbox home; bin/ and lib/ stay root's,
# so the user perch cannot replace what root runs during an install.
if [ -n "$no_runtime" ]; then
	report skipped "runtime (--no-runtime)"
else
	set -- --wheels "$DESTDIR$cache/wheels"
	[ -z "$runtime_from" ] || set -- --from "$runtime_from"
	line=$("$here/install-runtime.sh" "$@" "$DESTDIR$msb_home") || fail "the runtime pair was not installed"
	echo "$line"
	case "$line" in *unchanged*) ;; *) changes=$((changes + 1)) ;; esac
fi

# 6. The default image, built with debootstrap as root and loaded into the microsandbox home.
if [ -n "$no_image" ]; then
	report skipped "image perch:default (--no-image)"
elif [ -n "$DESTDIR" ]; then
	report skipped "image perch:default (DESTDIR is set; run perch image build on the machine)"
elif [ -f "$cache/images/default.json" ] && [ -z "$rebuild_image" ]; then
	report unchanged "image perch:default (built; --rebuild-image builds it again)"
else
	set -- image build
	[ -z "$minimal_image" ] || set -- "$@" --minimal
	[ -z "$rebuild_image" ] || set -- "$@" --rebuild
	echo "  building   perch $*"
	PERCH_CACHE=$cache MSB_HOME=$msb_home "$bin" "$@" || fail "perch $* failed; fix it, or pass --no-image"
	report built "image perch:default"
fi

# 7. Owners: what root created in the microsandbox home (its database, layers, TLS CA) belongs
# to perch, except bin/ and lib/.
if [ -n "$DESTDIR" ]; then
	report skipped "owners under $msb_home (DESTDIR is set)"
else
	foreign=$(find "$msb_home" -mindepth 1 \( -path "$msb_home/bin" -o -path "$msb_home/lib" \) -prune \
		-o \( ! -user perch -o ! -group perch \) -print | wc -l)
	if [ "$foreign" -eq 0 ]; then
		report unchanged "owners under $msb_home"
	else
		find "$msb_home" -mindepth 1 \( -path "$msb_home/bin" -o -path "$msb_home/lib" \) -prune \
			-o \( ! -user perch -o ! -group perch \) -exec chown -h perch:perch {} +
		report fixed "owners under $msb_home ($foreign paths now perch:perch)"
	fi
fi

# 8. systemd and udev.
if [ -n "$no_systemd" ]; then
	report skipped "systemd and udev reload (--no-systemd)"
elif [ -n "$DESTDIR" ]; then
	report skipped "systemd and udev reload (DESTDIR is set)"
else
	if [ ! -d /run/systemd/system ]; then
		report skipped "systemctl daemon-reload (systemd is not running)"
	elif [ "$unit_changed" = 1 ]; then
		systemctl daemon-reload
		report reloaded "systemd (systemctl daemon-reload)"
	else
		report unchanged "systemd units"
	fi
	if ! command -v udevadm >/dev/null; then
		report skipped "udev reload (udevadm is not installed)"
	elif [ "$rule_changed" = 1 ] || { [ -e /dev/kvm ] && [ "$(stat -c %G:%a /dev/kvm)" != kvm:660 ]; }; then
		udevadm control --reload
		udevadm trigger --subsystem-match=misc --sysname-match=kvm
		udevadm settle || true
		report reloaded "udev rules (udevadm control --reload, udevadm trigger)"
	else
		report unchanged "udev rules"
	fi
	if [ -e /dev/kvm ]; then
		kvm=$(stat -c '%U:%G %a' /dev/kvm)
		[ "$kvm" = "root:kvm 660" ] ||
			echo "  warning    /dev/kvm is $kvm, not root:kvm 660; check the udev rules in /etc/udev/rules.d" >&2
	else
		echo "  warning    /dev/kvm does not exist: this machine cannot boot microVMs (perch doctor says why)" >&2
	fi
	if [ -d /run/systemd/system ] && [ "$binary_changed" -gt 0 ]; then
		running=$(systemctl list-units 'perch@*.service' --state=active --plain --no-legend 2>/dev/null | awk '{print $1}' | tr '\n' ' ')
		[ -z "$running" ] || echo "  note       running instances keep the old binary until restarted: systemctl restart $running"
	fi
fi

if [ "$changes" -eq 0 ]; then
	echo "nothing changed"
else
	echo "$changes changed"
fi
