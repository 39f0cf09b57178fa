#!/bin/sh
# mmdebstrap customize hook: $1 is the new root, then pairs of (file, its path in the root): the
# SoftRoCE unit and its udev rule (infra/units.py). Runs inside mmdebstrap's namespace.
set -eu
root=$1
shift
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

# The SoftRoCE device: the same on every node, so baked in here, not written by cloud-init at
# boot. Its udev rule starts it when the data NIC appears (no target wants it).
while [ "$#" -ge 2 ]; do
  install -D -m 0644 "$1" "$root$2"
  shift 2
done

# What a lab node never uses, each a unit (and often a process) under emulation at every boot:
# consoles nobody logs in on, file systems and modules nothing mounts or loads, RDMA node
# descriptions (an InfiniBand subnet-manager matter), hotplug of NICs, utmp records.
chroot "$root" systemctl mask getty@tty1.service serial-getty@ttyS0.service \
  systemd-binfmt.service proc-sys-fs-binfmt_misc.automount proc-sys-fs-binfmt_misc.mount \
  sys-kernel-debug.mount sys-kernel-tracing.mount sys-kernel-config.mount \
  sys-fs-fuse-connections.mount dev-hugepages.mount dev-mqueue.mount \
  modprobe@drm.service modprobe@efi_pstore.service modprobe@fuse.service modprobe@loop.service \
  modprobe@dm_mod.service modprobe@configfs.service systemd-pstore.service \
  rdma-ndd.service cloud-init-hotplugd.socket systemd-update-utmp.service \
  systemd-update-utmp-runlevel.service
# Drivers for the PC board's devices a lab node never uses (IDE, floppy, speaker, SMBus, PS/2
# mouse, nested KVM): udev would load and probe each at every boot, under emulation.
printf 'blacklist %s\n' ata_piix ata_generic pata_acpi floppy pcspkr i2c_piix4 psmouse serio_raw \
  kvm_amd kvm_intel kvm ccp evdev > "$root/etc/modprobe.d/rxelab-unused.conf"

# cloud-init's four stages in one Python process (cloud-init-stages says why), started where
# the first one was; the units that would start the others apart are masked. The generator that
# enables cloud-init at every boot runs ds-identify, a long shell script, before any unit can
# start: enabled here once instead (the kernel command line says cloud-init=enabled).
install -D -m 0755 "$here/cloud-init-stages" "$root/usr/local/libexec/rxelab-cloud-init-stages"
mkdir -p "$root/etc/systemd/system/cloud-init-local.service.d"
printf '[Service]\nExecStart=\nExecStart=/usr/local/libexec/rxelab-cloud-init-stages\n' \
  > "$root/etc/systemd/system/cloud-init-local.service.d/rxelab-one-process.conf"
# (Debian 13's cloud-init 25 runs its stages in one process of its own too, cloud-init-main,
# but only as far as systemd lets each stage's unit start: network-online, multi-user. Ours
# does not wait for those; its units are masked with the rest. A name a release lacks is
# masked all the same.)
chroot "$root" systemctl mask cloud-init.service cloud-init-network.service cloud-config.service \
  cloud-final.service cloud-init-main.service
mkdir -p "$root/etc/systemd/system-generators" "$root/etc/systemd/system/multi-user.target.wants"
ln -sf /dev/null "$root/etc/systemd/system-generators/cloud-init-generator"
ln -sf /lib/systemd/system/cloud-init.target "$root/etc/systemd/system/multi-user.target.wants/cloud-init.target"

# Slurm: each lab writes its own MUNGE key and slurm.conf (cloud-init, from the seed): never
# one baked into every image. munged and slurmd start once cloud-init wrote them; slurmctld
# only on the node the seed makes the controller.
rm -f "$root/etc/munge/munge.key"
# After ssh and the RDMA device, too: a node is ready (SSH, rxe0) first, and the daemons'
# start-up under emulation does not hold that up.
for unit in munge slurmd slurmctld; do
  mkdir -p "$root/etc/systemd/system/$unit.service.d"
  printf '[Unit]\nAfter=cloud-init-local.service ssh.service rxe0.service\n' \
    > "$root/etc/systemd/system/$unit.service.d/rxelab.conf"
done
printf 'ConditionPathExists=/etc/munge/munge.key\n' >> "$root/etc/systemd/system/munge.service.d/rxelab.conf"
printf 'After=munge.service\n' >> "$root/etc/systemd/system/slurmd.service.d/rxelab.conf"
printf 'After=munge.service\nConditionPathExists=/etc/slurm/rxelab-controller\n' \
  >> "$root/etc/systemd/system/slurmctld.service.d/rxelab.conf"
chroot "$root" systemctl enable munge.service slurmd.service slurmctld.service
# Slurm's PMIx plugin (srun --mpi=pmix) loads libpmix.so by that name, which only libpmix-dev
# ships (with headers and three more -dev packages): the one link, instead.
ln -sf libpmix.so.2 "$root/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so"

# sshd starts last on the way to ready: no second run of it (`sshd -t`) to test a fixed config.
mkdir -p "$root/etc/systemd/system/ssh.service.d"
printf '[Service]\nExecStartPre=\n' > "$root/etc/systemd/system/ssh.service.d/rxelab.conf"
# Every job, mpirun and test logs in over SSH: the lab's sshd offers curve25519 key exchange,
# not OpenSSH 9's default post-quantum hybrid (sntrup761x25519: measured 1.8 s per node-to-node
# login under TCG, 0.7 s with curve25519), and a login runs no motd scripts.
printf 'KexAlgorithms curve25519-sha256,curve25519-sha256@libssh.org\n' \
  > "$root/etc/ssh/sshd_config.d/rxelab.conf"
sed -i '/pam_motd\.so\|pam_mail\.so/s/^session/#session/' "$root/etc/pam.d/sshd"

# The journal in memory: nothing to flush to disk at boot (the serial log outlives the node).
mkdir -p "$root/etc/systemd/journald.conf.d"
printf '[Journal]\nStorage=volatile\n' > "$root/etc/systemd/journald.conf.d/rxelab.conf"

# Only what SoftRoCE user space needs at boot (no iSER, no NFS over RDMA).
printf 'ib_uverbs\nrdma_ucm\n' > "$root/etc/rdma/modules/rdma.conf"
printf '* soft memlock unlimited\n* hard memlock unlimited\n' > "$root/etc/security/limits.d/90-rdma.conf"
echo "net.ipv4.ping_group_range = 0 2147483647" > "$root/etc/sysctl.d/90-ping.conf"

# Smaller image: drop module trees a virtio guest never loads.
cd "$root"/usr/lib/modules/*/kernel
rm -rf drivers/gpu drivers/media drivers/staging drivers/iio drivers/hwmon drivers/net/wireless \
  drivers/net/ethernet drivers/bluetooth drivers/isdn sound net/wireless net/mac80211 net/bluetooth
chroot "$root" sh -c 'depmod -a $(ls /usr/lib/modules)'
"$here/make-initrd.sh" "$root"
