package site

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The dnsmasq configuration hands firmware PXE clients iPXE and iPXE the
// boot server's script; dnsmasq itself accepts it where it is installed.
func TestDnsmasqConfig(t *testing.T) {
	for _, c := range []struct{ rng, want string }{
		{"10.0.0.100,10.0.0.200,12h", "dhcp-boot=tag:!ipxe,tag:!efi64,undionly.kpxe"},
		{"10.0.0.0,proxy", `pxe-service=tag:!ipxe,x86PC,"iPXE",undionly.kpxe`},
	} {
		cfg, err := DnsmasqConfig(DnsmasqOptions{BootURL: "http://10.0.0.2:8081/", Interface: "lo", Range: c.rng})
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"port=0", "interface=lo", "dhcp-range=" + c.rng, "tftp-root=/usr/lib/ipxe",
			"dhcp-boot=tag:ipxe,http://10.0.0.2:8081/boot/ipxe", c.want} {
			if !strings.Contains(cfg, want+"\n") {
				t.Fatalf("the configuration lacks %q:\n%s", want, cfg)
			}
		}
		if dnsmasq, err := exec.LookPath("dnsmasq"); err == nil {
			p := filepath.Join(t.TempDir(), "dnsmasq.conf")
			if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(dnsmasq, "--test", "--conf-file="+p).CombinedOutput(); err != nil {
				t.Fatalf("dnsmasq --test: %v: %s\n%s", err, out, cfg)
			}
		}
	}
	for _, o := range []DnsmasqOptions{
		{BootURL: "ftp://x", Interface: "lo", Range: "10.0.0.0,proxy"},
		{BootURL: "http://x", Range: "10.0.0.0,proxy"},
		{BootURL: "http://x", Interface: "lo\ndhcp-script=/bin/sh", Range: "10.0.0.0,proxy"},
	} {
		if _, err := DnsmasqConfig(o); err == nil {
			t.Fatalf("DnsmasqConfig(%+v) accepted it", o)
		}
	}
}
