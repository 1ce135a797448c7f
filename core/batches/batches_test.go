package batches

import (
	"encoding/json"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/sshsigtest"
)

func batch(nodes ...string) Batch {
	return Batch{ID: "cbat_1", TenantID: "root", Quorum: 2, Nodes: nodes,
		Commands: []Command{{Kind: "reboot"}, {Kind: "exec", Args: json.RawMessage(`{"timeoutSeconds": 30, "argv": ["nvidia-smi", "-r"]}`)}}}
}

func TestDigestCoversTheCommandsAndTheExactNodes(t *testing.T) {
	d := must(Digest(batch("node_b", "node_a")))
	// The nodes' order and the arguments' spelling do not matter.
	same := batch("node_a", "node_b")
	same.Commands[1].Args = json.RawMessage(`{"argv":["nvidia-smi","-r"],"timeoutSeconds":30}`)
	if must(Digest(same)) != d {
		t.Fatal("the same batch has two digests")
	}
	// Another node, another command or another quorum is another digest.
	other := []Batch{batch("node_a", "node_b", "node_c"), batch("node_a"), {ID: "cbat_1", TenantID: "root", Quorum: 2,
		Nodes: []string{"node_a", "node_b"}, Commands: []Command{{Kind: "reboot"}}}}
	q := batch("node_a", "node_b")
	q.Quorum = 1
	for _, b := range append(other, q) {
		if must(Digest(b)) == d {
			t.Fatalf("%+v has the digest of another batch", b)
		}
	}
	if !NeedsQuorum(batch()) || NeedsQuorum(Batch{Commands: []Command{{Kind: "inventory.refresh"}}}) {
		t.Fatal("destructive kinds misjudged")
	}
}

func TestApprovalsMakeAQuorumOfOthers(t *testing.T) {
	now := time.Now()
	d := must(Digest(batch("node_a")))
	later := now.Add(time.Hour)
	have := []Approval{{Approver: "idn_ops1", Digest: d, ExpiresAt: later}}
	for _, tc := range []struct {
		a      Approval
		reason string
	}{
		{Approval{Approver: "idn_creator", Digest: d, ExpiresAt: later}, "creator"},
		{Approval{Approver: "idn_ops1", Digest: d, ExpiresAt: later}, "duplicate"},
		{Approval{Approver: "idn_ops2", Digest: "sha256:00", ExpiresAt: later}, "digest"},
		{Approval{Approver: "idn_ops2", Digest: d, ExpiresAt: now}, "expired"},
		{Approval{Approver: "idn_ops2", Digest: d, ExpiresAt: later}, ""},
	} {
		err := CheckApproval(d, "idn_creator", have, tc.a, now)
		if tc.reason == "" {
			if err != nil {
				t.Errorf("%+v: %v", tc.a, err)
			}
			continue
		}
		if ce := core.AsError(err); ce == nil || ce.Code != core.CodeInvalidState || ce.Details["reason"] != tc.reason {
			t.Errorf("%+v = %v, want INVALID_STATE %s", tc.a, err, tc.reason)
		}
	}
	// One of two is no quorum; the creator's, a stale digest's or an
	// expired one never counts; two others' is.
	if Quorate(d, "idn_creator", 2, have, now) {
		t.Fatal("one approval made a quorum of two")
	}
	bad := append(have, Approval{Approver: "idn_creator", Digest: d, ExpiresAt: later},
		Approval{Approver: "idn_ops2", Digest: "sha256:00", ExpiresAt: later}, Approval{Approver: "idn_ops3", Digest: d, ExpiresAt: now})
	if Quorate(d, "idn_creator", 2, bad, now) {
		t.Fatal("the creator's, a stale or an expired approval counted")
	}
	if !Quorate(d, "idn_creator", 2, append(have, Approval{Approver: "idn_ops2", Digest: d, ExpiresAt: later}), now) {
		t.Fatal("two approvals of others made no quorum of two")
	}
	// Once the node list changes, the approvals given are over another digest.
	if Quorate(must(Digest(batch("node_a", "node_z"))), "idn_creator", 1, have, now) {
		t.Fatal("approvals of the old scope approved the new one")
	}
}

func TestVerifySignatureIsSSHSIGInTheBatchNamespace(t *testing.T) {
	key := sshsigtest.NewKey(t, "approver")
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(key.AuthorizedKey))
	if err != nil {
		t.Fatal(err)
	}
	d := must(Digest(batch("node_a")))
	if err := VerifySignature(SignatureNamespace, d, key.SignBytes(t, SignatureNamespace, []byte(d)), pub); err != nil {
		t.Fatalf("a good signature: %v", err)
	}
	for name, sig := range map[string]string{
		"another digest":    key.SignBytes(t, SignatureNamespace, []byte("sha256:00")),
		"another namespace": key.SignBytes(t, "file", []byte(d)),
		"a cancellation":    key.SignBytes(t, CancelNamespace, []byte(d)),
		"another key":       sshsigtest.NewKey(t, "other").SignBytes(t, SignatureNamespace, []byte(d)),
	} {
		if ce := core.AsError(VerifySignature(SignatureNamespace, d, sig, pub)); ce == nil || ce.Details["reason"] != "signature" {
			t.Errorf("%s: %v, want refused", name, ce)
		}
	}
	if ce := core.AsError(VerifySignature(SignatureNamespace, d, "not a signature", pub)); ce == nil || ce.Code != core.CodeInvalidInput {
		t.Errorf("garbage: %v, want INVALID_INPUT", ce)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
