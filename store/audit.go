package store

import (
	"context"
	"fmt"

	"github.com/better-compute/better-compute/core"
)

// Caller is a call's admission context as an audit row records it: who
// (identity, session), through what (agent, delegation) and which request.
// Work a call leaves to a workflow (a fleet apply's changes, a command
// batch's commands) keeps its caller in its row, so the audit rows the
// workflow writes name the person who asked.
type Caller struct {
	IdentityID   string `json:"identityId"`
	IdentityKind string `json:"identityKind"`
	SessionID    string `json:"sessionId"`
	SessionKind  string `json:"sessionKind"`
	MFA          bool   `json:"mfa"`
	AgentID      string `json:"agentId,omitempty"`
	DelegatedBy  string `json:"delegatedBy,omitempty"`
	RequestID    string `json:"requestId"`
	SourceIP     string `json:"sourceIp,omitempty"`
}

// Audit is one audit_events row: an allowed mutation of a resource by a
// method (with the method table's action), under a caller.
type Audit struct {
	TenantID     string
	Method       string
	Action       string // "": the method table's action of Method
	ResourceType string
	ResourceID   string
	Caller       Caller
	Override     bool // made with root authority in another tenant
}

// WriteAudit writes a in tx, the mutation's own transaction.
func WriteAudit(ctx context.Context, tx Tx, a Audit) error {
	if a.Action == "" {
		action, err := core.ActionOf(a.Method)
		if err != nil {
			return fmt.Errorf("audit: %w", err)
		}
		a.Action = action
	}
	k := a.Caller
	_, err := tx.Exec(ctx, `INSERT INTO audit_events
		(id, tenant_id, method, action, resource_type, resource_id, identity_id, identity_kind,
		 session_id, session_kind, mfa, agent_id, delegated_by, request_id, source_ip, override)
		VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,NULLIF($12,''),NULLIF($13,''),$14,NULLIF($15,''),$16)`,
		core.NewID("aud"), a.TenantID, a.Method, a.Action, a.ResourceType, a.ResourceID, k.IdentityID, k.IdentityKind,
		k.SessionID, k.SessionKind, k.MFA, k.AgentID, k.DelegatedBy, k.RequestID, k.SourceIP, a.Override)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	return nil
}
