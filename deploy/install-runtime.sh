#!/bin/sh
# Installs the microsandbox runtime pair perch's microVMs need, msb 0.7.11 and
# libkrunfw.so.5.6.1, into a microsandbox home (MSB_HOME): bin/msb, lib/libkrunfw.so.5.6.1 and
# its .so.5 and .so links. Idempotent: when the home already holds that msb and the library it
# says `unchanged` and touches nothing. Used by deploy/install.sh and by .ci/setup.
set -eu

msb_version=0.7.11
lib=libkrunfw.so.5.6.1

usage() {
	cat <<EOF
usage: install-runtime.sh [--from DIR | --wheel FILE] [--wheels DIR] MSB_HOME

Installs msb $msb_version and $lib into MSB_HOME/bin and MSB_HOME/lib.

By default they come from the microsandbox==$msb_version wheel on PyPI (the runtime pair the
perch binary is pinned to), downloaded once with pip into the wheel directory.

  --from DIR    copy the pair from another microsandbox home (DIR/bin/msb, DIR/lib/$lib)
  --wheel FILE  take the pair from this microsandbox-$msb_version wheel
  --wheels DIR  where the wheel is looked for and downloaded to
                (default: \$PERCH_CACHE/wheels, or ~/.cache/perch/wheels)
  -h, --help    this help
EOF
}

fail() {
	echo "install-runtime: $*" >&2
	exit 1
}

from=
wheel=
wheels="${PERCH_CACHE:-${HOME:-/root}/.cache/perch}/wheels"
target=
while [ $# -gt 0 ]; do
	case "$1" in
	--from) [ $# -ge 2 ] || fail "--from needs a directory"; from=$2; shift 2 ;;
	--from=*) from=${1#--from=}; shift ;;
	--wheel) [ $# -ge 2 ] || fail "--wheel needs a file"; wheel=$2; shift 2 ;;
	--wheel=*) wheel=${1#--wheel=}; shift ;;
	--wheels) [ $# -ge 2 ] || fail "--wheels needs a directory"; wheels=$2; shift 2 ;;
	--wheels=*) wheels=${1#--wheels=}; shift ;;
	-h | --help) usage; exit 0 ;;
	-*) usage >&2; fail "unknown option $1" ;;
	*) [ -z "$target" ] || fail "one MSB_HOME only"; target=$1; shift ;;
	esac
done
[ -n "$target" ] || { usage >&2; fail "name the microsandbox home to install into"; }
[ -z "$from" ] || [ -z "$wheel" ] || fail "--from and --wheel exclude each other"

reports() { [ "$("$1" --version 2>/dev/null || true)" = "msb $msb_version" ]; }

# root_only PATH: as root, fails unless PATH (as far as it exists) and every directory above it
# are owned by root and writable by nobody else (a sticky directory such as /tmp passes), so no
# other user can swap what root is about to run or write. For anyone but root, passes.
root_only() {
	[ "$(id -u)" = 0 ] || return 0
	case "$1" in /*) path=$1 ;; *) path=$(pwd)/$1 ;; esac
	walked=
	for part in / $(printf '%s' "$path" | tr '/' ' '); do
		if [ "$part" = / ]; then walked=/; else walked=${walked%/}/$part; fi
		[ -e "$walked" ] || [ -L "$walked" ] || return 0
		[ ! -L "$walked" ] || fail "$walked is a symbolic link; as root, this installs only into and from paths no other user can change"
		owner_mode=$(stat -c '%u %a' "$walked")
		[ "${owner_mode%% *}" = 0 ] || fail "$walked is owned by uid ${owner_mode%% *}, who could replace what root runs there; install the runtime into a directory of root's (deploy/install.sh uses /usr/local/lib/perch/runtime)"
		case "${owner_mode#* }" in
		1???) ;;
		*[2367]? | *[2367]) fail "$walked is writable by its group or by others (mode ${owner_mode#* }); as root, this installs only into and from paths no other user can change" ;;
		esac
	done
}

root_only "$target"
[ -z "$from" ] || root_only "$from/bin/msb"

if reports "$target/bin/msb" && [ -f "$target/lib/$lib" ]; then
	printf '  %-10s %s\n' unchanged "runtime msb $msb_version in $target"
	exit 0
fi

unpacked=
cleanup() { [ -z "$unpacked" ] || rm -rf "$unpacked"; }
trap cleanup EXIT

if [ -n "$from" ]; then
	source_bin=$from/bin/msb
	source_lib=$from/lib/$lib
	source="$from"
else
	if [ -z "$wheel" ]; then
		find_wheel() { { find "$wheels" -maxdepth 1 -name "microsandbox-$msb_version-*.whl" 2>/dev/null || true; } | sort | head -n1; }
		wheel=$(find_wheel)
		if [ -z "$wheel" ]; then
			command -v python3 >/dev/null || fail "python3 is missing; it downloads the wheel (or pass --from DIR or --wheel FILE)"
			echo "install-runtime: downloading the microsandbox==$msb_version wheel from PyPI into $wheels" >&2
			mkdir -p "$wheels"
			python3 -m pip download --quiet --no-deps --only-binary=:all: "microsandbox==$msb_version" -d "$wheels" >&2 ||
				fail "could not download microsandbox==$msb_version with pip; pass --from DIR or --wheel FILE"
			wheel=$(find_wheel)
		fi
		[ -n "$wheel" ] || fail "no microsandbox-$msb_version wheel in $wheels"
	fi
	[ -f "$wheel" ] || fail "$wheel does not exist"
	command -v python3 >/dev/null || fail "python3 is missing; it unpacks the wheel"
	unpacked=$(mktemp -d "${TMPDIR:-/tmp}/perch-wheel.XXXXXX")
	python3 -m zipfile -e "$wheel" "$unpacked"
	source_bin=$unpacked/microsandbox/_bundled/bin/msb
	source_lib=$unpacked/microsandbox/_bundled/lib/$lib
	source=$(basename "$wheel")
	# A zip keeps no permission bits.
	[ ! -f "$source_bin" ] || chmod 0755 "$source_bin"
fi

[ -f "$source_bin" ] || fail "$source_bin does not exist"
[ -f "$source_lib" ] || fail "$source_lib does not exist"
reports "$source_bin" || fail "$source_bin is not msb $msb_version (it reports '$("$source_bin" --version 2>&1 || true)')"

install -D -m 0755 "$source_bin" "$target/bin/msb"
install -D -m 0755 "$source_lib" "$target/lib/$lib"
ln -sfn "$lib" "$target/lib/libkrunfw.so.5"
ln -sfn libkrunfw.so.5 "$target/lib/libkrunfw.so"
reports "$target/bin/msb" || fail "$target/bin/msb does not report msb $msb_version after installing it"
printf '  %-10s %s\n' installed "runtime msb $msb_version in $target (from $source)"
