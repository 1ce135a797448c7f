package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/ramdisk"
	"github.com/better-compute/better-compute/internal/buildinfo"
)

// ramdiskCommand is the agent of a machine booted into the ramdisk.
func ramdiskCommand() *cobra.Command {
	var (
		config, bootMAC, simulateGPUs, inventoryFile string
		simulate                                     bool
		timeout, waitInterval                        time.Duration
		diskFiles                                    map[string]string
	)
	cmd := &cobra.Command{
		Use:   "ramdisk",
		Short: "Run as the ramdisk's agent: report the inventory with the boot token, run the steps answered",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("agent", "bcd-ramdisk")
			err := runRamdisk(cmd.Context(), log, ramdiskFlags{
				config: config, bootMAC: bootMAC, simulateGPUs: simulateGPUs, inventoryFile: inventoryFile,
				simulate: simulate, timeout: timeout, waitInterval: waitInterval, diskFiles: diskFiles,
			})
			// As the ramdisk's init, returning would panic the kernel:
			// say why on the console and power off instead, so the
			// control plane sees a machine that is off, not one hung.
			if os.Getpid() == 1 && !simulate {
				if err != nil {
					log.Error("ramdisk failed; powering off", "error", err.Error())
				}
				return ramdisk.Host{}.PowerOff(context.Background())
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&config, "config", "", "boot config (RamdiskBootConfig) file or http(s) URL (default "+protocol.RamdiskBootConfigPath+", else bcd.config= on the kernel command line)")
	f.StringVar(&bootMAC, "boot-mac", "", "MAC the machine booted from (default what /init found, else BOOTIF=)")
	f.StringVar(&simulateGPUs, "simulate-gpus", "", "report simulated GPUs, e.g. 8xH100-SXM5-80GB")
	f.BoolVar(&simulate, "simulate", false, "run on a host for a simulated machine: the inventory comes from --inventory, steps touch nothing, power-off exits")
	f.StringVar(&inventoryFile, "inventory", "", "NodeInventory v1 file of the simulated machine (with --simulate)")
	f.StringToStringVar(&diskFiles, "disk-file", nil, "with --simulate: the file holding a disk's bytes, name=path (repeatable), which write-image and write-seed write")
	f.DurationVar(&timeout, "timeout", 0, "give up after this long (0: never; the control plane's deadline powers the machine off)")
	f.DurationVar(&waitInterval, "wait-interval", ramdisk.DefaultWaitInterval, "how often the wait step re-reports")
	return cmd
}

type ramdiskFlags struct {
	config, bootMAC, simulateGPUs, inventoryFile string
	simulate                                     bool
	timeout, waitInterval                        time.Duration
	diskFiles                                    map[string]string
}

func runRamdisk(ctx context.Context, log *slog.Logger, f ramdiskFlags) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if f.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, f.timeout)
		defer cancel()
	}
	cmdline := ""
	if b, err := os.ReadFile("/proc/cmdline"); err == nil && !f.simulate {
		cmdline = string(b)
	}
	src := f.config
	if src == "" {
		src = protocol.RamdiskBootConfigPath
		if _, err := os.Stat(src); err != nil {
			if u := ramdisk.CmdlineParam(cmdline, ramdisk.CmdlineConfigKey); u != "" {
				src = u
			}
		}
	}
	cfg, err := ramdisk.LoadConfig(ctx, src)
	if err != nil {
		return err
	}
	a := &ramdisk.Agent{Config: cfg, Log: log, WaitInterval: f.waitInterval, BootMAC: f.bootMAC}
	if f.simulate {
		if f.inventoryFile == "" {
			return errors.New("--simulate needs --inventory")
		}
		a.Machine = &ramdisk.Simulated{InventoryFile: f.inventoryFile, DiskFiles: f.diskFiles}
	} else {
		a.Machine = ramdisk.Host{SimulateGPUs: f.simulateGPUs, AgentVersion: "bcd/" + buildinfo.Get().Version}
		if a.BootMAC == "" {
			a.BootMAC = ramdisk.BootMAC(ramdisk.BootMACFile, cmdline)
		}
	}
	log.Info("starting", "version", buildinfo.Get().Version, "api", cfg.APIURL, "purpose", cfg.Purpose, "bootId", cfg.BootID, "bootMac", a.BootMAC)
	return a.Run(ctx)
}
