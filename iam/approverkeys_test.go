package iam

import (
	"testing"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/sshsigtest"
)

func TestApproverKeys(t *testing.T) {
	env := newEmbTestEnv(t)
	ctx, a := env.ctx, env.admin
	env.tenant("acme")
	alice := env.identity("acme", KindPerson, "alice", false)
	bob := env.identity("acme", KindPerson, "bob", false)
	robot := env.identity("acme", KindService, "robot", false)
	key := sshsigtest.NewKey(t, "alice@laptop")

	k, err := a.AddApproverKey(ctx, AddApproverKeyInput{TenantID: "acme", IdentityID: alice.ID, PublicKey: key.AuthorizedKey})
	if err != nil || !core.ValidID("apk", k.ID) || k.Fingerprint != key.Fingerprint(t) || k.Comment != "alice@laptop" {
		t.Fatalf("add = %+v, %v", k, err)
	}
	for name, c := range map[string]struct {
		in   AddApproverKeyInput
		code core.Code
	}{
		"the same key for another person": {AddApproverKeyInput{TenantID: "acme", IdentityID: bob.ID, PublicKey: key.AuthorizedKey}, core.CodeConflict},
		"a service identity":              {AddApproverKeyInput{TenantID: "acme", IdentityID: robot.ID, PublicKey: sshsigtest.NewKey(t, "r").AuthorizedKey}, core.CodeInvalidInput},
		"not a key":                       {AddApproverKeyInput{TenantID: "acme", IdentityID: bob.ID, PublicKey: "ssh-ed25519 AAAA"}, core.CodeInvalidInput},
		"two keys":                        {AddApproverKeyInput{TenantID: "acme", IdentityID: bob.ID, PublicKey: key.AuthorizedKey + "\n" + key.AuthorizedKey}, core.CodeInvalidInput},
		"another tenant's identity":       {AddApproverKeyInput{TenantID: "root", IdentityID: bob.ID, PublicKey: sshsigtest.NewKey(t, "b").AuthorizedKey}, core.CodeNotFound},
	} {
		if _, err := a.AddApproverKey(ctx, c.in); core.AsError(err) == nil || core.AsError(err).Code != c.code {
			t.Errorf("%s: %v, want %s", name, err, c.code)
		}
	}
	if ks, err := a.ApproverKeys(ctx, "acme", alice.ID); err != nil || len(ks) != 1 || ks[0].PublicKey == "" {
		t.Fatalf("keys = %+v, %v", ks, err)
	}
	if ks, _ := a.ApproverKeys(ctx, "root", alice.ID); len(ks) != 0 {
		t.Fatalf("alice's keys answered in another tenant: %+v", ks)
	}
	// Each change is on the tenant's audit chain.
	found := false
	for _, e := range env.audit("acme") {
		found = found || (e.Action == "iam:admin:addApproverKey" && e.ResourceID == k.ID && e.Details["fingerprint"] == k.Fingerprint)
	}
	if !found {
		t.Fatal("no audit entry for the key")
	}
	// A disabled person's keys approve nothing; a removed key neither.
	if _, err := a.DisableIdentity(ctx, IdentityRef{TenantID: "acme", IdentityID: alice.ID}); err != nil {
		t.Fatal(err)
	}
	if ks, _ := a.ApproverKeys(ctx, "acme", alice.ID); len(ks) != 0 {
		t.Fatalf("a disabled identity's keys: %+v", ks)
	}
	other := sshsigtest.NewKey(t, "bob")
	kb, err := a.AddApproverKey(ctx, AddApproverKeyInput{TenantID: "acme", IdentityID: bob.ID, PublicKey: other.AuthorizedKey})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.RemoveApproverKey(ctx, ApproverKeyRef{TenantID: "acme", KeyID: kb.ID}); err != nil {
		t.Fatal(err)
	}
	if ks, _ := a.ListApproverKeys(ctx, ListApproverKeysInput{TenantID: "acme", IdentityID: bob.ID}); len(ks) != 0 {
		t.Fatalf("a removed key is listed: %+v", ks)
	}
	if _, err := a.RemoveApproverKey(ctx, ApproverKeyRef{TenantID: "acme", KeyID: kb.ID}); core.AsError(err).Code != core.CodeNotFound {
		t.Fatalf("removing twice = %v", err)
	}
	// Removed, the key may be registered again (for bob, here).
	if _, err := a.AddApproverKey(ctx, AddApproverKeyInput{TenantID: "acme", IdentityID: bob.ID, PublicKey: other.AuthorizedKey}); err != nil {
		t.Fatal(err)
	}
}
