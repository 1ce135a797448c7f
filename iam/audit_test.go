package iam

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"sync"
	"testing"

	"github.com/better-compute/better-compute/store"
)

// embDenials makes n audited denials in acme.
func embDenials(t *testing.T, env *embTestEnv, c *Caller, n int) {
	t.Helper()
	for range n {
		env.authorize(Request{Caller: c, TenantID: "acme", Action: "compute:pools:read",
			Resource: Resource{Type: "compute-pool", ID: "pool_1"}, RequestID: "req"})
	}
}

func TestAuditChainVerifies(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	env.resolver.put(embPool("acme", "pool_1", nil))
	_, alice := env.person("acme", "alice")
	embDenials(t, env, alice, 5)

	entries := env.audit("acme")
	if len(entries) < 5 {
		t.Fatalf("%d entries", len(entries))
	}
	prev := make([]byte, sha256.Size)
	for i, e := range entries {
		if e.Seq != int64(i+1) || e.TenantID != "acme" {
			t.Fatalf("entry %d: seq %d tenant %s", i, e.Seq, e.TenantID)
		}
		if e.PrevHash != hex.EncodeToString(prev) {
			t.Fatalf("entry %d does not chain to its predecessor", e.Seq)
		}
		body, err := auditCanonical(&e)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(append(append([]byte{}, prev...), body...))
		if e.Hash != hex.EncodeToString(sum[:]) {
			t.Fatalf("entry %d: hash is not SHA-256(prev || canonical JSON)", e.Seq)
		}
		prev = sum[:]
	}
	if v := env.verify("acme"); !v.OK || v.Entries != int64(len(entries)) {
		t.Fatalf("verify = %+v", v)
	}
	if v := env.verify("nobody"); !v.OK || v.Entries != 0 {
		t.Fatalf("an empty chain: %+v", v)
	}
	page, err := env.admin.AuditEntries(env.ctx, AuditQuery{TenantID: "acme", AfterSeq: 2, Limit: 2})
	if err != nil || len(page) != 2 || page[0].Seq != 3 || page[1].Seq != 4 {
		t.Fatalf("a page: %+v, %v", page, err)
	}
}

func TestAuditCanonicalJSON(t *testing.T) {
	e := AuditEntry{TenantID: "acme", Seq: 7, ID: "aud_1", At: 1700000000123, Kind: AuditKindDecision,
		IdentityID: "idn_1", Action: "compute:pools:read", ResourceType: "compute-pool", ResourceID: "p<1>",
		Reason: ReasonDeny, Details: map[string]string{"z": "1", "a": "2"}, Hash: "ignored", PrevHash: "ignored"}
	got, err := auditCanonical(&e)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"action":"compute:pools:read","allowed":false,"at":1700000000123,"details":{"a":"2","z":"1"},` +
		`"id":"aud_1","identityId":"idn_1","kind":"decision","reason":"DENY","requestId":"","resourceId":"p<1>",` +
		`"resourceType":"compute-pool","seq":7,"sessionId":"","targetTenantId":"","tenantId":"acme"}`
	if string(got) != want {
		t.Fatalf("canonical JSON\n got %s\nwant %s", got, want)
	}
	e.Details = nil
	got, _ = auditCanonical(&e)
	if !bytes.Contains(got, []byte(`"details":{}`)) {
		t.Fatalf("nil details: %s", got)
	}
}

func TestAuditChainIsAppendOnly(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	for _, stmt := range []string{
		`UPDATE iam_audit_entries SET reason = 'ALLOW' WHERE tenant_id = 'acme'`,
		`DELETE FROM iam_audit_entries WHERE tenant_id = 'acme'`,
		`TRUNCATE iam_audit_entries`,
	} {
		_, err := env.db.Pool.Exec(env.ctx, stmt)
		if err == nil || !strings.Contains(err.Error(), "append-only") {
			t.Fatalf("%s: %v, want a refusal", stmt, err)
		}
	}
}

func TestAuditChainDetectsTampering(t *testing.T) {
	tests := []struct {
		name   string
		sql    string
		broken int64 // the seq Verify reports, 0 for the head
	}{
		{"a changed reason", `UPDATE iam_audit_entries SET reason = 'ALLOW' WHERE tenant_id = 'acme' AND seq = 4`, 4},
		{"changed details", `UPDATE iam_audit_entries SET details = '{"x":"y"}' WHERE tenant_id = 'acme' AND seq = 3`, 3},
		{"details that are not strings", `UPDATE iam_audit_entries SET details = '{"x":1}' WHERE tenant_id = 'acme' AND seq = 3`, 3},
		{"a deleted entry", `DELETE FROM iam_audit_entries WHERE tenant_id = 'acme' AND seq = 3`, 4},
		{"a changed hash", `UPDATE iam_audit_entries SET reason = 'ALLOW', hash = sha256(hash) WHERE tenant_id = 'acme' AND seq = 4`, 4},
		{"the last entry deleted", `DELETE FROM iam_audit_entries WHERE tenant_id = 'acme' AND seq = (SELECT max(seq) FROM iam_audit_entries WHERE tenant_id = 'acme')`, 0},
		{"a moved head", `UPDATE iam_audit_heads SET seq = seq + 1 WHERE tenant_id = 'acme'`, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newEmbTestEnv(t)
			env.tenant("acme")
			env.resolver.put(embPool("acme", "pool_1", nil))
			_, alice := env.person("acme", "alice")
			embDenials(t, env, alice, 4)
			if v := env.verify("acme"); !v.OK {
				t.Fatalf("before: %+v", v)
			}
			err := env.db.InTx(env.ctx, store.ReadWrite, func(tx store.Tx) error {
				if _, err := tx.Exec(env.ctx, `ALTER TABLE iam_audit_entries DISABLE TRIGGER iam_audit_entries_no_update`); err != nil {
					return err
				}
				if _, err := tx.Exec(env.ctx, tt.sql); err != nil {
					return err
				}
				_, err := tx.Exec(env.ctx, `ALTER TABLE iam_audit_entries ENABLE TRIGGER iam_audit_entries_no_update`)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			v := env.verify("acme")
			if v.OK || v.BrokenAt != tt.broken || v.Problem == "" {
				t.Fatalf("verify = %+v, want broken at %d", v, tt.broken)
			}
		})
	}
}

func TestAuditConcurrentAppendsStayChained(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	env.resolver.put(embPool("acme", "pool_1", nil))
	_, alice := env.person("acme", "alice")
	before := len(env.audit("acme"))
	const workers, each = 8, 5
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for range workers {
		wg.Go(func() {
			for range each {
				if _, err := env.iam.Authorize(env.ctx, Request{Caller: alice, TenantID: "acme",
					Action: "compute:pools:read", Resource: Resource{Type: "compute-pool", ID: "pool_1"}}); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := len(env.audit("acme")); n != before+workers*each {
		t.Fatalf("%d entries, want %d", n, before+workers*each)
	}
	if v := env.verify("acme"); !v.OK {
		t.Fatalf("%+v", v)
	}
}
