package ramdisk

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
)

// BootMACFile is where the ramdisk's /init writes the MAC of the NIC that
// got a DHCP lease.
const BootMACFile = "/run/bcd/boot-mac"

// CmdlineConfigKey is the kernel command-line parameter that points a
// ramdisk without a config in its initramfs (an iPXE boot) at a URL.
const CmdlineConfigKey = "bcd.config"

// LoadConfig reads a RamdiskBootConfig from a file or an http(s) URL.
func LoadConfig(ctx context.Context, src string) (protocol.RamdiskBootConfig, error) {
	var cfg protocol.RamdiskBootConfig
	var b []byte
	var err error
	if strings.HasPrefix(src, "http://") || strings.HasPrefix(src, "https://") {
		b, err = fetch(ctx, src)
	} else {
		b, err = os.ReadFile(src)
	}
	if err != nil {
		return cfg, fmt.Errorf("ramdisk: boot config: %w", err)
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		return cfg, fmt.Errorf("ramdisk: boot config %s: %w", src, err)
	}
	if cfg.APIURL == "" || cfg.Token == "" {
		return cfg, fmt.Errorf("ramdisk: boot config %s has no apiUrl or token", src)
	}
	return cfg, nil
}

func fetch(ctx context.Context, url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return io.ReadAll(io.LimitReader(resp.Body, 1<<20))
}

// CmdlineParam returns a parameter of a kernel command line ("" if absent).
func CmdlineParam(cmdline, key string) string {
	for _, f := range strings.Fields(cmdline) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}

// BootMAC finds the MAC the machine booted from: the one /init wrote, or
// PXE's BOOTIF=01-aa-bb-… on the kernel command line.
func BootMAC(macFile, cmdline string) string {
	if b, err := os.ReadFile(macFile); err == nil {
		if mac := strings.TrimSpace(string(b)); mac != "" {
			return strings.ToLower(mac)
		}
	}
	if v := CmdlineParam(cmdline, "BOOTIF"); len(v) == 20 && strings.HasPrefix(v, "01-") {
		return strings.ToLower(strings.ReplaceAll(v[3:], "-", ":"))
	}
	return ""
}
