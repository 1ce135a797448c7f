// Package batches holds the rules of command batches that need no I/O:
// which command kinds are destructive, a batch's digest (its commands and
// its exact node list, what approvers sign), and whether approvals make a
// quorum. The store, methods and workflow that run batches build on it.
package batches

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hiddeco/sshsig"
	"golang.org/x/crypto/ssh"

	"github.com/better-compute/better-compute/core"
)

// SignatureNamespace is the SSHSIG namespace of an approval: a signature
// made for anything else (an image, a git commit) never approves a batch.
const SignatureNamespace = "better-compute-command-batch"

// CancelNamespace is the SSHSIG namespace of a cancellation, signed over
// the same digest: an approval is never replayed as a cancel, nor the
// other way round.
const CancelNamespace = "better-compute-command-batch-cancel"

// destructive are the node command kinds a batch runs only behind a
// quorum: they lose work or state on the node.
var destructive = []string{"exec", "reboot"}

// Destructive reports whether a command kind needs a quorum.
func Destructive(kind string) bool { return slices.Contains(destructive, kind) }

// Command is one command a batch runs on every node of its list.
type Command struct {
	Kind string          `json:"kind"`
	Args json.RawMessage `json:"args,omitempty"`
}

// Batch is what a digest covers: the batch, its tenant, its commands in
// order and the exact nodes it would touch.
type Batch struct {
	ID       string    `json:"id"`
	TenantID string    `json:"tenantId"`
	Commands []Command `json:"commands"`
	Nodes    []string  `json:"nodes"`
	Quorum   int       `json:"quorum"`
}

// Digest is the SHA-256 of the batch's canonical JSON (nodes sorted;
// arguments compacted), as sha256:<hex>: the text approvers sign.
func Digest(b Batch) (string, error) {
	b.Nodes = slices.Sorted(slices.Values(b.Nodes))
	cmds := make([]Command, len(b.Commands))
	for i, c := range b.Commands {
		cmds[i] = c
		if len(c.Args) > 0 {
			var v any
			if err := json.Unmarshal(c.Args, &v); err != nil {
				return "", fmt.Errorf("batches: command %d args: %w", i, err)
			}
			raw, err := json.Marshal(v) // map keys sorted: one form for one value
			if err != nil {
				return "", err
			}
			cmds[i].Args = raw
		}
	}
	b.Commands = cmds
	raw, err := json.Marshal(b)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(raw)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// NeedsQuorum reports whether any of the batch's commands is destructive.
func NeedsQuorum(b Batch) bool {
	return slices.ContainsFunc(b.Commands, func(c Command) bool { return Destructive(c.Kind) })
}

// Approval is one approver's signature of a digest, valid until ExpiresAt.
type Approval struct {
	Approver  string
	Digest    string
	ExpiresAt time.Time
}

// CheckApproval refuses an approval a batch may not count: by the batch's
// creator, by an approver who already approved it, over another digest
// than the batch's current one, or already expired. Each is INVALID_STATE
// with a reason.
func CheckApproval(digest, creator string, have []Approval, a Approval, now time.Time) error {
	switch {
	case a.Approver == creator:
		return refused("creator", "the batch's creator cannot approve it")
	case slices.ContainsFunc(have, func(h Approval) bool { return h.Approver == a.Approver }):
		return refused("duplicate", "approver "+a.Approver+" already approved this batch")
	case a.Digest != digest:
		return refused("digest", "the signature is over "+a.Digest+", not the batch's digest "+digest+" (its commands or nodes changed)")
	case !a.ExpiresAt.After(now):
		return refused("expired", "the approval has expired")
	}
	return nil
}

// Quorate reports whether approvals hold quorum distinct, unexpired
// approvers of digest, none the creator.
func Quorate(digest, creator string, quorum int, approvals []Approval, now time.Time) bool {
	seen := map[string]bool{}
	for _, a := range approvals {
		if a.Approver != creator && a.Digest == digest && a.ExpiresAt.After(now) {
			seen[a.Approver] = true
		}
	}
	return len(seen) >= quorum
}

// VerifySignature checks an armored SSHSIG signature of digest, in
// namespace (SignatureNamespace or CancelNamespace), against an
// approver's registered key.
func VerifySignature(namespace, digest, armored string, key ssh.PublicKey) error {
	sig, err := sshsig.Unarmor([]byte(strings.TrimSpace(armored)))
	if err != nil {
		return core.Errorf(core.CodeInvalidInput, "signature: not an armored SSH signature: %v", err).
			WithDetails(map[string]any{"field": "signature", "reason": "format"})
	}
	if err := sshsig.Verify(strings.NewReader(digest), sig, key, sig.HashAlgorithm, namespace); err != nil {
		return refused("signature", "the signature does not verify with the approver's key over the batch's digest")
	}
	return nil
}

func refused(reason, msg string) error {
	return core.Errorf(core.CodeInvalidState, "%s", msg).WithDetails(map[string]any{"reason": reason})
}
