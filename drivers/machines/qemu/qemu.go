// Package qemu is a machine that really boots: a QEMU TCG virtual machine
// (qemu-system-x86_64, no KVM) with a disk made at creation, a user-mode NIC
// with a fixed MAC (the guest reaches the host's loopback at 10.0.2.2), its
// serial console captured, and a QMP monitor. Power on starts the process,
// power off kills it, a reset is the monitor's system_reset, and a guest
// power-off ends the process, which reads back as off.
//
// A CD boots one of two ways. ModeISO hands the image to the firmware
// (-cdrom), the way real hardware boots virtual media. ModeDirect is the
// emulator's shortcut: it takes /boot/vmlinuz, /boot/initrd.img and
// /boot/cmdline.txt out of the ISO and boots them with -kernel, -initrd and
// -append, skipping the BIOS and the bootloader.
package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/drivers/machines"
)

// BootMode is how a CD boots.
type BootMode string

// The CD boot modes.
const (
	ModeISO    BootMode = "iso"
	ModeDirect BootMode = "direct"
)

// The files ModeDirect takes out of the ISO.
const (
	ISOKernel  = "/boot/vmlinuz"
	ISOInitrd  = "/boot/initrd.img"
	ISOCmdline = "/boot/cmdline.txt"
)

// Config is a QEMU machine's hardware.
type Config struct {
	// Info is the identity the BMC reports; Info.MAC is the NIC's MAC
	// (required). CPUs default to 1 and MemoryMiB to 512.
	Info machines.Info
	// Dir holds the disk, the monitor socket and the console log; a
	// temporary directory, removed by Close, when empty.
	Dir string
	// DiskMiB is the disk's size (256 when zero); DiskFormat "raw" (the
	// default, a sparse file) or "qcow2" (made with qemu-img).
	DiskMiB    int
	DiskFormat string
	// DiskInterface and NICModel are QEMU's names ("virtio" and
	// "virtio-net-pci" by default).
	DiskInterface string
	NICModel      string
	// NetdevOptions are appended to "-netdev user,id=net0": for example
	// ",tftp=/srv/tftp,bootfile=undionly.kpxe" for a PXE boot.
	NetdevOptions string
	// CDMode is how a CD boots (ModeISO when empty).
	CDMode BootMode
	// BootOrder applies when no override is set (disk then PXE when empty).
	BootOrder []drivers.BootDevice
	// QEMU and Xorriso are the binaries ("qemu-system-x86_64", "xorriso").
	QEMU    string
	Xorriso string
	// ExtraArgs are appended to QEMU's command line.
	ExtraArgs []string
	Logger    *slog.Logger
}

// Machine is a QEMU TCG virtual machine.
type Machine struct {
	cfg     Config
	dir     string
	ownsDir bool
	disk    string
	serial  *machines.Ring
	logFile *os.File
	log     *slog.Logger

	mu       sync.Mutex
	proc     *process
	override machines.Override
	media    map[string]machines.Media
	direct   map[string]directBoot // by media path
	boots    int
	closed   bool
}

// process is one run of QEMU: from power on to power off.
type process struct {
	cmd    *exec.Cmd
	socket string
	boot   launch
	done   chan struct{}
	stderr *machines.Ring
	stdin  *os.File
}

// launch is what a run of QEMU boots: a reset keeps the run when the next
// boot would be the same.
type launch struct {
	device drivers.BootDevice
	media  string
}

type directBoot struct {
	kernel, initrd, cmdline string
}

var _ machines.Machine = (*Machine)(nil)
var _ machines.Shutdowner = (*Machine)(nil)
var _ machines.NMIer = (*Machine)(nil)

// New creates the machine and its disk, powered off.
func New(cfg Config) (*Machine, error) {
	if cfg.Info.MAC == "" {
		return nil, errors.New("qemu: a MAC is required")
	}
	if cfg.Info.CPUs <= 0 {
		cfg.Info.CPUs = 1
	}
	if cfg.Info.MemoryMiB <= 0 {
		cfg.Info.MemoryMiB = 512
	}
	if cfg.DiskMiB <= 0 {
		cfg.DiskMiB = 256
	}
	if cfg.DiskFormat == "" {
		cfg.DiskFormat = "raw"
	}
	if cfg.DiskInterface == "" {
		cfg.DiskInterface = "virtio"
	}
	if cfg.NICModel == "" {
		cfg.NICModel = "virtio-net-pci"
	}
	if cfg.CDMode == "" {
		cfg.CDMode = ModeISO
	}
	if cfg.QEMU == "" {
		cfg.QEMU = "qemu-system-x86_64"
	}
	if cfg.Xorriso == "" {
		cfg.Xorriso = "xorriso"
	}
	m := &Machine{cfg: cfg, serial: machines.NewRing(0), media: map[string]machines.Media{}, direct: map[string]directBoot{}, log: cfg.Logger}
	if m.log == nil {
		m.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	m.dir = cfg.Dir
	if m.dir == "" {
		dir, err := os.MkdirTemp("", "qemu-machine-")
		if err != nil {
			return nil, fmt.Errorf("qemu: %w", err)
		}
		m.dir, m.ownsDir = dir, true
	} else if err := os.MkdirAll(m.dir, 0o755); err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	if err := m.createDisk(); err != nil {
		m.removeDir()
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(m.dir, "serial.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		m.removeDir()
		return nil, fmt.Errorf("qemu: console log: %w", err)
	}
	m.logFile = f
	return m, nil
}

func (m *Machine) createDisk() error {
	size := int64(m.cfg.DiskMiB) << 20
	switch m.cfg.DiskFormat {
	case "raw":
		m.disk = filepath.Join(m.dir, "disk.raw")
		f, err := os.Create(m.disk)
		if err != nil {
			return fmt.Errorf("qemu: disk: %w", err)
		}
		defer f.Close()
		if err := f.Truncate(size); err != nil {
			return fmt.Errorf("qemu: disk: %w", err)
		}
	case "qcow2":
		m.disk = filepath.Join(m.dir, "disk.qcow2")
		out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", m.disk, fmt.Sprint(size)).CombinedOutput()
		if err != nil {
			return fmt.Errorf("qemu: qemu-img create: %w: %s", err, out)
		}
	default:
		return fmt.Errorf("qemu: disk format %q: %w", m.cfg.DiskFormat, machines.ErrUnsupported)
	}
	return nil
}

func (m *Machine) removeDir() {
	if m.ownsDir {
		_ = os.RemoveAll(m.dir)
	}
}

// Info is the machine's identity.
func (m *Machine) Info() machines.Info { return m.cfg.Info }

// Dir is where the disk, the monitor socket and serial.log are.
func (m *Machine) Dir() string { return m.dir }

// DiskPath is the disk image's file.
func (m *Machine) DiskPath() string { return m.disk }

// SerialLog is the console's recent output.
func (m *Machine) SerialLog() []byte { return m.serial.Bytes() }

// Console is the console's buffer (its Written counts every byte).
func (m *Machine) Console() *machines.Ring { return m.serial }

// Boots is how many times QEMU was started or reset by the BMC.
func (m *Machine) Boots() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.boots
}

// PowerState is on while the QEMU process runs.
func (m *Machine) PowerState(context.Context) (drivers.PowerState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.runningLocked() {
		return drivers.PowerOn, nil
	}
	return drivers.PowerOff, nil
}

func (m *Machine) runningLocked() bool {
	if m.proc == nil {
		return false
	}
	select {
	case <-m.proc.done:
		m.proc = nil
		return false
	default:
		return true
	}
}

// PowerOn starts QEMU unless it runs.
func (m *Machine) PowerOn(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return machines.ErrClosed
	}
	if m.runningLocked() {
		return nil
	}
	return m.startLocked(ctx)
}

// PowerOff kills QEMU: power removed, nothing asked of the guest.
func (m *Machine) PowerOff(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.killLocked()
	return nil
}

// Reset is the monitor's system_reset when the next boot is the one this
// run of QEMU was started for; otherwise (a new override or medium for the
// boot) QEMU is restarted, which the guest sees the same way.
func (m *Machine) Reset(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.runningLocked() {
		return machines.ErrPoweredOff
	}
	next, _ := m.nextBootLocked()
	if next == m.proc.boot {
		if _, err := qmp(ctx, m.proc.socket, "system_reset", nil); err != nil {
			return err
		}
		m.consumeOnceLocked()
		m.boots++
		return nil
	}
	m.killLocked()
	return m.startLocked(ctx)
}

// Shutdown presses the ACPI power button; the guest may ignore it.
func (m *Machine) Shutdown(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.runningLocked() {
		return nil
	}
	_, err := qmp(ctx, m.proc.socket, "system_powerdown", nil)
	return err
}

// NMI injects a non-maskable interrupt.
func (m *Machine) NMI(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.runningLocked() {
		return machines.ErrPoweredOff
	}
	_, err := qmp(ctx, m.proc.socket, "inject-nmi", nil)
	return err
}

// SerialInput types p on the serial console.
func (m *Machine) SerialInput(p []byte) error {
	m.mu.Lock()
	proc := m.proc
	m.mu.Unlock()
	if proc == nil {
		return machines.ErrPoweredOff
	}
	_, err := proc.stdin.Write(p)
	return err
}

// SetCDMode switches how the next CD boot boots.
func (m *Machine) SetCDMode(mode BootMode) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cfg.CDMode = mode
}

// SetBootOverride sets the next boot device.
func (m *Machine) SetBootOverride(_ context.Context, target drivers.BootDevice, persistent bool) error {
	o, err := machines.NewOverride(target, persistent)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.override = o
	return nil
}

// BootOverride is the override in force.
func (m *Machine) BootOverride(context.Context) (machines.Override, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.override, nil
}

// InsertMedia puts an ISO in the CD drive, live when QEMU runs. USB sticks
// are not wired to QEMU machines.
func (m *Machine) InsertMedia(ctx context.Context, media machines.Media) error {
	if media.Kind != machines.MediaCD {
		return fmt.Errorf("media kind %q: %w", media.Kind, machines.ErrUnsupported)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.runningLocked() {
		args := map[string]any{"device": "cd0", "filename": media.Path, "format": "raw"}
		if _, err := qmp(ctx, m.proc.socket, "blockdev-change-medium", args); err != nil {
			return err
		}
	}
	m.media[media.Kind] = media
	return nil
}

// EjectMedia empties the CD drive.
func (m *Machine) EjectMedia(ctx context.Context, kind string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.media[kind]; !ok {
		return nil
	}
	if kind == machines.MediaCD && m.runningLocked() {
		if _, err := qmp(ctx, m.proc.socket, "eject", map[string]any{"device": "cd0", "force": true}); err != nil {
			return err
		}
	}
	media := m.media[kind]
	delete(m.media, kind)
	delete(m.direct, media.Path)
	return nil
}

// Close kills QEMU and removes what the machine made in a directory of
// its own.
func (m *Machine) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	m.killLocked()
	err := m.logFile.Close()
	m.removeDir()
	return err
}

func (m *Machine) nextBootLocked() (launch, bool) {
	cd, inserted := m.media[machines.MediaCD]
	dev, consumed := machines.ChooseBoot(m.override, m.cfg.BootOrder, inserted)
	l := launch{device: dev}
	if dev == drivers.BootCD {
		l.media = cd.Path
	}
	return l, consumed
}

func (m *Machine) consumeOnceLocked() {
	if _, consumed := m.nextBootLocked(); consumed {
		m.override = machines.Override{}
	}
}

// qemuBootLetter is SeaBIOS's name for a device in -boot order.
func qemuBootLetter(d drivers.BootDevice) string {
	switch d {
	case drivers.BootCD:
		return "d"
	case drivers.BootPXE:
		return "n"
	}
	return "c"
}

func (m *Machine) args(ctx context.Context, boot launch) ([]string, error) {
	info := m.cfg.Info
	socket := filepath.Join(m.dir, "qmp.sock")
	args := []string{
		"-machine", "pc", "-accel", "tcg",
		"-m", fmt.Sprint(info.MemoryMiB), "-smp", fmt.Sprint(info.CPUs),
		"-nographic", "-monitor", "none", "-serial", "stdio",
		"-qmp", "unix:" + socket + ",server=on,wait=off",
		"-uuid", info.UUID,
		"-smbios", "type=1,manufacturer=" + smbiosValue(info.Manufacturer) + ",product=" + smbiosValue(info.Model) + ",serial=" + smbiosValue(info.SerialNumber),
		"-drive", "file=" + m.disk + ",format=" + m.cfg.DiskFormat + ",if=" + m.cfg.DiskInterface,
		"-netdev", "user,id=net0" + m.cfg.NetdevOptions,
		"-device", m.cfg.NICModel + ",netdev=net0,mac=" + info.MAC,
	}
	if info.UUID == "" {
		args = removePair(args, "-uuid")
	}
	cdDrive := "id=cd0,if=ide,media=cdrom"
	if cd, ok := m.media[machines.MediaCD]; ok {
		cdDrive += ",format=raw,file=" + cd.Path
	}
	args = append(args, "-drive", cdDrive)
	order := qemuBootLetter(boot.device)
	for _, d := range m.cfg.BootOrder {
		if l := qemuBootLetter(d); !strings.Contains(order, l) {
			order += l
		}
	}
	switch {
	case boot.device == drivers.BootCD && m.cfg.CDMode == ModeDirect:
		db, err := m.extractLocked(ctx, boot.media)
		if err != nil {
			return nil, err
		}
		args = append(args, "-kernel", db.kernel, "-initrd", db.initrd, "-append", db.cmdline)
		// The kernel boots before any option ROM could: without the NIC's
		// iPXE ROM the firmware skips its two-second prompt.
		for i, a := range args {
			if strings.HasPrefix(a, m.cfg.NICModel+",netdev=net0,") {
				args[i] = a + ",romfile="
			}
		}
	case boot.device == drivers.BootBIOS:
		args = append(args, "-boot", "order="+order+",menu=on")
	default:
		args = append(args, "-boot", "order="+order)
	}
	return append(args, m.cfg.ExtraArgs...), nil
}

func smbiosValue(s string) string { return strings.ReplaceAll(s, ",", ",,") }

func removePair(args []string, flag string) []string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag {
			return append(args[:i:i], args[i+2:]...)
		}
	}
	return args
}

// extractLocked takes the kernel, initrd and command line out of an ISO
// once per inserted image.
func (m *Machine) extractLocked(ctx context.Context, iso string) (directBoot, error) {
	if db, ok := m.direct[iso]; ok {
		return db, nil
	}
	dir, err := os.MkdirTemp(m.dir, "direct-")
	if err != nil {
		return directBoot{}, fmt.Errorf("qemu: %w", err)
	}
	db := directBoot{kernel: filepath.Join(dir, "vmlinuz"), initrd: filepath.Join(dir, "initrd.img")}
	cmdlinePath := filepath.Join(dir, "cmdline.txt")
	cmd := exec.CommandContext(ctx, m.cfg.Xorriso, "-osirrox", "on", "-indev", iso,
		"-extract", ISOKernel, db.kernel, "-extract", ISOInitrd, db.initrd)
	if out, err := cmd.CombinedOutput(); err != nil {
		return directBoot{}, fmt.Errorf("qemu: direct boot: %s has no %s and %s: %w: %s", iso, ISOKernel, ISOInitrd, err, lastLines(out, 3))
	}
	// The command line is optional.
	_ = exec.CommandContext(ctx, m.cfg.Xorriso, "-osirrox", "on", "-indev", iso, "-extract", ISOCmdline, cmdlinePath).Run()
	if b, err := os.ReadFile(cmdlinePath); err == nil {
		db.cmdline = strings.TrimSpace(string(b))
	}
	if !strings.Contains(db.cmdline, "console=") {
		db.cmdline = strings.TrimSpace(db.cmdline + " console=ttyS0")
	}
	m.direct[iso] = db
	return db, nil
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

func (m *Machine) startLocked(ctx context.Context) error {
	boot, consumed := m.nextBootLocked()
	args, err := m.args(ctx, boot)
	if err != nil {
		return err
	}
	socket := filepath.Join(m.dir, "qmp.sock")
	_ = os.Remove(socket)
	// The process outlives the request that powered the machine on.
	cmd := exec.Command(m.cfg.QEMU, args...)
	// The console's input is a pipe of our own, so that nothing but
	// SerialInput types on it.
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	cmd.Stdin = stdinR
	stderr := machines.NewRing(16 << 10)
	cmd.Stdout = io.MultiWriter(m.serial, m.logFile)
	cmd.Stderr = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		stdinR.Close()
		stdinW.Close()
		return fmt.Errorf("qemu: start: %w", err)
	}
	stdinR.Close()
	p := &process{cmd: cmd, socket: socket, boot: boot, done: make(chan struct{}), stderr: stderr, stdin: stdinW}
	go func() {
		err := cmd.Wait()
		stdinW.Close()
		m.log.Debug("qemu exited", "mac", m.cfg.Info.MAC, "err", err, "stderr", string(stderr.Bytes()))
		close(p.done)
	}()
	// The monitor socket appears once QEMU has set the machine up; a QEMU
	// that exits first has refused its arguments.
	if err := waitForSocket(ctx, p); err != nil {
		_ = cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("qemu: start: %w: %s", err, strings.TrimSpace(string(stderr.Bytes())))
	}
	if consumed {
		m.override = machines.Override{}
	}
	m.proc = p
	m.boots++
	return nil
}

func waitForSocket(ctx context.Context, p *process) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(p.socket); err == nil {
			return nil
		}
		select {
		case <-p.done:
			return errors.New("QEMU exited")
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func (m *Machine) killLocked() {
	if m.proc == nil {
		return
	}
	p := m.proc
	m.proc = nil
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}
