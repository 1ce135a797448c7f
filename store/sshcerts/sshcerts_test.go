package sshcerts_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/secrets"
	"github.com/better-compute/better-compute/store/sshcerts"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func vault(t *testing.T) *secrets.Vault {
	t.Helper()
	kek, err := secrets.GenerateKEK()
	if err != nil {
		t.Fatal(err)
	}
	keys, err := secrets.ParseKeyring(kek)
	if err != nil {
		t.Fatal(err)
	}
	return secrets.NewVault(keys, "root")
}

// node inserts a live node of tenant in a pool of its own.
func node(t *testing.T, s *store.Store, tenant string) string {
	t.Helper()
	ctx := context.Background()
	site, pool, id := core.NewID("site"), core.NewID("pool"), core.NewID("node")
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO sites (id, tenant_id, name, region, iam_region, kind, created_by) VALUES ($1, $2, $1, 'eu', 'eu-west', 'custom', 'idn_x')`,
			[]any{site, tenant}},
		{`INSERT INTO pools (id, tenant_id, site_id, name, class, gpu_model, gpu_memory_gb, agent, created_by)
			VALUES ($1, $2, $3, $1, 'metal-host', 'H100', 80, 'bcd', 'idn_x')`, []any{pool, tenant, site}},
		{`INSERT INTO nodes (id, tenant_id, pool_id, name) VALUES ($1, $2, $3, $1)`, []any{id, tenant, pool}},
	} {
		if _, err := s.Pool.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatal(err)
		}
	}
	return id
}

func userKey(t *testing.T) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k))) + " alice@laptop"
}

func issue(t *testing.T, s *store.Store, v *secrets.Vault, r sshcerts.IssueRequest) (sshcerts.Certificate, error) {
	t.Helper()
	var c sshcerts.Certificate
	err := s.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) (err error) {
		c, err = sshcerts.Issue(context.Background(), tx, v, r)
		return err
	})
	return c, err
}

func spec(t *testing.T, s *store.Store, nodeID string) (int64, *sshSection) {
	t.Helper()
	g, sp, err := nodes.Spec(context.Background(), s.Pool, nodeID)
	if err != nil {
		t.Fatal(err)
	}
	if sp.SSH == nil {
		return g, nil
	}
	return g, &sshSection{CAs: sp.SSH.TrustedUserCAKeys, Revoked: sp.SSH.RevokedKeys, Principals: sp.SSH.AuthorizedPrincipals}
}

type sshSection struct {
	CAs, Revoked []string
	Principals   map[string][]string
}

// Concurrent first issues make one CA per tenant and serials unique per
// CA; each certificate verifies against the CA, names its node in every
// principal, and the CA's private key is sealed (the row holds no seed).
func TestIssueMakesOneCAAndUniqueSerials(t *testing.T) {
	s := testenv.Store(t)
	v := vault(t)
	a, b := node(t, s, "acme"), node(t, s, "acme")
	const n = 8
	certs := make([]sshcerts.Certificate, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			target := a
			if i%2 == 1 {
				target = b
			}
			certs[i], errs[i] = issue(t, s, v, sshcerts.IssueRequest{TenantID: "acme", NodeID: target, PublicKey: userKey(t), By: "idn_alice"})
		}()
	}
	wg.Wait()
	var serials []int64
	for i, c := range certs {
		if errs[i] != nil {
			t.Fatalf("issue %d: %v", i, errs[i])
		}
		serials = append(serials, c.Serial)
		parsed, _, _, _, err := ssh.ParseAuthorizedKey([]byte(c.Certificate))
		if err != nil {
			t.Fatal(err)
		}
		cert := parsed.(*ssh.Certificate)
		caKey, _, _, _, _ := ssh.ParseAuthorizedKey([]byte(c.CAPublicKey))
		checker := ssh.CertChecker{IsUserAuthority: func(k ssh.PublicKey) bool { return bytes.Equal(k.Marshal(), caKey.Marshal()) }}
		if err := checker.CheckCert("root@"+c.NodeID, cert); err != nil {
			t.Fatalf("certificate %d does not check: %v", i, err)
		}
		if err := checker.CheckCert("root@"+map[bool]string{true: b, false: a}[c.NodeID == a], cert); err == nil {
			t.Fatalf("certificate %d for %s checks for the other node", i, c.NodeID)
		}
		if c.State != sshcerts.StateActive || !slices.Equal(c.Users, []string{"root"}) || c.KeyID != "idn_alice@"+c.NodeID+":"+c.ID ||
			c.ValidBefore-c.ValidAfter != (time.Hour+sshcerts.Backdate).Milliseconds() || uint64(c.Serial) != cert.Serial {
			t.Fatalf("certificate %d = %+v", i, c)
		}
	}
	slices.Sort(serials)
	if !slices.Equal(serials, []int64{1, 2, 3, 4, 5, 6, 7, 8}) {
		t.Fatalf("serials = %v", serials)
	}
	var cas int
	if err := s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM ssh_cas WHERE tenant_id = 'acme'`).Scan(&cas); err != nil || cas != 1 {
		t.Fatalf("%d CAs, %v", cas, err)
	}
	// The seed opens only with the vault, and is not in the row.
	var caID, kekID string
	var sealed []byte
	if err := s.Pool.QueryRow(context.Background(), `SELECT id, kek_id, sealed FROM ssh_cas WHERE tenant_id = 'acme'`).Scan(&caID, &kekID, &sealed); err != nil {
		t.Fatal(err)
	}
	seed, err := v.Open("ssh-user-ca", kekID, sealed, []byte("acme\x00"+caID))
	if err != nil || len(seed) != ed25519.SeedSize || bytes.Contains(sealed, seed) {
		t.Fatalf("sealed seed: %d bytes, %v", len(seed), err)
	}
	derived, _ := ssh.NewSignerFromKey(ed25519.NewKeyFromSeed(seed))
	if !strings.HasPrefix(certs[0].CAPublicKey, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(derived.PublicKey())))) {
		t.Fatal("the sealed seed is not the CA's key")
	}
	if _, err := v.Open("ssh-user-ca", kekID, sealed, []byte("globex\x00"+caID)); err == nil {
		t.Fatal("the sealed seed opens for another tenant")
	}
	// Another tenant gets a CA of its own.
	g := node(t, s, "globex")
	other, err := issue(t, s, v, sshcerts.IssueRequest{TenantID: "globex", NodeID: g, PublicKey: userKey(t), By: "idn_gus"})
	if err != nil || other.CAPublicKey == certs[0].CAPublicKey || other.Serial != 1 {
		t.Fatalf("globex's certificate = %+v, %v", other, err)
	}
	// The CA's own key is refused as a user's.
	caLine := strings.Join(strings.Fields(certs[0].CAPublicKey)[:2], " ")
	if _, err := issue(t, s, v, sshcerts.IssueRequest{TenantID: "acme", NodeID: a, PublicKey: caLine, By: "idn_alice"}); reason(err) != "caKey" {
		t.Fatalf("CA key as user key = %v", err)
	}
}

func reason(err error) string {
	if err == nil {
		return ""
	}
	r, _ := core.AsError(err).Details["reason"].(string)
	return r
}

// Issue and revoke reach the NodeSpec: the generation moves, the section
// lists the tenant's CA, the users' principals and the revoked
// certificates until they expire. Revoking twice changes nothing.
func TestSpecFollowsIssueAndRevoke(t *testing.T) {
	s := testenv.Store(t)
	v := vault(t)
	ctx := context.Background()
	a := node(t, s, "acme")
	g0, sec := spec(t, s, a)
	if sec != nil {
		t.Fatalf("spec before any CA = %+v", sec)
	}
	c, err := issue(t, s, v, sshcerts.IssueRequest{TenantID: "acme", NodeID: a, PublicKey: userKey(t), Users: []string{"root", "deploy"},
		TTL: 10 * time.Minute, Comment: "ticket 42", By: "idn_alice"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Principals, []string{"root@" + a, "deploy@" + a}) || !strings.HasSuffix(c.Certificate, " ticket 42") {
		t.Fatalf("certificate = %+v", c)
	}
	g1, sec := spec(t, s, a)
	if g1 != g0+1 || sec == nil || !slices.Equal(sec.CAs, []string{c.CAPublicKey}) || len(sec.Revoked) != 0 ||
		!slices.Equal(sec.Principals["deploy"], []string{"deploy@" + a}) || len(sec.Principals) != 2 {
		t.Fatalf("spec after issue = %d %+v", g1, sec)
	}
	revoke := func() sshcerts.Certificate {
		t.Helper()
		var r sshcerts.Certificate
		if err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
			r, err = sshcerts.Revoke(ctx, tx, "acme", a, c.ID, "idn_bob")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := revoke()
	if r.State != sshcerts.StateRevoked || r.RevokedAt == nil || r.RevokedBy != "idn_bob" {
		t.Fatalf("revoked = %+v", r)
	}
	g2, sec := spec(t, s, a)
	if g2 != g1+1 || !slices.Equal(sec.Revoked, []string{c.Certificate}) || len(sec.Principals) != 0 {
		t.Fatalf("spec after revoke = %d %+v", g2, sec)
	}
	if again := revoke(); *again.RevokedAt != *r.RevokedAt || again.RevokedBy != "idn_bob" {
		t.Fatalf("second revoke = %+v", again)
	}
	if g3, _ := spec(t, s, a); g3 != g2 {
		t.Fatalf("a second revoke moved the generation to %d", g3)
	}
	// Once it has expired it leaves the revocation list.
	if _, err := s.Pool.Exec(ctx, `UPDATE ssh_certificates SET valid_after = now() - interval '2 hours', valid_before = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	if _, sec := spec(t, s, a); len(sec.Revoked) != 0 {
		t.Fatalf("expired revoked certificate still listed: %+v", sec)
	}
	list := func(state string) []sshcerts.Certificate {
		t.Helper()
		var out []sshcerts.Certificate
		if err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
			out, err = sshcerts.List(ctx, tx, "acme", a, state, store.PageQuery{Limit: 10})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if l := list(""); len(l) != 1 || l[0].State != sshcerts.StateRevoked {
		t.Fatalf("list = %+v", l)
	}
	if l := list(sshcerts.StateActive); len(l) != 0 {
		t.Fatalf("active = %+v", l)
	}
}

// Another tenant's node, and a certificate of another node, read as
// missing; without a key-encryption key nothing is issued.
func TestNotFoundAndNoKEK(t *testing.T) {
	s := testenv.Store(t)
	v := vault(t)
	ctx := context.Background()
	a, b := node(t, s, "acme"), node(t, s, "acme")
	c, err := issue(t, s, v, sshcerts.IssueRequest{TenantID: "acme", NodeID: a, PublicKey: userKey(t), By: "idn_alice"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := issue(t, s, v, sshcerts.IssueRequest{TenantID: "globex", NodeID: a, PublicKey: userKey(t), By: "idn_gus"}); core.AsError(err).Code != core.CodeNotFound {
		t.Fatalf("globex issuing on acme's node = %v", err)
	}
	for _, tc := range []struct{ tenant, node string }{{"globex", a}, {"acme", b}} {
		err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
			_, err := sshcerts.Revoke(ctx, tx, tc.tenant, tc.node, c.ID, "idn_x")
			return err
		})
		if core.AsError(err).Code != core.CodeNotFound {
			t.Fatalf("revoke by %s on %s = %v", tc.tenant, tc.node, err)
		}
	}
	none := secrets.NewVault(nil, "root")
	if _, err := issue(t, s, none, sshcerts.IssueRequest{TenantID: "acme", NodeID: b, PublicKey: userKey(t), By: "idn_alice"}); core.AsError(err).Code != core.CodeUnavailable {
		t.Fatalf("issue without a KEK = %v", err)
	}
	var count int
	if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM ssh_certificates WHERE node_id = $1`, b).Scan(&count); err != nil || count != 0 {
		t.Fatalf("%d certificates after refusals, %v", count, err)
	}
	// A CA row whose sealed key opens to another key signs nothing.
	if _, err := s.Pool.Exec(ctx, `UPDATE ssh_cas SET public_key = $1 WHERE tenant_id = 'acme'`, userKey(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := issue(t, s, v, sshcerts.IssueRequest{TenantID: "acme", NodeID: a, PublicKey: userKey(t), By: "idn_alice"}); core.AsError(err).Code != core.CodeInternal {
		t.Fatalf("issue with a tampered CA = %v", err)
	}
}

func TestParsePublicKey(t *testing.T) {
	ed := userKey(t)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecPub, _ := ssh.NewPublicKey(&ecKey.PublicKey)
	small, _ := rsa.GenerateKey(rand.Reader, 1024)
	smallPub, _ := ssh.NewPublicKey(&small.PublicKey)
	_, caPriv, _ := ed25519.GenerateKey(rand.Reader)
	signer, _ := ssh.NewSignerFromKey(caPriv)
	pk, _, _, _, _ := ssh.ParseAuthorizedKey([]byte(ed))
	cert := &ssh.Certificate{Key: pk, CertType: ssh.UserCert, ValidBefore: ssh.CertTimeInfinity}
	if err := cert.SignCert(rand.Reader, signer); err != nil {
		t.Fatal(err)
	}
	line := func(k ssh.PublicKey) string { return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k))) }
	for _, tc := range []struct {
		name, in, reason string
	}{
		{"ed25519 with a comment", ed, ""},
		{"ed25519 with a newline", ed + "\n", ""},
		{"ecdsa", line(ecPub), ""},
		{"empty", "", "format"},
		{"garbage", "hello world", "format"},
		{"truncated", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI", "format"},
		{"two keys", ed + "\n" + ed, "multiple"},
		{"options", `command="/bin/sh" ` + ed, "options"},
		{"cert-authority", `cert-authority ` + ed, "options"},
		{"a certificate", line(cert), "certificate"},
		{"a small RSA key", line(smallPub), "keySize"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sshcerts.ParsePublicKey(tc.in)
			if tc.reason == "" && err != nil || tc.reason != "" && (reason(err) != tc.reason || core.AsError(err).Code != core.CodeInvalidInput) {
				t.Fatalf("= %v, want reason %q", err, tc.reason)
			}
		})
	}
}
