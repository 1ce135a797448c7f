package nodes

import (
	"context"
	"time"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/sshcerts"
)

// SSHCertificate is an issued SSH certificate, as the methods answer it.
type SSHCertificate = sshcerts.Certificate

// SSHCertificateList is nodes.listSshCerts' answer, oldest first.
type SSHCertificateList struct {
	Items      []SSHCertificate `json:"items"`
	NextCursor string           `json:"nextCursor,omitempty"`
}

// IssueSSHCertInput is nodes.issueSshCert's input: the user's public key
// (one authorized_keys line, no options; not a certificate nor a CA's
// key), the Unix users it logs in as (default root), and how long it is
// valid (default an hour, at most a day).
type IssueSSHCertInput struct {
	TenantID   string   `json:"tenantId" jsonschema:"required" id:"tenant"`
	NodeID     string   `json:"nodeId" jsonschema:"required" id:"node"`
	PublicKey  string   `json:"publicKey" jsonschema:"required,minLength=1,maxLength=16384"`
	Principals []string `json:"principals,omitempty" jsonschema:"maxItems=16,uniqueItems=true,pattern=^[a-z_][a-z0-9_-]{0\\,31}$"`
	TTLSeconds int      `json:"ttlSeconds,omitempty" jsonschema:"minimum=60,maximum=86400"`
	Comment    string   `json:"comment,omitempty" jsonschema:"maxLength=256"`
}

// SSHCertInput names one certificate of a node.
type SSHCertInput struct {
	TenantID      string `json:"tenantId" jsonschema:"required" id:"tenant"`
	NodeID        string `json:"nodeId" jsonschema:"required" id:"node"`
	CertificateID string `json:"certificateId" jsonschema:"required" id:"sshc"`
}

// ListSSHCertsInput is nodes.listSshCerts' input: the node's
// certificates, in state when given, a page of them.
type ListSSHCertsInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	NodeID   string `json:"nodeId" jsonschema:"required" id:"node"`
	State    string `json:"state,omitempty" jsonschema:"enum=active,enum=expired,enum=revoked"`
	rpc.ListInput
}

// The nodes' SSH certificate methods.
const (
	IssueSSHCert  rpc.Ref[IssueSSHCertInput, SSHCertificate]     = "nodes.issueSshCert"
	RevokeSSHCert rpc.Ref[SSHCertInput, SSHCertificate]          = "nodes.revokeSshCert"
	ListSSHCerts  rpc.Ref[ListSSHCertsInput, SSHCertificateList] = "nodes.listSshCerts"
)

func (m methods) sshCerts() []rpc.Descriptor {
	d := m.d
	return []rpc.Descriptor{
		// Signed by the node's tenant's CA (made on first use); the node's
		// NodeSpec generation moves so its agent writes the principals.
		&rpc.Method[IssueSSHCertInput, SSHCertificate]{Name: IssueSSHCert, Action: "compute:nodes:ssh-root", DecidedOn: "compute-node",
			Phase: "v0.3", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in IssueSSHCertInput) (SSHCertificate, error) {
				return sshcerts.Issue(ctx, tx, d.Secrets, sshcerts.IssueRequest{TenantID: c.TenantID, NodeID: in.NodeID,
					PublicKey: in.PublicKey, Users: in.Principals, TTL: time.Duration(in.TTLSeconds) * time.Second,
					Comment: in.Comment, By: c.Caller.IdentityID})
			}},
		// Idempotent; a revocation of a live certificate moves the node's
		// NodeSpec generation, so its agent adds it to sshd's KRL.
		&rpc.Method[SSHCertInput, SSHCertificate]{Name: RevokeSSHCert, Action: "compute:nodes:ssh-root", DecidedOn: "compute-node",
			Phase: "v0.3", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in SSHCertInput) (SSHCertificate, error) {
				return sshcerts.Revoke(ctx, tx, c.TenantID, in.NodeID, in.CertificateID, c.Caller.IdentityID)
			}},
		// Oldest first: creation millisecond, then id.
		&rpc.Method[ListSSHCertsInput, SSHCertificateList]{Name: ListSSHCerts, Action: "compute:nodes:read", DecidedOn: "compute-node",
			Phase: "v0.3", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ListSSHCertsInput) (SSHCertificateList, error) {
				q, err := in.Page()
				if err != nil {
					return SSHCertificateList{}, err
				}
				read, err := sshcerts.List(ctx, tx, c.TenantID, in.NodeID, in.State, q)
				items, next := rpc.Paged(read, q, SSHCertificate.Key)
				return SSHCertificateList{Items: items, NextCursor: next}, err
			}},
	}
}
