package image

import "github.com/better-compute/better-compute/agent/protocol"

// initScript is the ramdisk's /init, run by busybox's sh: the shared
// prologue, then bcd ramdisk.
const initScript = initPrologue + `echo "bcd-init: starting bcd ramdisk"
exec /bin/bcd ramdisk
`

// initPrologue is what every /init of ours starts with: mount the kernel
// filesystems, load the modules in the order the build resolved, and bring
// the first NIC that gets a lease up with DHCP. Progress goes to the
// console, which is the machine's serial log.
const initPrologue = `#!/bin/sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
mkdir -p /dev/pts /run/bcd /tmp
echo "bcd-init: loading modules"
while read -r m; do
	[ -n "$m" ] && { insmod "$m" 2>/dev/null || echo "bcd-init: insmod $m failed"; }
done < /etc/bcd/modules
ip link set lo up
# A NIC appears once its driver probed it; give the bus a few seconds.
n=0
while [ $n -lt 50 ]; do
	for d in /sys/class/net/*; do [ -e "$d/device" ] && break 2; done
	n=$((n+1)); sleep 0.1
done
for d in /sys/class/net/*; do
	[ -e "$d/device" ] || continue
	i=${d##*/}
	ip link set "$i" up
	echo "bcd-init: dhcp on $i"
	if udhcpc -i "$i" -n -q -t 10 -T 1 -s /etc/bcd/udhcpc.script >/dev/null 2>&1; then
		cat "$d/address" > /run/bcd/boot-mac
		echo "bcd-init: $i up ($(cat /run/bcd/boot-mac))"
		break
	fi
done
`

// udhcpcScript applies a DHCP lease (busybox udhcpc calls it with the
// lease in its environment).
const udhcpcScript = `#!/bin/sh
case "$1" in
deconfig)
	ip addr flush dev "$interface"
	;;
bound|renew)
	ip addr flush dev "$interface"
	ip addr add "$ip/${mask:-24}" dev "$interface"
	for r in $router; do ip route add default via "$r" dev "$interface"; break; done
	: > /etc/resolv.conf
	for s in $dns; do echo "nameserver $s" >> /etc/resolv.conf; done
	;;
esac
exit 0
`

// diskInitScript is the test disk's /init: the shared prologue, then the
// installed system's first boot. It waits a few seconds for the seed
// partition (the disk driver probes it asynchronously), mounts it
// read-only, and runs `bcd node firstboot`, restarting it if it stops as a
// service manager would (its state directory, on the initramfs, keeps the
// identity of a join that succeeded). Without a seed the system idles, as
// an installed system nobody configured does.
const diskInitScript = initPrologue + `echo "bcd-init: disk boot; looking for LABEL=` + protocol.SeedLabel + `"
seed=""
n=0
while [ $n -lt 50 ]; do
	seed=$(findfs LABEL=` + protocol.SeedLabel + ` 2>/dev/null) && break
	seed=""
	n=$((n+1)); sleep 0.1
done
idle() {
	echo "bcd-init: $1; idle"
	while :; do sleep 3600; done
}
[ -n "$seed" ] || { cat /proc/partitions; idle "no seed partition"; }
mkdir -p ` + DiskSeedMount + ` ` + DiskStateDir + `
mount -t vfat -o ro "$seed" ` + DiskSeedMount + ` || idle "cannot mount $seed"
while :; do
	echo "bcd-init: seed on $seed; starting bcd node firstboot"
	/bin/bcd node firstboot --seed ` + DiskSeedMount + ` --state-dir ` + DiskStateDir + ` --no-gpus
	echo "bcd-init: bcd exited with status $?; restarting in 5 s"
	sleep 5
done
`
