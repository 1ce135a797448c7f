package site

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// DnsmasqOptions describes the PXE piece of a site that network-boots its
// machines: dnsmasq answers DHCP and TFTP on the machines' network, hands
// firmware PXE clients iPXE over TFTP, and hands iPXE the boot server's
// script, which chains to the machine's own by its MAC.
type DnsmasqOptions struct {
	// BootURL is the boot server as the machines reach it
	// (BootOptions.URL).
	BootURL string
	// Interface is the machines' network interface on the dnsmasq host.
	Interface string
	// Range is dnsmasq's dhcp-range: "10.0.0.100,10.0.0.200,12h" to serve
	// addresses, or "10.0.0.0,proxy" to leave addresses to the network's
	// own DHCP server (proxy DHCP).
	Range string
	// TFTPRoot holds undionly.kpxe and ipxe.efi (Debian's ipxe package
	// installs them in /usr/lib/ipxe).
	TFTPRoot string
}

// DnsmasqConfig is a dnsmasq configuration for o.
func DnsmasqConfig(o DnsmasqOptions) (string, error) {
	u, err := url.Parse(o.BootURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("site: the boot URL %q is not an http(s) URL", o.BootURL)
	}
	if o.Interface == "" || o.Range == "" {
		return "", errors.New("site: dnsmasq needs the machines' interface and a DHCP range")
	}
	for _, v := range []string{o.BootURL, o.Interface, o.Range, o.TFTPRoot} {
		if strings.ContainsAny(v, "\n\r") {
			return "", errors.New("site: dnsmasq options are one line each")
		}
	}
	root := o.TFTPRoot
	if root == "" {
		root = "/usr/lib/ipxe"
	}
	script := strings.TrimRight(o.BootURL, "/") + "/boot/ipxe"
	proxy := strings.HasSuffix(o.Range, ",proxy")
	var b strings.Builder
	fmt.Fprintf(&b, `# dnsmasq for the PXE boots of a Better Compute site (bcd site dnsmasq-config).
# DHCP and TFTP only: no DNS.
port=0
interface=%s
bind-interfaces
dhcp-range=%s
enable-tftp
tftp-root=%s
# iPXE says so in its user class; firmware PXE clients get iPXE first.
dhcp-userclass=set:ipxe,iPXE
dhcp-match=set:efi64,option:client-arch,7
dhcp-match=set:efi64,option:client-arch,9
`, o.Interface, o.Range, root)
	if proxy {
		fmt.Fprintf(&b, `pxe-prompt="Better Compute",0
pxe-service=tag:!ipxe,x86PC,"iPXE",undionly.kpxe
pxe-service=tag:!ipxe,X86-64_EFI,"iPXE",ipxe.efi
dhcp-boot=tag:ipxe,%s
`, script)
	} else {
		fmt.Fprintf(&b, `dhcp-boot=tag:!ipxe,tag:efi64,ipxe.efi
dhcp-boot=tag:!ipxe,tag:!efi64,undionly.kpxe
# iPXE fetches the boot server's script, which chains to its MAC's.
dhcp-boot=tag:ipxe,%s
`, script)
	}
	return b.String(), nil
}
