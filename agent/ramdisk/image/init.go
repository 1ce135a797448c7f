package image

// initScript is the ramdisk's /init, run by busybox's sh: mount the kernel
// filesystems, load the modules in the order BuildBase resolved, bring every
// NIC up with DHCP, and hand over to bcd. Progress goes to the console, which
// is the machine's serial log.
const initScript = `#!/bin/sh
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
echo "bcd-init: starting bcd ramdisk"
exec /bin/bcd ramdisk
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
