// Package visibility names what operators search and read workflows by in
// Temporal: the custom search attributes every control-plane workflow is
// started with, and its memo. The names are registered on the Temporal
// server (deploy/temporal does it for the embedded server; docs/temporal.md
// has the commands for a production cluster) and are persisted in
// visibility records, so they never change.
package visibility

import (
	"go.temporal.io/sdk/temporal"
)

// The custom search attributes, all of type Keyword.
const (
	TenantID = "TenantId"
	PoolID   = "PoolId"
	NodeID   = "NodeId"
	State    = "State"
)

// Keywords are the custom search attributes a Temporal namespace must
// define before a control-plane workflow starts there.
func Keywords() []string { return []string{TenantID, PoolID, NodeID, State} }

// Fields are the values a workflow is found by; an empty field is not set.
type Fields struct {
	TenantID, PoolID, NodeID, State string
}

// SearchAttributes are the typed search attributes of a workflow start.
func (f Fields) SearchAttributes() temporal.SearchAttributes {
	var updates []temporal.SearchAttributeUpdate
	for _, kv := range [][2]string{{TenantID, f.TenantID}, {PoolID, f.PoolID}, {NodeID, f.NodeID}, {State, f.State}} {
		if kv[1] != "" {
			updates = append(updates, temporal.NewSearchAttributeKeyKeyword(kv[0]).ValueSet(kv[1]))
		}
	}
	return temporal.NewSearchAttributes(updates...)
}

// Memo is what the Temporal UI shows on a workflow's page: the same
// fields under their JSON names, with what the workflow drives.
func (f Fields) Memo(kind string) map[string]any {
	m := map[string]any{"kind": kind}
	for _, kv := range [][2]string{{"tenantId", f.TenantID}, {"poolId", f.PoolID}, {"nodeId", f.NodeID}} {
		if kv[1] != "" {
			m[kv[0]] = kv[1]
		}
	}
	return m
}

// SetState is the update of the State search attribute a workflow
// upserts on each transition.
func SetState(state string) temporal.SearchAttributeUpdate {
	return temporal.NewSearchAttributeKeyKeyword(State).ValueSet(state)
}

// QueryState is the query every long-running control-plane workflow
// answers with its current state (a string, or a small struct for
// workflows with more to say).
const QueryState = "state"
