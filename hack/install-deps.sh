#!/usr/bin/env bash
# Installs the Debian 12 packages Kairon's build, tests and node agent use.
# Idempotent and quick when everything is there; needs root to install.
set -euo pipefail

# Build and test: git, make, gcc (cgo). Guest image (hack/guest/build.sh):
# apt, dpkg, cpio, gzip, xz-utils, zstd. Node agent: qemu-system-x86 (QEMU
# 7.2), iproute2 (bridge, taps, network namespaces in tests), nftables (the
# guests' network baseline, docs/guides/networking.md). kairon-ui's browser
# tests (internal/ui) drive Debian's headless chromium. The image tests
# (test/images) run the images of make images in Debian's podman. The
# console and `kaironctl exec -it` tests (test/e2e) type into a terminal
# that tmux draws. The node's image store (internal/images) turns OCI images
# into squashfs with sqfstar, and its tests check them with unsquashfs
# (squashfs-tools); they pull from a real registry on loopback
# (docker-registry, distribution 2.8). erofs-utils and e2fsprogs measure the
# other formats docs/design/image-format.md compares.
packages=(ca-certificates git make gcc libc6-dev iproute2 nftables procps
  cpio gzip xz-utils zstd qemu-system-x86 chromium podman tmux
  squashfs-tools docker-registry erofs-utils e2fsprogs)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing Debian packages: ${missing[*]}; run as root or: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
  echo "install-deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
  # Debian's docker-registry package enables a registry service on :5000,
  # the port kairon-local's own registry takes; tests run the binary
  # themselves. Only a registry this script just installed is disabled.
  if [[ " ${missing[*]} " == *" docker-registry "* ]] && [ -d /run/systemd/system ]; then
    systemctl disable --now docker-registry.service >/dev/null 2>&1 || true
  fi
fi

# The guest build downloads the kernel and busybox packages with apt-get
# download, which needs package lists; a fresh machine may have none.
if ! apt-cache policy busybox-static 2>/dev/null | grep -q 'Candidate: [0-9]'; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: apt has no package lists; run 'sudo apt-get update'" >&2
    exit 1
  fi
  apt-get update -qq
fi

go_bin=$(command -v go || echo /usr/local/go/bin/go)
if ! [ -x "$go_bin" ]; then
  echo "install-deps: Go 1.26 or newer is required and was not found in PATH or /usr/local/go/bin" >&2
  exit 1
fi
