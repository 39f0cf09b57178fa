#!/bin/sh
# Replaces the image's initrd with rxelab's minimal one (initrd-init says why): busybox, the
# modules that virtio_pci, virtio_blk and ext4 need (in load order, found by modprobe), and
# /init. $1 is the new root; runs inside mmdebstrap's namespace, from customize.sh.
set -eu
root=$1
here=$(dirname "$0")
kver=$(ls "$root/usr/lib/modules")
work="$root/tmp/rxelab-initrd"
rm -rf "$work"
mkdir -p "$work/bin" "$work/dev" "$work/proc" "$work/sys" "$work/root" "$work/lib/modules"
cp "$root/bin/busybox" "$work/bin/busybox"
install -m 0755 "$here/initrd-init" "$work/init"
# crc32c first: ext4 and jbd2 ask the crypto API for it, and no modprobe runs in the initrd
chroot "$root" modprobe -a -S "$kver" --show-depends crc32c_generic virtio_pci virtio_blk ext4 |
  sed -n 's/^insmod \([^ ]*\).*/\1/p' | while read -r ko; do
    name=$(basename "$ko")
    grep -qx "$name" "$work/modules.list" 2>/dev/null && continue
    cp "$root$ko" "$work/lib/modules/$name"
    echo "$name" >> "$work/modules.list"
  done
chroot "$root" sh -c 'cd /tmp/rxelab-initrd && find . | cpio -o -H newc --quiet' \
  > "$root/boot/initrd.img-$kver"
rm -rf "$work"
