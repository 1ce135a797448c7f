// Package sshsigtest makes real SSH keys and signatures with the system's
// ssh-keygen (Debian's openssh-client), for the images tests: what they
// verify is what an operator's `ssh-keygen -Y sign` makes.
package sshsigtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Key is an ed25519 key pair ssh-keygen made.
type Key struct {
	// Private is the private key's file.
	Private string
	// AuthorizedKey is the public key's authorized_keys line.
	AuthorizedKey string
}

// NewKey makes a key pair in a test directory with comment.
func NewKey(t testing.TB, comment string) Key {
	t.Helper()
	path := filepath.Join(t.TempDir(), "id_ed25519")
	run(t, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path)
	pub, err := os.ReadFile(path + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	return Key{Private: path, AuthorizedKey: strings.TrimSpace(string(pub))}
}

// Sign signs file in namespace (`ssh-keygen -Y sign -n namespace -f key
// file`) and answers the armored signature.
func (k Key) Sign(t testing.TB, namespace, file string) string {
	t.Helper()
	run(t, "ssh-keygen", "-q", "-Y", "sign", "-n", namespace, "-f", k.Private, file)
	sig, err := os.ReadFile(file + ".sig")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(file + ".sig"); err != nil {
		t.Fatal(err)
	}
	return string(sig)
}

// SignBytes writes data to a test file and signs it.
func (k Key) SignBytes(t testing.TB, namespace string, data []byte) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "image")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return k.Sign(t, namespace, file)
}

func run(t testing.TB, name string, args ...string) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// Fingerprint is the key's fingerprint as `ssh-keygen -l` prints it
// (SHA256:...).
func (k Key) Fingerprint(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("ssh-keygen", "-l", "-E", "sha256", "-f", k.Private+".pub").Output()
	if err != nil {
		t.Fatalf("ssh-keygen -l: %v", err)
	}
	fields := strings.Fields(string(out))
	if len(fields) < 2 {
		t.Fatalf("ssh-keygen -l printed %q", out)
	}
	return fields[1]
}
