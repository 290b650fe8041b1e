#!/usr/bin/env bash
# Measures how long turning one realistic image tree into a read-only
# filesystem takes, and how big the result is, for the formats
# docs/design/image-format.md compares. The tree is the host's Python 3.11
# (stdlib and dist-packages), git's helpers, libpython, OpenSSL, SQLite,
# libstdc++, the time zones and /etc: about 150 MB in about 6000 files, like
# a python:3.11-slim image with git. Run as root (ownership, erofs and ext4
# need the tree extracted); prints one line per format and run:
#   format  seconds  max-RSS-KiB  bytes
# usage: measure-formats.sh [WORKDIR] [RUNS]
set -euo pipefail
work=${1:-/tmp/kairon-measure-formats}
runs=${2:-3}
rm -rf "$work"; mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
lib=usr/lib/x86_64-linux-gnu
tar --numeric-owner -C / -cf "$work/tree.tar" usr/lib/python3 usr/lib/python3.11 \
  usr/lib/git-core usr/share/zoneinfo etc \
  $lib/libpython3.11.so.1.0 $lib/libcrypto.so.3 $lib/libssl.so.3 \
  $lib/libsqlite3.so.0.8.6 $lib/libstdc++.so.6.0.30 $lib/libc.so.6 2>/dev/null || true
echo "# tree: $(stat -c %s "$work/tree.tar") bytes of tar, $(tar -tf "$work/tree.tar" | wc -l) entries"
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"

t() { # label, output file, command...
  local label=$1 out=$2; shift 2
  /usr/bin/time -f "%e %M" -o "$work/time" "$@" >/dev/null 2>&1
  echo "$label $(cat "$work/time") $(stat -c %s "$out")"
}

for i in $(seq "$runs"); do
  sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
  cat "$work/tree.tar" >/dev/null
  for c in gzip lz4 lzo zstd xz; do
    rm -f "$work/o.sqfs"
    t "squashfs-$c(sqfstar)" "$work/o.sqfs" sh -c "sqfstar -quiet -no-progress -comp $c $work/o.sqfs < $work/tree.tar"
  done
  rm -f "$work/o.sqfs"
  t "squashfs-none(sqfstar)" "$work/o.sqfs" sh -c "sqfstar -quiet -no-progress -noI -noD -noF -noX $work/o.sqfs < $work/tree.tar"
  # erofs and ext4 are made from a directory: the tree is extracted first
  # (as root, on the host), and that time is part of their conversion.
  rm -rf "$work/dir"; mkdir "$work/dir"
  t "extract(tar -x)" "$work/tree.tar" tar --numeric-owner --xattrs -C "$work/dir" -xpf "$work/tree.tar"
  for z in none lz4 lz4hc; do
    rm -f "$work/o.erofs"
    if [ $z = none ]; then t "erofs-$z(mkfs.erofs)" "$work/o.erofs" mkfs.erofs "$work/o.erofs" "$work/dir"
    else t "erofs-$z(mkfs.erofs)" "$work/o.erofs" mkfs.erofs -z$z "$work/o.erofs" "$work/dir"; fi
  done
  rm -f "$work/o.ext4"
  size=$(( $(du -sk "$work/dir" | cut -f1) * 13 / 10 + 8192 ))
  t "ext4(mke2fs-d)" "$work/o.ext4" mke2fs -q -t ext4 -O ^has_journal -d "$work/dir" "$work/o.ext4" "${size}k"
  echo "ext4-used-blocks-KiB $(du -k "$work/o.ext4" | cut -f1)"
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
