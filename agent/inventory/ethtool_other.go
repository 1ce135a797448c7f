//go:build !linux

package inventory

type ethtoolInfo struct {
	permAddr string
	firmware string
	driver   string
}

// ethtool is Linux-only; elsewhere the address file's MAC is kept.
func ethtool(string) ethtoolInfo { return ethtoolInfo{} }
