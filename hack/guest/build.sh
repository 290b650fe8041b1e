#!/usr/bin/env bash
# Builds Kairon's default guest image from Debian packages only:
#   OUT_DIR/default/vmlinux            uncompressed kernel (ELF) for direct boot
#   OUT_DIR/default/initramfs.cpio.gz  busybox, the kernel's virtio modules, /init,
#                                      /sbin/kairon-guest-agent (built here, static),
#                                      and the squashfs and overlay modules an image
#                                      guest (kairon.image=, internal/imagefs) loads
#   OUT_DIR-debs/                      the downloaded packages (beside OUT_DIR, not in
#                                      it: the node's OCI image takes OUT_DIR whole),
#                                      kept so that a rebuild for a new agent or init
#                                      downloads nothing
# Usage: hack/guest/build.sh OUT_DIR
#
# The result is cached: OUT_DIR/default/.stamp holds a hash of this script,
# hack/guest/init, the guest agent binary and the exact package versions; a
# matching stamp skips the build. Environment:
#   KAIRON_GUEST_KERNEL_PKG  kernel package (default: the newest
#                            linux-image-6.1.0-N-amd64 that apt knows)
#   KAIRON_GUEST_FORCE=1     rebuild even when the stamp matches
#   KAIRON_GUEST_DEB_CACHE   where the packages are kept (default OUT_DIR-debs)
set -euo pipefail

die() { echo "guest: $*" >&2; exit 1; }

[ $# -eq 1 ] || die "usage: $0 OUT_DIR"
out_dir=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
image=default
dest=$out_dir/$image

# Tools, each with the Debian package that brings it.
need=(apt-get:apt apt-cache:apt dpkg-deb:dpkg cpio:cpio gzip:gzip xz:xz-utils
	sha256sum:coreutils od:coreutils tr:coreutils find:findutils grep:grep awk:mawk)
missing=()
for t in "${need[@]}"; do
	command -v "${t%%:*}" >/dev/null 2>&1 || missing+=("${t%%:*} (Debian package ${t#*:})")
done
[ ${#missing[@]} -eq 0 ] || die "missing tools: ${missing[*]}; run 'make deps' or apt-get install them"

# One apt-cache call (each takes seconds): candidate versions of every
# linux-image-6.1.0-N-amd64 (or the chosen kernel package) and busybox-static.
kpat=${KAIRON_GUEST_KERNEL_PKG:+^${KAIRON_GUEST_KERNEL_PKG//./\\.}\$}
kpat=${kpat:-'^linux-image-6\.1\.0-[0-9]+-amd64$'}
versions=$(apt-cache policy "$kpat" busybox-static 2>/dev/null |
	awk '/^[^ ].*:$/ {p=substr($1, 1, length($1)-1)} /Candidate:/ && $2 != "(none)" {print p, $2}')
kpkg=$(echo "$versions" | awk '$1 ~ /^linux-image-/ {print $1}' | sort -V | tail -n1)
[ -n "$kpkg" ] || die "apt has no installable ${KAIRON_GUEST_KERNEL_PKG:-linux-image-6.1.0-N-amd64} package; run 'apt-get update' (Debian 12 sources needed)"
kver=$(echo "$versions" | awk -v p="$kpkg" '$1 == p {print $2}')
bver=$(echo "$versions" | awk '$1 == "busybox-static" {print $2}')
[ -n "$bver" ] || die "apt has no installable version of busybox-static; run 'apt-get update'"

# The guest agent, static and reproducible (so its hash is a fair stamp).
# Its version is a hash of its sources, not the commit: another commit
# alone does not rebuild the image.
go=$(command -v go || echo /usr/local/go/bin/go)
[ -x "$go" ] || die "go not found (needed to build cmd/kairon-guest-agent)"
agent_bin=$(mktemp "${TMPDIR:-/tmp}/kairon-guest-agent.XXXXXX")
trap 'rm -f "$agent_bin"' EXIT
(cd "$here/../.." &&
	src=$(find cmd/kairon-guest-agent internal/guestagent -name '*.go' ! -name '*_test.go' | LC_ALL=C sort |
		xargs cat go.mod go.sum | sha256sum | cut -c1-12) &&
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 "$go" build -trimpath -buildvcs=false \
		-ldflags "-s -w -X main.version=src-$src" -o "$agent_bin" ./cmd/kairon-guest-agent) ||
	die "building cmd/kairon-guest-agent failed"

stamp=$( (cat "$0" "$here/init" "$agent_bin"; echo "$kpkg=$kver busybox-static=$bver") | sha256sum | cut -d' ' -f1)
if [ "${KAIRON_GUEST_FORCE:-0}" != 1 ] && [ -f "$dest/.stamp" ] &&
	[ "$(cat "$dest/.stamp")" = "$stamp" ] && [ -s "$dest/vmlinux" ] && [ -s "$dest/initramfs.cpio.gz" ]; then
	echo "guest: $dest is up to date ($kpkg $kver, busybox-static $bver)"
	exit 0
fi

echo "guest: building $dest from $kpkg $kver and busybox-static $bver" >&2
work=$(mktemp -d "${TMPDIR:-/tmp}/kairon-guest.XXXXXX")
trap 'rm -rf "$work" "$agent_bin"' EXIT
# The packages are kept by exact version: a rebuild for a new agent or init
# (the usual one) downloads nothing. Only the two versions this build uses
# stay.
debs=${KAIRON_GUEST_DEB_CACHE:-${out_dir%/}-debs}
mkdir -p "$debs"
kdeb=$(find "$debs" -maxdepth 1 -name "${kpkg}_${kver//[:]/%3a}_*.deb" | head -n1)
bdeb=$(find "$debs" -maxdepth 1 -name "busybox-static_${bver//[:]/%3a}_*.deb" | head -n1)
if [ -z "$kdeb" ] || [ -z "$bdeb" ]; then
	mkdir "$work/dl"
	(cd "$work/dl" && apt-get download -q -o APT::Sandbox::User=root "$kpkg=$kver" "busybox-static=$bver" >/dev/null) ||
		die "apt-get download $kpkg=$kver busybox-static=$bver failed"
	find "$debs" -maxdepth 1 -name '*.deb' -delete
	mv "$work"/dl/*.deb "$debs/"
	kdeb=$(find "$debs" -maxdepth 1 -name 'linux-image-*.deb' | head -n1)
	bdeb=$(find "$debs" -maxdepth 1 -name 'busybox-static_*.deb' | head -n1)
fi
dpkg-deb -x "$kdeb" "$work/kernel" || die "unpacking $kdeb failed"
dpkg-deb -x "$bdeb" "$work/busybox" || die "unpacking $bdeb failed"

# --- vmlinux: find the compressed payload in vmlinuz and unpack it (as the
# kernel's scripts/extract-vmlinux does): try every offset where a known
# compression magic occurs until one decompresses to an ELF file.
vmlinuz=$(find "$work/kernel/boot" -name 'vmlinuz-*' | head -n1)
[ -n "$vmlinuz" ] || die "$kpkg holds no /boot/vmlinuz-*"
kabi=${vmlinuz##*/vmlinuz-}
is_elf() { [ "$(od -An -c -N4 "$1" 2>/dev/null | tr -d ' ')" = '177ELF' ]; }
try_decompress() { # MAGIC(printf escapes) SEARCH-CHAR TOOL...
	local magic=$1 first=$2
	shift 2
	command -v "$1" >/dev/null 2>&1 || return 1
	local pos
	for pos in $(tr "$magic\n$first" "\n$first=" <"$vmlinuz" | grep -abo "^$first" | cut -d: -f1); do
		pos=${pos%%:*}
		tail -c+"$pos" "$vmlinuz" | "$@" >"$work/vmlinux" 2>/dev/null || true
		if is_elf "$work/vmlinux"; then
			return 0
		fi
	done
	return 1
}
try_decompress '\3757zXZ\000' abcde xz -dc ||
	try_decompress '\037\213\010' xy gzip -dc ||
	try_decompress '(\265/\375' xxx zstd -dc ||
	try_decompress '\002!L\030' xxx lz4 -dc ||
	die "could not extract an ELF vmlinux from $vmlinuz (unknown compression, or its tool is missing)"

# --- initramfs
root=$work/root
mkdir -p "$root"/{bin,sbin,dev,proc,sys,tmp,run,root,etc/kairon,lib/modules,www,image/ro,image/rw,image/root}
chmod 1777 "$root/tmp"
cp "$work/busybox/bin/busybox" "$root/bin/busybox"
for app in $("$root/bin/busybox" --list); do
	[ "$app" = busybox ] || ln -s busybox "$root/bin/$app"
done
install -m 0755 "$here/init" "$root/init"
install -m 0755 "$agent_bin" "$root/sbin/kairon-guest-agent"

moddir=$work/kernel/lib/modules/$kabi
config=$work/kernel/boot/config-$kabi
[ -d "$moddir" ] && [ -f "$config" ] || die "$kpkg lacks lib/modules/$kabi or boot/config-$kabi"
# Drivers the guest needs; those built into this kernel (=y) need no
# module. virtio_ring has no Kconfig symbol of its own: it is a module exactly
# when VIRTIO is, and must load before virtio. modules_for OPTION:MODULE...
# prints the modules among them.
modules_for() {
	local opt val
	for opt in "$@"; do
		val=$(grep -E "^CONFIG_${opt%%:*}=" "$config" | cut -d= -f2 || true)
		case "$val" in
		m) echo "${opt#*:}" ;;
		y) ;;
		*) die "$kpkg has CONFIG_${opt%%:*} neither built in nor as a module" ;;
		esac
	done
}
mapfile -t wanted < <(modules_for VIRTIO:virtio_ring VIRTIO:virtio VIRTIO_MMIO:virtio_mmio VIRTIO_PCI:virtio_pci \
	VIRTIO_NET:virtio_net VIRTIO_BLK:virtio_blk VIRTIO_CONSOLE:virtio_console)
# An image guest's root (internal/imagefs): squashfs read-only under an
# overlay. A guest of its own list, loaded only when kairon.image is set, so
# the default guest's boot loads nothing more than before.
mapfile -t image_wanted < <(modules_for SQUASHFS:squashfs OVERLAY_FS:overlay)

modpath() { # NAME -> its module file (name with _ or -, plain or compressed)
	local alt
	alt=$(echo "$1" | tr _- -_)
	find "$moddir/kernel" \( -name "$1.ko*" -o -name "$alt.ko*" \) | head -n1
}
declare -A added=()
order=()
add_module() { # dependencies first (depends= from the module's .modinfo)
	local name=$1 f dep
	[ -z "${added[$name]:-}" ] || return 0
	added[$name]=1
	f=$(modpath "$name")
	[ -n "$f" ] || die "module $name not found in $kpkg"
	case "$f" in
	*.ko) cp "$f" "$work/mod.ko" ;;
	*.ko.xz) xz -dc "$f" >"$work/mod.ko" ;;
	*.ko.zst) command -v zstd >/dev/null || die "zstd needed for $f (Debian package zstd)"; zstd -qdc "$f" >"$work/mod.ko" ;;
	*) die "module $f: unknown format" ;;
	esac
	for dep in $(tr '\0' '\n' <"$work/mod.ko" | grep -a '^depends=' | head -n1 | cut -d= -f2 | tr , ' '); do
		add_module "$dep"
	done
	# add_module of a dependency reused mod.ko; take this module's file again.
	case "$f" in
	*.ko) cp "$f" "$root/lib/modules/$name.ko" ;;
	*.ko.xz) xz -dc "$f" >"$root/lib/modules/$name.ko" ;;
	*.ko.zst) zstd -qdc "$f" >"$root/lib/modules/$name.ko" ;;
	esac
	order+=("$name")
}
for m in "${wanted[@]}"; do add_module "$m"; done
printf '%s\n' "${order[@]}" >"$root/etc/kairon/modules"
base_modules=("${order[@]}")
order=()
for m in "${image_wanted[@]}"; do add_module "$m"; done
# Only what the first list did not load already (add_module skips those).
printf '%s\n' "${order[@]}" >"$root/etc/kairon/modules.image"
image_modules=("${order[@]}")

cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
EOF
cat >"$root/etc/group" <<'EOF'
root:x:0:
EOF
cat >"$root/etc/profile" <<'EOF'
export PATH=/bin:/sbin
PS1='\h:\w# '
EOF
echo "$kpkg $kver busybox-static $bver" >"$root/etc/kairon/release"

(cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc --owner 0:0 --quiet) | gzip -9 >"$work/initramfs.cpio.gz"

# Replace the old image only once the new one is complete.
mkdir -p "$out_dir"
rm -rf "$dest.new"
mkdir -p "$dest.new"
mv "$work/vmlinux" "$dest.new/vmlinux"
mv "$work/initramfs.cpio.gz" "$dest.new/initramfs.cpio.gz"
cp "$config" "$dest.new/config"
echo "$stamp" >"$dest.new/.stamp"
rm -rf "$dest"
mv "$dest.new" "$dest"
echo "guest: built $dest: vmlinux $(du -h "$dest/vmlinux" | cut -f1), initramfs $(du -h "$dest/initramfs.cpio.gz" | cut -f1), modules: ${base_modules[*]}; for an image: ${image_modules[*]}" >&2
