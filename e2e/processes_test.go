package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/internal/testutil"
)

// betterComputeBinary builds cmd/better-compute once per test binary.
var betterComputeBinary = sync.OnceValues(func() (string, error) { return buildBinary("better-compute") })

// buildBinary builds ./cmd/<name> into a fresh temporary directory.
func buildBinary(name string) (string, error) {
	dir, err := os.MkdirTemp("", "bc-e2e-"+name+"-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/"+name)
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/%s: %w: %s", name, err, out)
	}
	return bin, nil
}

// processWait bounds the wait for a process to say it is ready.
const processWait = time.Minute

// process is one child process of a test, its stdout and stderr kept
// together so the test can wait for a line and show the output when it
// fails.
type process struct {
	name string
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{} // closed once the process has exited
}

// lockedBuffer is a bytes.Buffer that the process writes while the test
// reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startProcess runs bin with args (and extra environment). The process
// dies with the test: SIGKILL at cleanup, and with the test binary should
// it die first. When the test fails, the output's tail goes to the log.
func startProcess(t *testing.T, name, bin string, env []string, args ...string) *process {
	t.Helper()
	p := &process{name: name, out: &lockedBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		// BC_E2E_KEEP_LOGS names a directory that keeps every process's
		// whole output, for chasing a failure that happens once in a while.
		if d := os.Getenv("BC_E2E_KEEP_LOGS"); d != "" {
			_ = os.WriteFile(filepath.Join(d, name+".log"), []byte(p.out.String()), 0o644)
		}
		if t.Failed() {
			t.Logf("--- output of %s (%v):\n%s", name, p.cmd.ProcessState, tail(p.out.String(), 4000))
		}
	})
	return p
}

// waitFor waits until the process's output holds s, failing the test if
// the process exits first.
func (p *process) waitFor(t *testing.T, s string) {
	t.Helper()
	exited := false
	testutil.Eventually(t, processWait, fmt.Sprintf("%s to print %q", p.name, s), func() bool {
		select {
		case <-p.done:
			exited = true
			return true
		default:
		}
		return strings.Contains(p.out.String(), s)
	})
	if exited && !strings.Contains(p.out.String(), s) {
		t.Fatalf("%s exited (%v) before printing %q", p.name, p.cmd.ProcessState, s)
	}
}

// line is the rest of the first output line that starts with prefix.
func (p *process) line(prefix string) string {
	for _, l := range strings.Split(p.out.String(), "\n") {
		if rest, ok := strings.CutPrefix(l, prefix); ok {
			return strings.TrimSpace(rest)
		}
	}
	return ""
}

// kill9 kills the process with SIGKILL and waits until it is gone.
func (p *process) kill9(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill %s: %v", p.name, err)
	}
	<-p.done
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// failoverProxy forwards each TCP connection to the first of its backends
// that accepts one, as a load balancer in front of API replicas does: the
// node agents reach every replica through one address, and a replica that
// died is skipped by the next connection.
type failoverProxy struct {
	ln       net.Listener
	backends []string

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	dialed map[string]int // connections forwarded, by backend
	wg     sync.WaitGroup
}

func startFailoverProxy(t *testing.T, backends ...string) *failoverProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &failoverProxy{ln: ln, backends: backends, conns: map[net.Conn]struct{}{}, dialed: map[string]int{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *failoverProxy) addr() string { return p.ln.Addr().String() }

// forwarded is how many connections went to backend.
func (p *failoverProxy) forwarded(backend string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dialed[backend]
}

func (p *failoverProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.wg.Add(1)
		go func() { defer p.wg.Done(); p.forward(c) }()
	}
}

func (p *failoverProxy) forward(client net.Conn) {
	var backend net.Conn
	for _, addr := range p.backends {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			backend = c
			p.mu.Lock()
			p.dialed[addr]++
			p.mu.Unlock()
			break
		}
	}
	if backend == nil {
		client.Close()
		return
	}
	if !p.track(client, backend) {
		return
	}
	// Either side ending ends both, so an agent sees its replica die.
	var once sync.Once
	closeBoth := func() { once.Do(func() { client.Close(); backend.Close() }) }
	go func() { _, _ = io.Copy(backend, client); closeBoth() }()
	_, _ = io.Copy(client, backend)
	closeBoth()
	p.mu.Lock()
	delete(p.conns, client)
	delete(p.conns, backend)
	p.mu.Unlock()
}

// track records the pair, or closes it when the proxy is closing.
func (p *failoverProxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *failoverProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}
