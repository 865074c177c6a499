#!/bin/sh
# Installs perch as a systemd service: the binary, the operators' group perch, the
# perch@.service template, the udev rule for /dev/kvm, the directories under /etc/perch and
# /var/lib/perch, the microsandbox runtime pair, the system's CA certificates (on Debian-like
# systems, when missing) and the default image; with --agent NAME, that agent's own user
# perch-NAME, its directory, microsandbox home and environment file. Idempotent: every step
# says what it did, and a second run says `unchanged` (or `skipped`) for each and `nothing
# changed` at the end. Root never executes, follows or writes through a path a service user can
# change: what root runs and writes lives in root's directories, the one step inside an agent's
# own (loading the image into its microsandbox home) runs as the agent's user, and moving an
# agent's files from the shared user perch to its own is `perch chown`'s walk, which follows no
# link. `--plan` lists every action with its actor, path and owner. See deploy/README.md.
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
                       `cargo build --profile dist --locked` (build as yourself, then
                       `sudo deploy/install.sh --binary target/dist/perch`)
  --runtime-from DIR   copy the microsandbox runtime pair (msb, libkrunfw) from this
                       microsandbox home instead of the PyPI wheel
  --no-runtime         do not install the runtime pair into /usr/local/lib/perch/runtime
  --no-image           do not build the default image (perch image build)
  --minimal-image      build the image with `perch image build --minimal`
  --rebuild-image      build the image even if one is built (perch image build --rebuild)
  --agent NAME         set up the agent NAME (repeatable): the user perch-NAME (in the
                       group kvm), /var/lib/perch/agents/NAME (2750 perch-NAME:perch;
                       an existing one of the user perch's is given to perch-NAME with
                       `perch chown`, while perch@NAME is stopped), its microsandbox
                       home /var/lib/perch/msb/NAME, /etc/perch/NAME.env (empty, 0600) and
                       the built image loaded into that home as perch-NAME
  --no-user            do not create the groups perch and kvm or any perch-NAME user
                       (they must exist)
  --no-systemd         do not run systemctl daemon-reload, udevadm control --reload and
                       udevadm trigger
  --plan               print what this install would do on this machine and change
                       nothing: one line per action, `plan ACTOR VERB TARGET OWNER`, where
                       ACTOR (root or perch-NAME) executes (exec), reads, writes, creates
                       (mkdir), renames or walks (perch chown) TARGET, which is or ends up
                       owned by OWNER (user:group, or - when it is not a file); no root
                       needed
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
plan=
agent_names=
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
	--agent) [ $# -ge 2 ] || fail "--agent needs a name"; agent_names="$agent_names $2"; shift 2 ;;
	--agent=*) agent_names="$agent_names ${1#--agent=}"; shift ;;
	--no-user) no_user=1; shift ;;
	--no-systemd) no_systemd=1; shift ;;
	--plan) plan=1; shift ;;
	-h | --help) usage; exit 0 ;;
	*) usage >&2; fail "unknown argument $1" ;;
	esac
done
[ -z "$runtime_from" ] || [ -z "$no_runtime" ] || fail "--runtime-from and --no-runtime exclude each other"
for name in $agent_names; do
	case "$name" in
	*[!A-Za-z0-9_-]* | -*) fail "--agent $name: an agent's name is letters, digits, - and _, and does not start with -" ;;
	esac
	[ ${#name} -le 26 ] || fail "--agent $name: at most 26 characters (its user perch-$name is at most 32)"
done

[ -z "$plan" ] || [ -z "$DESTDIR" ] || fail "--plan describes the install on this machine; unset DESTDIR"
if [ -z "$plan" ] && [ -z "$DESTDIR" ] && [ "$(id -u)" != 0 ]; then
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
runtime_parent=/usr/local/lib/perch
runtime=$runtime_parent/runtime
krunfw=libkrunfw.so.5.6.1

changes=0
report() {
	printf '  %-10s %s\n' "$1" "$2"
	case "$1" in unchanged | skipped) ;; *) changes=$((changes + 1)) ;; esac
}

# planned ACTOR VERB TARGET OWNER: one action of --plan.
planned() { printf 'plan %s %s %s %s\n' "$1" "$2" "$3" "$4"; }

mode_of() { printf '%04d' "$(stat -c %a "$1")"; }
owner_of() { stat -c %U:%G "$1"; }

# Owners are set only on a real install: a staged tree belongs to whoever stages it.
owner() { if [ -z "$DESTDIR" ]; then echo "$1"; fi; }

# ensure_dir PATH MODE [OWNER]
ensure_dir() {
	if [ -n "$plan" ]; then
		planned root mkdir "$1" "${3:-root:root}"
		return
	fi
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
	if [ -n "$plan" ]; then
		planned root write "$2" "${4:-root:root}"
		return
	fi
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

if [ -n "$plan" ]; then
	echo "perch: the install plan for this machine (nothing is changed)"
else
	echo "perch: installing into ${DESTDIR:-/}"
fi

# 1. The binary.
if [ -n "$plan" ]; then
	if [ -z "$binary" ]; then
		planned root exec cargo "$(stat -c %U:%G "$repo")"
	else
		planned root read "$binary" "$(stat -c %U:%G "$binary" 2>/dev/null || echo -)"
	fi
	binary=$bin
elif [ -z "$binary" ]; then
	command -v cargo >/dev/null ||
		fail "cargo is not on PATH; build as yourself (cargo build --profile dist --locked) and pass --binary target/dist/perch"
	# The dist profile: the binary the published figures measure (docs/benchmarks.md).
	echo "  building   cargo build --profile dist --locked (in $repo)"
	(cd "$repo" && cargo build --profile dist --locked --quiet) || fail "cargo build failed"
	binary=${CARGO_TARGET_DIR:-$repo/target}/dist/perch
fi
if [ -z "$plan" ] && { [ ! -f "$binary" ] || [ ! -x "$binary" ]; }; then fail "$binary is not an executable file"; fi
install_file "$binary" "$bin" 0755 root:root
binary_changed=$changes

# 2. The groups: perch, the operators' (its members reach each agent's control socket), and
# kvm, which owns /dev/kvm (99-perch-kvm.rules). Each agent's own user comes with --agent.
if [ -n "$plan" ]; then
	[ -n "$no_user" ] || planned root account group:perch,group:kvm -
elif [ -n "$DESTDIR" ]; then
	report skipped "groups perch and kvm (DESTDIR is set)"
elif [ -n "$no_user" ]; then
	for group in perch kvm; do
		getent group "$group" >/dev/null || fail "the group $group does not exist; create it or drop --no-user"
	done
	report skipped "groups perch and kvm (--no-user)"
else
	for group in perch kvm; do
		if getent group "$group" >/dev/null; then
			report unchanged "group $group"
		else
			groupadd --system "$group"
			report created "group $group"
		fi
	done
fi

# 3. Directories. /etc/perch holds the agents' tokens and keys (NAME.env, 0600) and is read by
# systemd as root only. /var/lib/perch and in it agents/, msb/ (one microsandbox home per
# agent) and cache/ (the image root builds) are root's: each agent's own directory and home
# inside are its user's (--agent). An earlier install's shared microsandbox home or cache,
# owned by the user perch, is moved aside rather than taken over: root does not walk a tree
# another user could change under it.
ensure_dir "$etc" 0700 root:root
ensure_dir "$state" 0755 root:root
for shared in "$msb_home" "$cache"; do
	if [ -z "$DESTDIR" ] && [ -d "$shared" ] && [ ! -L "$shared" ] && [ "$(stat -c %u "$shared")" != 0 ]; then
		aside=$shared.perch-owned.$(date +%Y%m%d%H%M%S)
		if [ -n "$plan" ]; then
			planned root rename "$shared" "$(owner_of "$shared")"
		else
			mv "$shared" "$aside"
			report moved "$shared/ to $aside/ (it was not root's; remove it once every agent runs from its own)"
		fi
	fi
done
ensure_dir "$agents" 0755 root:root
ensure_dir "$msb_home" 0755 root:root
ensure_dir "$cache" 0755 root:root

# 4. The unit, the udev rule, the example environment file.
before_unit=$changes
install_file "$here/perch@.service" "$unit" 0644 root:root
unit_changed=$((changes > before_unit))
before_rule=$changes
install_file "$here/99-perch-kvm.rules" "$rule" 0644 root:root
rule_changed=$((changes > before_rule))
install_file "$here/env.example" "$etc/env.example" 0600 root:root

# 5. The runtime pair, msb and libkrunfw, in a directory of root's (the unit points MSB_PATH
# and MSB_LIBKRUNFW_PATH at it), so the user perch cannot replace what root runs during an
# install, nor what every agent runs.
if [ -n "$no_runtime" ]; then
	[ -n "$plan" ] || report skipped "runtime (--no-runtime)"
elif [ -n "$plan" ]; then
	ensure_dir "$runtime_parent" 0755 root:root
	ensure_dir "$runtime" 0755 root:root
	if [ -n "$runtime_from" ]; then
		planned root exec "$runtime_from/bin/msb" "$(stat -c %U:%G "$runtime_from/bin/msb" 2>/dev/null || echo -)"
	else
		planned root write "$cache/wheels" root:root
	fi
	planned root write "$runtime/bin/msb" root:root
	planned root write "$runtime/lib/$krunfw" root:root
	planned root exec "$runtime/bin/msb" root:root
else
	ensure_dir "$runtime_parent" 0755 root:root
	ensure_dir "$runtime" 0755 root:root
	set -- --wheels "$DESTDIR$cache/wheels"
	[ -z "$runtime_from" ] || set -- --from "$runtime_from"
	line=$("$here/install-runtime.sh" "$@" "$DESTDIR$runtime") || fail "the runtime pair was not installed"
	echo "$line"
	case "$line" in *unchanged*) ;; *) changes=$((changes + 1)) ;; esac
fi

# 6. The system's CA certificates. perch verifies https:// model providers and Matrix
# homeservers against the system trust store (a plain http:// model on this machine needs none);
# minimal roots (debootstrap minbase, many container bases) ship without it.
ca_bundles="/etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt /etc/ssl/cert.pem"
ca_found=
for bundle in $ca_bundles; do
	if [ -s "$bundle" ]; then ca_found=$bundle; break; fi
done
ca_fix="install the distribution's CA certificates package (apt-get install ca-certificates), or perch cannot use an https:// model"
if [ -n "$DESTDIR" ]; then
	[ -n "$plan" ] || report skipped "CA certificates (DESTDIR is set)"
elif [ -n "$ca_found" ]; then
	[ -n "$plan" ] || report unchanged "CA certificates ($ca_found)"
elif [ -n "$plan" ]; then
	! command -v apt-get >/dev/null || planned root exec apt-get -
elif command -v apt-get >/dev/null; then
	echo "  installing apt-get install ca-certificates (no CA certificates in $ca_bundles)"
	if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ca-certificates >/dev/null ||
		{ DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ca-certificates >/dev/null; }; then
		report installed "CA certificates (the ca-certificates package)"
	else
		echo "  warning    the ca-certificates package was not installed: $ca_fix" >&2
	fi
else
	echo "  warning    no CA certificates in $ca_bundles: $ca_fix" >&2
fi

# 7. The default image: built with debootstrap as root in the cache (root's). Each agent's user
# loads it into its own microsandbox home (step 8).
runtime_env="MSB_PATH=$runtime/bin/msb MSB_LIBKRUNFW_PATH=$runtime/lib/$krunfw"
if [ -n "$plan" ]; then
	if [ -z "$no_image" ] && { [ ! -f "$cache/images/default.json" ] || [ -n "$rebuild_image" ]; }; then
		planned root exec "$bin" root:root
		planned root write "$cache/images" root:root
	fi
elif [ -n "$no_image" ]; then
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
	PERCH_CACHE=$cache "$bin" "$@" --no-load || fail "perch $* --no-load failed; fix it, or pass --no-image"
	report built "image perch:default"
fi

# 8. Each agent named with --agent: its user, its directory, its microsandbox home, its
# environment file and the image in its home.
for name in $agent_names; do
	user=perch-$name
	dir=$agents/$name
	home=$msb_home/$name
	if [ -n "$plan" ]; then
		[ -n "$no_user" ] || planned root account "user:$user,group:kvm" -
		if [ -d "$dir" ] && [ ! -L "$dir" ] && [ "$(stat -c %U "$dir")" = perch ]; then
			planned root walk "$dir" "$user:perch"
		fi
		planned root mkdir "$dir" "$user:perch"
		planned root mkdir "$home" "$user:$user"
		planned root write "$etc/$name.env" root:root
		planned "$user" exec "$bin" root:root
		planned "$user" write "$home" "$user:$user"
		continue
	fi
	if [ -n "$DESTDIR" ]; then
		report skipped "user $user (DESTDIR is set)"
	elif [ -n "$no_user" ]; then
		getent passwd "$user" >/dev/null || fail "the user $user does not exist; create it or drop --no-user"
		report skipped "user $user (--no-user)"
	else
		if getent passwd "$user" >/dev/null; then
			report unchanged "user $user"
		else
			nologin=$(command -v nologin || echo /usr/sbin/nologin)
			useradd --system --user-group --home-dir "$dir" --no-create-home \
				--shell "$nologin" --comment "perch agent $name" "$user"
			report created "user $user (home $dir, no login)"
		fi
		if id -nG "$user" | tr ' ' '\n' | grep -qx kvm; then
			report unchanged "user $user in group kvm"
		else
			usermod --append --groups kvm "$user"
			report added "user $user to group kvm"
		fi
	fi
	# agents/ is root's, so the name cannot be swapped once it is checked not to be a link.
	[ ! -L "$DESTDIR$dir" ] || fail "$dir is a symbolic link; an agent's directory must be a directory"
	if [ -z "$DESTDIR" ] && [ -d "$dir" ] && [ "$(stat -c %U "$dir")" = perch ]; then
		if [ -d /run/systemd/system ] && systemctl is-active --quiet "perch@$name"; then
			fail "perch@$name is running as the user perch; stop it (systemctl stop perch@$name), then run this again"
		fi
		echo "  moving     $dir/ from the user perch to $user"
		"$bin" chown --from perch --to "$user:perch" "$dir" | sed 's/^/    /' ||
			fail "perch chown stopped; nothing it skipped was changed, run it again once fixed"
		report moved "$dir/ to $user:perch"
	fi
	ensure_dir "$dir" 2750 "$user:perch"
	ensure_dir "$home" 0700 "$user:$user"
	env_file=$DESTDIR$etc/$name.env
	if [ -e "$env_file" ]; then
		report unchanged "$etc/$name.env"
	else
		(umask 077 && : >"$env_file")
		report created "$etc/$name.env (empty, 0600: its tokens and keys go here)"
	fi
	if [ -n "$DESTDIR" ]; then
		report skipped "image perch:default in $home (DESTDIR is set)"
	elif [ ! -f "$cache/images/default.json" ]; then
		report skipped "image perch:default in $home (none is built; run without --no-image)"
	else
		command -v runuser >/dev/null || fail "runuser (util-linux) is missing; it loads the image as $user"
		# shellcheck disable=SC2086 # runtime_env is two words
		loaded=$(cd / && runuser -u "$user" -- env PERCH_CACHE="$cache" MSB_HOME="$home" $runtime_env "$bin" image load 2>&1) ||
			fail "the image was not loaded into $home: $loaded"
		case "$loaded" in
		*"already loaded"*) report unchanged "image perch:default in $home" ;;
		*) report loaded "image perch:default in $home (as $user)" ;;
		esac
	fi
done

# 9. systemd and udev.
if [ -n "$plan" ]; then
	[ -n "$no_systemd" ] || planned root exec systemctl,udevadm -
	exit 0
elif [ -n "$no_systemd" ]; then
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
