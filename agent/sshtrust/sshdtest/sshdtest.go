// Package sshdtest runs Debian's real sshd (openssh-server) for tests, as
// a child process on a free port of 127.0.0.1 with a host key of its own
// and the sshtrust snippet included, and logs in to it with the real ssh
// client. It needs root (sshd's privilege separation), sshd and ssh; a
// test without them is skipped, saying what is missing.
package sshdtest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// Server is a running sshd.
type Server struct {
	Port int
	dir  string
	log  *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// sshdPath finds sshd, which is in /usr/sbin (not always on PATH).
func sshdPath() (string, error) {
	if p, err := exec.LookPath("sshd"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/sshd"); err != nil {
		return "", err
	}
	return "/usr/sbin/sshd", nil
}

// Start runs sshd with snippet (an sshd_config file, sshtrust's) included
// until the test ends. Only certificates log in: no authorized_keys, no
// passwords.
func Start(t testing.TB, snippet string) *Server {
	t.Helper()
	sshd, err := sshdPath()
	if err != nil {
		t.Skipf("no sshd (apt-get install openssh-server): %v", err)
	}
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Skipf("no ssh client (openssh-client): %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("sshd needs root for its privilege separation")
	}
	// sshd refuses to start without its privilege separation directory.
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	hostKey := filepath.Join(dir, "host_ed25519")
	writePrivateKey(t, hostKey)
	port := freePort(t)
	config := filepath.Join(dir, "sshd_config")
	if err := os.WriteFile(config, []byte(strings.Join([]string{
		"Include " + snippet,
		"HostKey " + hostKey,
		"ListenAddress 127.0.0.1",
		"PidFile none",
		"StrictModes no",
		"UsePAM no",
		"PasswordAuthentication no",
		"KbdInteractiveAuthentication no",
		"AuthorizedKeysFile none",
		"LogLevel VERBOSE",
		"UseDNS no",
		"PrintMotd no",
		"PrintLastLog no",
	}, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(sshd, "-t", "-f", config).CombinedOutput(); err != nil {
		t.Fatalf("sshd -t: %v: %s", err, out)
	}
	s := &Server{Port: port, dir: dir, log: &syncBuffer{}}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, sshd, "-D", "-e", "-p", strconv.Itoa(port), "-f", config)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("starting sshd: %v", err)
	}
	// sshd says when it listens; its log is kept for failures.
	listening, logged := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(logged)
		sc := bufio.NewScanner(stderr)
		said := false
		for sc.Scan() {
			fmt.Fprintln(s.log, sc.Text())
			if !said && strings.HasPrefix(sc.Text(), "Server listening on") {
				said = true
				close(listening)
			}
		}
	}()
	done := make(chan struct{})
	go func() { <-logged; _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		if t.Failed() {
			t.Logf("sshd's log:\n%s", s.log.String())
		}
	})
	select {
	case <-listening:
	case <-done:
		t.Fatalf("sshd exited: %s", s.log.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("sshd did not listen within 30 s: %s", s.log.String())
	}
	return s
}

// Log is what sshd logged so far.
func (s *Server) Log() string { return s.log.String() }

// Login runs `ssh -i key -o CertificateFile=cert -p port user@127.0.0.1
// true` and answers its error and output (nil: logged in and ran true).
func (s *Server) Login(user, key, cert string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ssh", "-F", "none", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
		"-o", "UserKnownHostsFile=/dev/null", "-o", "GlobalKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
		"-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none", "-o", "PreferredAuthentications=publickey",
		"-i", key, "-o", "CertificateFile="+cert, "-p", strconv.Itoa(s.Port), user+"@127.0.0.1", "true")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// UserKey makes an Ed25519 user key in dir: its private key file (for
// ssh -i) and its public key as an authorized_keys line.
func UserKey(t testing.TB, dir, name string) (keyFile, publicLine string) {
	t.Helper()
	keyFile = filepath.Join(dir, name)
	pub := writePrivateKey(t, keyFile)
	return keyFile, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub))) + " " + name
}

// WriteCert writes a certificate line where ssh finds it for key.
func WriteCert(t testing.TB, keyFile, certLine string) string {
	t.Helper()
	path := keyFile + "-cert.pub"
	if err := os.WriteFile(path, []byte(certLine+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func writePrivateKey(t testing.TB, path string) ssh.PublicKey {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return sshPub
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// String names the server.
func (s *Server) String() string { return fmt.Sprintf("sshd on 127.0.0.1:%d", s.Port) }
