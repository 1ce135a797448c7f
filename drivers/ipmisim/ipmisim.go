// Package ipmisim runs Debian's pyghmi fakebmc as a real IPMI peer for
// tests: a process answering RMCP+ on a free UDP port of the loopback,
// with one user (admin/password), power that follows on/off, and boot
// flags that read back. It has no power cycle and no serial-over-LAN.
package ipmisim

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/drivers"
)

// Where Debian installs the peer; the test runs fakebmc with the system
// python3, which has python3-pyghmi.
const (
	Python   = "/usr/bin/python3"
	FakeBMC  = "/usr/bin/fakebmc"
	Username = "admin"
	Password = "password"
)

// BMC is a running fakebmc.
type BMC struct {
	// Addr is host:port.
	Addr string
	Port int

	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	once sync.Once
}

// Available says why fakebmc cannot run here, or "" when it can.
func Available() string {
	for _, p := range []string{Python, FakeBMC} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Sprintf("%s is missing (Debian packages python3-pyghmi, ipmitool): %v", p, err)
		}
	}
	if _, err := exec.LookPath("ipmitool"); err != nil {
		return "ipmitool is missing (Debian package ipmitool)"
	}
	return ""
}

// Start starts a fakebmc for the test, waits until it answers a power
// status with its credentials, and stops it when the test ends. It skips
// the test when fakebmc or ipmitool is not installed.
func Start(t testing.TB) *BMC {
	t.Helper()
	if why := Available(); why != "" {
		t.Skip(why)
	}
	b, err := start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	return b
}

func freeUDPPort() (int, error) {
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port, nil
}

func start(ctx context.Context) (*BMC, error) {
	port, err := freeUDPPort()
	if err != nil {
		return nil, fmt.Errorf("finding a free UDP port: %w", err)
	}
	b := &BMC{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Port: port, out: &syncBuffer{}, done: make(chan struct{})}
	// -u: unbuffered, so its log is there when a test fails.
	b.cmd = exec.Command(Python, "-u", FakeBMC, "--port", strconv.Itoa(port))
	b.cmd.Stdout, b.cmd.Stderr = b.out, b.out
	if err := b.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting fakebmc: %w", err)
	}
	go func() { _ = b.cmd.Wait(); close(b.done) }()
	if err := b.waitReady(ctx, 20*time.Second); err != nil {
		b.Stop()
		return nil, err
	}
	return b, nil
}

// waitReady polls until a power status answers: fakebmc binds its port
// only once python has imported pyghmi.
func (b *BMC) waitReady(ctx context.Context, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		out, err := b.Ipmitool(ctx, "chassis", "power", "status")
		if err == nil {
			return nil
		}
		last = out
		select {
		case <-b.done:
			return fmt.Errorf("fakebmc exited: %s", b.out.String())
		case <-ctx.Done():
			return fmt.Errorf("fakebmc did not answer within %s (last: %s; log: %s)", within, last, b.out.String())
		case <-tick.C:
		}
	}
}

// Ipmitool runs ipmitool against the BMC with its credentials: for a test
// to look at the peer without going through the driver under test.
func (b *BMC) Ipmitool(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "ipmitool", append([]string{"-I", "lanplus", "-U", Username, "-E", "-N", "1", "-R", "1",
		"-H", "127.0.0.1", "-p", strconv.Itoa(b.Port), "-C", "3"}, args...)...)
	cmd.Env = []string{"IPMITOOL_PASSWORD=" + Password}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Endpoint is the BMC's IPMI endpoint with its credentials.
func (b *BMC) Endpoint() *drivers.Endpoint {
	return &drivers.Endpoint{Address: b.Addr, Username: Username, Password: Password}
}

// OnPower calls fn each time the BMC powers the machine on or off, as
// fakebmc reports it on its output ("powered on"; "abruptly remove power"
// or "politely shut down the system"): what a simulated machine behind it
// boots on, without polling the BMC the drivers under test talk to.
func (b *BMC) OnPower(fn func(on bool)) { b.out.watch(fn) }

// Log is what fakebmc printed.
func (b *BMC) Log() string { return b.out.String() }

// Stop kills the process and waits for it.
func (b *BMC) Stop() {
	b.once.Do(func() {
		if b.cmd.Process != nil {
			_ = b.cmd.Process.Kill()
		}
		<-b.done
	})
}

type syncBuffer struct {
	mu       sync.Mutex
	b        bytes.Buffer
	line     []byte
	watchers []func(on bool)
}

func (s *syncBuffer) watch(fn func(on bool)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.watchers = append(s.watchers, fn)
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	s.b.Write(p)
	var events []bool
	for _, c := range p {
		if c != '\n' {
			s.line = append(s.line, c)
			continue
		}
		switch line := strings.TrimSpace(string(s.line)); {
		case line == "powered on":
			events = append(events, true)
		case strings.HasPrefix(line, "abruptly remove power"), strings.HasPrefix(line, "politely shut down"):
			events = append(events, false)
		}
		s.line = s.line[:0]
	}
	watchers := slices.Clone(s.watchers)
	s.mu.Unlock()
	for _, on := range events {
		for _, fn := range watchers {
			fn(on)
		}
	}
	return len(p), nil
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
