//go:build linux

package inventory

import (
	"net"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ethtoolInfo is what the SIOCETHTOOL ioctl tells about an interface.
type ethtoolInfo struct {
	permAddr string
	firmware string
	driver   string
}

// ifreqData is struct ifreq with the ifr_data pointer ethtool commands use;
// x/sys/unix's Ifreq has no exported way to carry a pointer.
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [16]byte // rest of the union
}

// ethtoolPermAddr is struct ethtool_perm_addr with room for MAX_ADDR_LEN.
type ethtoolPermAddr struct {
	cmd  uint32
	size uint32
	data [32]byte
}

// ethtool asks the driver for the factory MAC and firmware version. Any
// failure (no driver support, virtio, permissions) leaves fields empty so
// the caller keeps the address file's MAC.
func ethtool(name string) ethtoolInfo {
	var info ethtoolInfo
	if len(name) >= unix.IFNAMSIZ {
		return info
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return info
	}
	defer unix.Close(fd)

	if drv, err := unix.IoctlGetEthtoolDrvinfo(fd, name); err == nil {
		info.driver = unix.ByteSliceToString(drv.Driver[:])
		info.firmware = unix.ByteSliceToString(drv.Fw_version[:])
		if info.firmware == "N/A" {
			info.firmware = ""
		}
	}

	pa := ethtoolPermAddr{cmd: unix.ETHTOOL_GPERMADDR, size: uint32(len(ethtoolPermAddr{}.data))}
	var ifr ifreqData
	copy(ifr.name[:], name)
	ifr.data = unsafe.Pointer(&pa)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); errno != 0 {
		return info
	}
	if pa.size == 0 || pa.size > uint32(len(pa.data)) {
		return info
	}
	addr := net.HardwareAddr(pa.data[:pa.size])
	for _, b := range addr {
		if b != 0 {
			info.permAddr = addr.String()
			break
		}
	}
	return info
}
