package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/agent/site"
	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/drivers/bmc"
)

// siteCommand is `bcd site`: the site agent. It holds the site's boot lease
// and, while it does, serves the site's Temporal task queue.
func siteCommand() *cobra.Command {
	var (
		o                        site.Options
		kernel, ramdisk, cmdline string
		limits                   drivers.Limits
		policy                   drivers.Policy
	)
	cmd := &cobra.Command{
		Use:   "site",
		Short: "The site agent: hold the site's lease and serve its Temporal task queue",
		Long: "Run the site agent of the site of a site token. Many may run for one site; the one holding the\n" +
			"site's boot lease serves the site's task queue (site-<siteId>), the others wait to take over.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Token == "" {
				o.Token = os.Getenv("BCD_SITE_TOKEN")
			}
			if o.APIURL == "" || o.Token == "" {
				return fmt.Errorf("--api and --token (or $BCD_SITE_TOKEN) are required")
			}
			if o.Holder == "" {
				host, err := os.Hostname()
				if err != nil || host == "" {
					host = "bcd-site"
				}
				o.Holder = host + "-" + strconv.Itoa(os.Getpid())
			}
			if kernel != "" || ramdisk != "" {
				images, err := site.NewRamdiskImages(kernel, ramdisk, cmdline)
				if err != nil {
					return err
				}
				o.Boot.Images = images
			}
			o.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
			// Redfish first: it serves every concern; IPMI is the failover
			// for power and boot.
			o.BMC = drivers.NewRegistry(limits, o.Logger, bmc.NewRedfish(bmc.RedfishOptions{Policy: policy}), bmc.NewIPMI(bmc.IPMIOptions{Policy: policy}))
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return site.Run(ctx, o)
		},
	}
	cmd.AddCommand(dnsmasqConfigCommand())
	f := cmd.Flags()
	f.StringVar(&o.APIURL, "api", "", "the API's base URL, e.g. https://compute.example.com")
	f.StringVar(&o.Token, "token", "", "the site token (bcst_…; default $BCD_SITE_TOKEN)")
	f.StringVar(&o.Holder, "holder", "", "this instance's id, the lease holder (default hostname-pid)")
	f.StringVar(&o.Boot.Listen, "boot-listen", "", "the boot server's address, e.g. :8081 (none when empty: no ramdisk boots)")
	f.StringVar(&o.Boot.URL, "boot-url", "", "how machines and BMCs reach the boot server (default http://<boot-listen>)")
	f.StringVar(&o.Boot.MachineURL, "machine-boot-url", "", "how a booted ramdisk reaches the boot server for its image, when not as BMCs do (default --boot-url)")
	f.StringVar(&o.Boot.MachineAPIURL, "machine-api-url", "", "how a booted ramdisk reaches the API (default --api)")
	f.StringVar(&o.Boot.Dir, "boot-dir", "", "where the boots' pieces and the staged images are cached (default a temporary directory)")
	f.StringVar(&o.Boot.MachineAgentEndpoint, "machine-agent-endpoint", "",
		"the agent listener as machines reach it, for a deployed machine's re-join (default the one the join answers)")
	f.StringVar(&kernel, "kernel", "", "the ramdisk's kernel image (make ramdisk)")
	f.StringVar(&ramdisk, "ramdisk", "", "the ramdisk's base initramfs (make ramdisk)")
	f.IntVar(&limits.PerBMC, "bmc-sessions", 1, "calls in flight to one BMC at most")
	f.IntVar(&limits.PerSite, "bmc-site-calls", 16, "BMC calls in flight across the site at most")
	f.DurationVar(&policy.ReadBackFor, "bmc-readback", 30*time.Second, "how long reads wait for one BMC write to show before it is issued again")
	f.StringVar(&cmdline, "kernel-cmdline", "", "the ramdisk's kernel command line (default the image package's)")
	return cmd
}

// dnsmasqConfigCommand prints the dnsmasq configuration of a site's PXE
// boots: DHCP and TFTP hand machines iPXE, iPXE the boot server's script.
func dnsmasqConfigCommand() *cobra.Command {
	var o site.DnsmasqOptions
	cmd := &cobra.Command{
		Use:   "dnsmasq-config",
		Short: "Print a dnsmasq configuration that network-boots the site's machines from the boot server",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := site.DnsmasqConfig(o)
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), cfg)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.BootURL, "boot-url", "", "the boot server as the machines reach it (bcd site --boot-url)")
	f.StringVar(&o.Interface, "interface", "", "the machines' network interface")
	f.StringVar(&o.Range, "dhcp-range", "", `dnsmasq's dhcp-range, e.g. "10.0.0.100,10.0.0.200,12h" or "10.0.0.0,proxy"`)
	f.StringVar(&o.TFTPRoot, "tftp-root", "/usr/lib/ipxe", "where undionly.kpxe and ipxe.efi lie")
	return cmd
}
