// Command redfish-emulator serves emulated BMCs over HTTPS for trying the
// Redfish driver by hand or from the dev stack: simulated machines, or QEMU
// TCG machines that really boot. It prints one JSON line per BMC (its id,
// URL and the machine's MAC) and serves until interrupted.
//
// The password comes from $REDFISH_EMULATOR_PASSWORD and is never printed.
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/better-compute/better-compute/drivers/machines"
	"github.com/better-compute/better-compute/drivers/machines/qemu"
	"github.com/better-compute/better-compute/drivers/machines/sim"
	"github.com/better-compute/better-compute/drivers/redfish/emulator"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "redfish-emulator:", err)
		os.Exit(1)
	}
}

func run() error {
	host := flag.String("host", "127.0.0.1", "address the BMCs listen on")
	basePort := flag.Int("base-port", 0, "port of the first BMC, the next ones follow (0: free ports)")
	simCount := flag.Int("sim", 1, "simulated machines")
	qemuCount := flag.Int("qemu", 0, "QEMU TCG machines")
	cdMode := flag.String("cd-mode", string(qemu.ModeDirect), "how a QEMU machine boots a CD: iso (the firmware) or direct (the ISO's /boot/vmlinuz and /boot/initrd.img)")
	stateDir := flag.String("state-dir", "", "where QEMU disks and fetched media live (a temporary directory when empty)")
	user := flag.String("user", "admin", "the BMCs' user name")
	caOut := flag.String("ca-out", "", "write the certificate authority's PEM to this file")
	taskDelay := flag.Duration("task-delay", time.Second, "how long BMC tasks (BIOS reset, firmware update) take")
	flag.Parse()

	password := os.Getenv("REDFISH_EMULATOR_PASSWORD")
	if password == "" {
		return errors.New("set REDFISH_EMULATOR_PASSWORD")
	}
	dir := *stateDir
	if dir == "" {
		d, err := os.MkdirTemp("", "redfish-emulator-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	e, err := emulator.New(emulator.Config{
		Username: *user, Password: password, TaskDelay: *taskDelay,
		MediaDir: filepath.Join(dir, "media"), Hosts: []string{*host}, Logger: log,
	})
	if err != nil {
		return err
	}
	defer e.Close()
	if *caOut != "" {
		if err := os.WriteFile(*caOut, e.CAPEM(), 0o644); err != nil {
			return err
		}
	}
	out := json.NewEncoder(os.Stdout)
	for i := 0; i < *simCount+*qemuCount; i++ {
		info := machines.Info{
			UUID: newUUID(), SerialNumber: fmt.Sprintf("EMU-%04d", i+1), Manufacturer: "Better Compute",
			MAC: fmt.Sprintf("52:54:00:bc:%02x:%02x", (i+1)>>8, (i+1)&0xff), CPUs: 1, MemoryMiB: 512,
		}
		var m machines.Machine
		id := fmt.Sprintf("bmc-%d", i+1)
		if i < *simCount {
			info.Model = "Simulated"
			m = sim.New(sim.Config{Info: info})
		} else {
			info.Model = "QEMU TCG"
			qm, err := qemu.New(qemu.Config{Info: info, Dir: filepath.Join(dir, id), CDMode: qemu.BootMode(*cdMode), Logger: log})
			if err != nil {
				return err
			}
			m = qm
		}
		addr := net.JoinHostPort(*host, "0")
		if *basePort > 0 {
			addr = net.JoinHostPort(*host, strconv.Itoa(*basePort+i))
		}
		b, err := e.AddBMCAt(addr, id, m)
		if err != nil {
			m.Close()
			return err
		}
		if err := out.Encode(map[string]string{"id": id, "url": b.URL(), "mac": info.MAC, "kind": info.Model}); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	return nil
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
