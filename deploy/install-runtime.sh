#!/bin/sh
# Installs the microsandbox runtime pair perch's microVMs need, msb 0.7.11 and
# libkrunfw.so.5.6.1, into a microsandbox home (MSB_HOME): bin/msb, lib/libkrunfw.so.5.6.1 and
# its .so.5 and .so links. Idempotent: when the home already holds that msb and the library it
# says `unchanged` and touches nothing. Used by deploy/install.sh and by .ci/setup.
set -eu

msb_version=0.7.11
lib=libkrunfw.so.5.6.1
# The SHA-256 of each microsandbox 0.7.11 wheel this installs, as PyPI lists them. Every wheel,
# downloaded, found in --wheels or given with --wheel, is checked against them before it is
# unpacked.
wheel_sha256_x86_64=65f1e4bbf8d721c9f7f557329fb6c8cf41f554c1c6942eac8b941198fa283fe0
wheel_sha256_aarch64=f774a5ff6e61c5b88c42b3e058967c0b989c26d8a51c2b09f1e6a00be925b9c0

usage() {
	cat <<EOF
usage: install-runtime.sh [--from DIR | --wheel FILE] [--wheels DIR] MSB_HOME

Installs msb $msb_version and $lib into MSB_HOME/bin and MSB_HOME/lib.

By default they come from the microsandbox==$msb_version wheel on PyPI (the runtime pair the
perch binary is pinned to), downloaded once with pip into the wheel directory. Every wheel must
have the SHA-256 pinned in this script for its architecture (x86_64 or aarch64), or nothing is
installed. As root, the wheel, its directory and the --from home must be root's alone.

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

# refuse_standin MSB: fails when MSB is perch's test stand-in (tests/msb), which carries the real
# version stamp but answers --version with `msb 0.7.11 (perch test stand-in)`.
refuse_standin() {
	case "$("$1" --version 2>/dev/null || true)" in
	*stand-in*) fail "$1 is perch's test stand-in (tests/msb), which runs commands in Linux namespaces, not microVMs; install the real msb $msb_version from the microsandbox==$msb_version wheel (leave out --from, or point it at a home holding the real runtime)" ;;
	esac
}

# root_only PATH FIX: as root, fails unless PATH (as far as it exists) and every directory above
# it are owned by root and writable by nobody else (a sticky directory such as /tmp passes), so
# no other user can swap what root is about to run, unpack or write; the failure ends with FIX.
# For anyone but root, passes.
root_only() {
	[ "$(id -u)" = 0 ] || return 0
	case "$1" in /*) path=$1 ;; *) path=$(pwd)/$1 ;; esac
	fix=$2
	walked=
	for part in / $(printf '%s' "$path" | tr '/' ' '); do
		if [ "$part" = / ]; then walked=/; else walked=${walked%/}/$part; fi
		[ -e "$walked" ] || [ -L "$walked" ] || return 0
		[ ! -L "$walked" ] || fail "$walked is a symbolic link; as root, this installs only into and from paths no other user can change: $fix"
		owner_mode=$(stat -c '%u %a' "$walked")
		[ "${owner_mode%% *}" = 0 ] || fail "$walked is owned by uid ${owner_mode%% *}, who could replace what root runs there; $fix"
		case "${owner_mode#* }" in
		1???) ;;
		*[2367]? | *[2367]) fail "$walked is writable by its group or by others (mode ${owner_mode#* }); as root, this installs only into and from paths no other user can change: $fix" ;;
		esac
	done
}

# wheel_arch COPY WHEEL FIX: the architecture whose pinned SHA-256 COPY (of WHEEL) has; fails
# for any other, ending with FIX.
wheel_arch() {
	digest=$(sha256sum "$1") || fail "could not hash $1"
	digest=${digest%% *}
	case "$digest" in
	"$wheel_sha256_x86_64") echo x86_64 ;;
	"$wheel_sha256_aarch64") echo aarch64 ;;
	*) fail "$2 has SHA-256 $digest, which is not microsandbox-$msb_version's (x86_64 $wheel_sha256_x86_64, aarch64 $wheel_sha256_aarch64); nothing was installed: $3" ;;
	esac
}

arch=$(uname -m)
case "$arch" in
x86_64 | aarch64) ;;
arm64) arch=aarch64 ;;
*) [ -n "$from" ] || fail "microsandbox $msb_version has no wheel for $arch; pass --from DIR" ;;
esac
wheel_name=microsandbox-$msb_version-cp310-abi3-manylinux_2_28_$arch.whl

root_only "$target" "install the runtime into a directory of root's (deploy/install.sh uses /usr/local/lib/perch/runtime)"
if [ -n "$from" ]; then
	root_only "$from/bin/msb" "copy the runtime from a home of root's, or leave out --from to take it from the wheel"
elif [ -n "$wheel" ]; then
	root_only "$wheel" "put the wheel in a directory of root's, owned by root and writable by no one else"
else
	root_only "$wheels" "keep the wheels in a directory of root's, writable by no one else (chmod go-w, chown root), or pass --wheels DIR"
fi

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
	if [ -n "$wheel" ]; then
		wrong_wheel_fix="pass the $wheel_name that PyPI serves"
	else
		wrong_wheel_fix="remove it, and the next run downloads the wheel again"
		wheel=$wheels/$wheel_name
		if [ ! -e "$wheel" ]; then
			command -v python3 >/dev/null || fail "python3 is missing; it downloads the wheel (or pass --from DIR or --wheel FILE)"
			echo "install-runtime: downloading the microsandbox==$msb_version wheel from PyPI into $wheels" >&2
			mkdir -p "$wheels"
			python3 -m pip download --quiet --no-deps --only-binary=:all: "microsandbox==$msb_version" -d "$wheels" >&2 ||
				fail "could not download microsandbox==$msb_version with pip; pass --from DIR or --wheel FILE"
			[ -e "$wheel" ] || fail "pip downloaded no $wheel_name into $wheels"
		fi
		root_only "$wheel" "keep the wheels in a directory of root's, writable by no one else (chmod go-w, chown root), or pass --wheels DIR"
	fi
	[ -f "$wheel" ] || fail "$wheel does not exist"
	command -v python3 >/dev/null || fail "python3 is missing; it unpacks the wheel"
	unpacked=$(mktemp -d "${TMPDIR:-/tmp}/perch-wheel.XXXXXX")
	# The copy in a directory of this process's own is what is hashed and unpacked, so the wheel
	# cannot change between the two.
	cp "$wheel" "$unpacked/wheel.zip"
	wheel_is=$(wheel_arch "$unpacked/wheel.zip" "$wheel" "$wrong_wheel_fix")
	[ "$wheel_is" = "$arch" ] || fail "$wheel is microsandbox-$msb_version's $wheel_is wheel, and this machine is $arch"
	python3 -m zipfile -e "$unpacked/wheel.zip" "$unpacked/tree"
	source_bin=$unpacked/tree/microsandbox/_bundled/bin/msb
	source_lib=$unpacked/tree/microsandbox/_bundled/lib/$lib
	source=$(basename "$wheel")
	# A zip keeps no permission bits.
	[ ! -f "$source_bin" ] || chmod 0755 "$source_bin"
fi

[ -f "$source_bin" ] || fail "$source_bin does not exist"
[ -f "$source_lib" ] || fail "$source_lib does not exist"
refuse_standin "$source_bin"
reports "$source_bin" || fail "$source_bin is not msb $msb_version (it reports '$("$source_bin" --version 2>&1 || true)')"

install -D -m 0755 "$source_bin" "$target/bin/msb"
install -D -m 0755 "$source_lib" "$target/lib/$lib"
ln -sfn "$lib" "$target/lib/libkrunfw.so.5"
ln -sfn libkrunfw.so.5 "$target/lib/libkrunfw.so"
reports "$target/bin/msb" || fail "$target/bin/msb does not report msb $msb_version after installing it"
printf '  %-10s %s\n' installed "runtime msb $msb_version in $target (from $source)"
