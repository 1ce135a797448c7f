package sshtrust_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/agent/sshtrust"
	"github.com/better-compute/better-compute/agent/sshtrust/sshdtest"
	"github.com/better-compute/better-compute/internal/testutil"
)

// testCA signs user certificates as the control plane does.
type testCA struct {
	signer ssh.Signer
	line   string
}

func newCA(t *testing.T) testCA {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return testCA{signer: s, line: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey()))) + " test-ca"}
}

func (ca testCA) sign(t *testing.T, publicLine string, serial uint64, principals ...string) string {
	t.Helper()
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(publicLine))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	c := &ssh.Certificate{Key: pub, Serial: serial, CertType: ssh.UserCert, KeyId: "test", ValidPrincipals: principals,
		ValidAfter: uint64(now.Add(-time.Minute).Unix()), ValidBefore: uint64(now.Add(time.Hour).Unix())}
	if err := c.SignCert(rand.Reader, ca.signer); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(c)))
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A real sshd trusts what sshtrust wrote, re-reading the files for every
// login: a node's certificate logs in, another node's does not, a revoked
// one no longer does (while another certificate of the same key still
// does: the KRL revokes by serial), and a spec that cannot be written
// leaves sshd accepting no certificate.
func TestRealSSHD(t *testing.T) {
	dir := t.TempDir()
	w := &sshtrust.Writer{Dir: filepath.Join(dir, "trust")}
	if err := w.Ensure(); err != nil {
		t.Fatal(err)
	}
	sshd := sshdtest.Start(t, w.SnippetPath())
	ca := newCA(t)
	key, pub := sshdtest.UserKey(t, dir, "alice")
	key2, pub2 := sshdtest.UserKey(t, dir, "bob")
	certA := ca.sign(t, pub, 1, "root@node_a")
	certB := ca.sign(t, pub2, 2, "root@node_b")
	certA2 := ca.sign(t, pub2, 3, "root@node_a")
	fileA := sshdtest.WriteCert(t, key, certA)
	fileB := sshdtest.WriteCert(t, key2, certB)
	fileA2 := filepath.Join(dir, "bob-a-cert.pub")
	if err := os.WriteFile(fileA2, []byte(certA2+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	nodeA := nodespec.SSH{TrustedUserCAKeys: []string{ca.line}, AuthorizedPrincipals: map[string][]string{"root": {"root@node_a"}}}

	// Before any spec: the empty files refuse every certificate.
	if out, err := sshd.Login("root", key, fileA); err == nil {
		t.Fatalf("login before any spec succeeded: %s", out)
	}
	if err := w.Write(ctx, nodeA); err != nil {
		t.Fatal(err)
	}
	type login struct {
		name, user, key, cert string
		ok                    bool
	}
	check := func(stage string, logins []login) {
		t.Helper()
		for _, l := range logins {
			out, err := sshd.Login(l.user, l.key, l.cert)
			if (err == nil) != l.ok {
				t.Errorf("%s: %s: logged in = %v (%v: %s), want %v", stage, l.name, err == nil, err, out, l.ok)
			}
		}
	}
	check("trusted", []login{
		{"node A's certificate", "root", key, fileA, true},
		{"node B's certificate on node A", "root", key2, fileB, false},
		{"node A's second certificate", "root", key2, fileA2, true},
		{"a user without principals", "nobody", key, fileA, false},
	})

	nodeA.RevokedKeys = []string{certA}
	if err := w.Write(ctx, nodeA); err != nil {
		t.Fatal(err)
	}
	check("revoked", []login{
		{"the revoked certificate", "root", key, fileA, false},
		{"another certificate of the same key's CA", "root", key2, fileA2, true},
	})
	// ssh-keygen -Q agrees: the certificate is revoked, its key is not.
	pubFile := filepath.Join(dir, "alice.pub")
	if err := os.WriteFile(pubFile, []byte(pub+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command("ssh-keygen", "-Q", "-f", filepath.Join(w.Dir, sshtrust.RevokedFile), fileA, fileA2, pubFile).CombinedOutput()
	if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); len(lines) != 3 || !strings.HasSuffix(lines[0], "REVOKED") ||
		!strings.HasSuffix(lines[1], "ok") || !strings.HasSuffix(lines[2], "ok") {
		t.Fatalf("ssh-keygen -Q:\n%s", out)
	}

	// A spec that cannot be written faithfully: no certificate at all.
	bad := nodeA
	bad.RevokedKeys = []string{"not a key"}
	if err := w.Write(ctx, bad); err == nil {
		t.Fatal("a malformed revoked line was written")
	}
	check("failed closed", []login{{"node A's second certificate", "root", key2, fileA2, false}})
	if got := read(t, filepath.Join(w.Dir, sshtrust.CAKeysFile)); got != "" {
		t.Fatalf("CA file after a failure = %q", got)
	}
	if err := w.Write(ctx, nodeA); err != nil {
		t.Fatal(err)
	}
	check("written again", []login{{"node A's second certificate", "root", key2, fileA2, true}})
}

func TestWriteFiles(t *testing.T) {
	ca := newCA(t)
	_, pub := sshdtest.UserKey(t, t.TempDir(), "carol")
	cert := ca.sign(t, pub, 9, "root@node_a")
	dir := t.TempDir()
	w := &sshtrust.Writer{Dir: dir}
	ctx := context.Background()
	spec := nodespec.SSH{TrustedUserCAKeys: []string{ca.line}, RevokedKeys: []string{cert},
		AuthorizedPrincipals: map[string][]string{"root": {"root@node_a"}, "deploy": {"deploy@node_a"}}}
	if err := w.Write(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if got := read(t, filepath.Join(dir, sshtrust.CAKeysFile)); got != ca.line+"\n" {
		t.Fatalf("CA file = %q", got)
	}
	if got := read(t, filepath.Join(dir, sshtrust.PrincipalsDir, "deploy")); got != "deploy@node_a\n" {
		t.Fatalf("deploy's principals = %q", got)
	}
	if got := read(t, filepath.Join(dir, sshtrust.RevokedFile)); !strings.HasPrefix(got, "SSHKRL\n\x00") {
		t.Fatalf("revoked file is no KRL: %q", got)
	}
	if got := read(t, w.SnippetPath()); got != sshtrust.Snippet(dir) ||
		!strings.Contains(got, "AuthorizedPrincipalsFile "+filepath.Join(dir, "principals")+"/%u\n") {
		t.Fatalf("snippet = %q", got)
	}
	// A user dropped from the spec loses its file; no revocation is an
	// empty list.
	spec.AuthorizedPrincipals = map[string][]string{"root": {"root@node_a"}}
	spec.RevokedKeys = nil
	if err := w.Write(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, sshtrust.PrincipalsDir, "deploy")); !os.IsNotExist(err) {
		t.Fatalf("deploy's principals file stays: %v", err)
	}
	if got := read(t, filepath.Join(dir, sshtrust.RevokedFile)); got != "" {
		t.Fatalf("revoked file with nothing revoked = %q", got)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("left behind: %s", e.Name())
		}
	}

	// Specs that are refused, each leaving the CA file empty.
	for name, s := range map[string]nodespec.SSH{
		"a certificate as CA":    {TrustedUserCAKeys: []string{cert}},
		"two lines in one":       {TrustedUserCAKeys: []string{ca.line + "\n" + ca.line}},
		"a CA line with options": {TrustedUserCAKeys: []string{`cert-authority ` + ca.line}},
		"a bad revoked line":     {TrustedUserCAKeys: []string{ca.line}, RevokedKeys: []string{"ssh-ed25519 AAAA"}},
		"a user with a slash":    {TrustedUserCAKeys: []string{ca.line}, AuthorizedPrincipals: map[string][]string{"../x": {"a"}}},
		"a principal with space": {TrustedUserCAKeys: []string{ca.line}, AuthorizedPrincipals: map[string][]string{"root": {"a b"}}},
		"an empty principal":     {TrustedUserCAKeys: []string{ca.line}, AuthorizedPrincipals: map[string][]string{"root": {""}}},
		"no ssh-keygen":          {TrustedUserCAKeys: []string{ca.line}, RevokedKeys: []string{cert}},
	} {
		t.Run(name, func(t *testing.T) {
			if err := w.Write(ctx, nodespec.SSH{TrustedUserCAKeys: []string{ca.line}}); err != nil {
				t.Fatal(err)
			}
			ww := w
			if name == "no ssh-keygen" {
				ww = &sshtrust.Writer{Dir: dir, Keygen: filepath.Join(dir, "missing-ssh-keygen")}
			}
			if err := ww.Write(ctx, s); err == nil {
				t.Fatal("written")
			}
			if got := read(t, filepath.Join(dir, sshtrust.CAKeysFile)); got != "" {
				t.Fatalf("CA file = %q", got)
			}
		})
	}
}

// The keeper writes the latest spec in the background and leaves the
// files alone for a spec without an SSH section.
func TestKeeper(t *testing.T) {
	dir := t.TempDir()
	k := sshtrust.NewKeeper(&sshtrust.Writer{Dir: dir}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { k.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	ca := newCA(t)
	k.OnSpec(3, nodespec.Spec{SSH: &nodespec.SSH{TrustedUserCAKeys: []string{ca.line}}})
	testutil.Eventually(t, 10*time.Second, "generation 3 written", func() bool { return k.Applied() == 3 })
	k.OnSpec(4, nodespec.Spec{})
	other := newCA(t)
	k.OnSpec(5, nodespec.Spec{SSH: &nodespec.SSH{TrustedUserCAKeys: []string{other.line}}})
	testutil.Eventually(t, 10*time.Second, "generation 5 written", func() bool { return k.Applied() == 5 })
	if got := read(t, filepath.Join(dir, sshtrust.CAKeysFile)); got != other.line+"\n" {
		t.Fatalf("CA file = %q", got)
	}
}
