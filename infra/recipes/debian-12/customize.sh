#!/bin/sh
# mmdebstrap customize hook: $1 is the new root. Runs inside mmdebstrap's namespace.
set -eu
root=$1
here=$(dirname "$0")

echo "/dev/vda / ext4 defaults,noatime 0 1" > "$root/etc/fstab"
rm -f "$root/etc/hostname" "$root"/etc/ssh/ssh_host_*
install -m 0644 "$here/91-rxelab.cfg" "$root/etc/cloud/cloud.cfg.d/91-rxelab.cfg"

# cloud-init renders systemd-networkd config; wait for any one link, not all of them.
chroot "$root" systemctl enable systemd-networkd
mkdir -p "$root/etc/systemd/system/systemd-networkd-wait-online.service.d"
printf '[Service]\nExecStart=\nExecStart=/lib/systemd/systemd-networkd-wait-online --any --timeout=60\n' \
  > "$root/etc/systemd/system/systemd-networkd-wait-online.service.d/any.conf"
chroot "$root" systemctl disable e2scrub_reap.service e2scrub_all.timer apt-daily.timer \
  apt-daily-upgrade.timer fstrim.timer dpkg-db-backup.timer 2>/dev/null || true

# Only what SoftRoCE user space needs at boot (no iSER, no NFS over RDMA).
printf 'ib_uverbs\nrdma_ucm\n' > "$root/etc/rdma/modules/rdma.conf"
printf '* soft memlock unlimited\n* hard memlock unlimited\n' > "$root/etc/security/limits.d/90-rdma.conf"
echo "net.ipv4.ping_group_range = 0 2147483647" > "$root/etc/sysctl.d/90-ping.conf"

# Smaller image and initrd: drop module trees a virtio guest never loads; a short initrd list.
cd "$root"/usr/lib/modules/*/kernel
rm -rf drivers/gpu drivers/media drivers/staging drivers/iio drivers/hwmon drivers/net/wireless \
  drivers/net/ethernet drivers/bluetooth drivers/isdn sound net/wireless net/mac80211 net/bluetooth
chroot "$root" sh -c 'depmod -a $(ls /usr/lib/modules)'
echo MODULES=list > "$root/etc/initramfs-tools/conf.d/rxelab.conf"
printf 'virtio_pci\nvirtio_blk\next4\n' >> "$root/etc/initramfs-tools/modules"
chroot "$root" update-initramfs -u
