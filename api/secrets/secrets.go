// Package secrets describes the secrets.* methods: put a value, delete it.
// There is deliberately no method that reads a value back: a value leaves
// the store only through store/secrets.Vault.Resolve, to the agent that
// uses it, just before its use.
package secrets

import (
	"context"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	coresecrets "github.com/better-compute/better-compute/core/secrets"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/secrets"
)

// Secret is a secret as the methods answer it: the reference, never the
// value.
type Secret = domain.Secret

// PutInput is secrets.put's input. A tenant secret (the default scope) is
// the tenant's own and is decided on compute-tenant; a fleet secret is the
// platform's, kept in the root tenant and decided on compute-fleet.
type PutInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	Scope    string `json:"scope,omitempty" jsonschema:"enum=tenant,enum=fleet" jsonschema_description:"tenant (the default): the tenant's own secret, decided on compute-tenant; fleet: the platform's, in the root tenant, decided on compute-fleet."`
	Name     string `json:"name" jsonschema:"required,maxLength=64,pattern=^[a-z0-9]([a-z0-9._-]{0\\,62}[a-z0-9])?$"`
	// Value is never answered, logged or stored in clear.
	Value       string `json:"value" jsonschema:"required,minLength=1,maxLength=65536" jsonschema_description:"The secret's value, at most 65536 characters. It is sealed at once and never answered back."`
	Description string `json:"description,omitempty" jsonschema:"maxLength=1024"`
	// IdempotencyKey, optional: a retry with it answers the put it made
	// (no new version); the key with another request is CONFLICT.
	IdempotencyKey string `json:"idempotencyKey,omitempty" id:"tenant"`
}

// DeleteInput is secrets.delete's input.
type DeleteInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	Scope    string `json:"scope,omitempty" jsonschema:"enum=tenant,enum=fleet"`
	Name     string `json:"name" jsonschema:"required,maxLength=64,pattern=^[a-z0-9]([a-z0-9._-]{0\\,62}[a-z0-9])?$"`
}

// The methods.
const (
	Put    rpc.Ref[PutInput, Secret]    = "secrets.put"
	Delete rpc.Ref[DeleteInput, Secret] = "secrets.delete"
)

// scopeOf is the scope a call names, tenant when it names none.
func scopeOf(scope string) string {
	if scope == "" {
		return coresecrets.ScopeTenant
	}
	return scope
}

// decideOn picks the decided-on alternative by the scope: the choice needs
// no database read, but the cell's "or" has no rule the table states.
func decideOn(scope string) (string, error) {
	if scopeOf(scope) == coresecrets.ScopeFleet {
		return "fleet", nil
	}
	return "tenant", nil
}

// Methods describes the secrets.* methods.
func Methods(d rpc.Deps) []rpc.Descriptor {
	return []rpc.Descriptor{
		&rpc.Method[PutInput, Secret]{Name: Put, Action: "compute:secrets:manage", DecidedOn: "compute-tenant or compute-fleet",
			Phase: "v0.2", Kind: core.KindMutation,
			DecideOn: func(_ context.Context, _ *rpc.Call, _ store.Tx, in PutInput) (string, error) {
				return decideOn(in.Scope)
			},
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in PutInput) (Secret, error) {
				return d.Secrets.Put(ctx, tx, domain.PutRequest{TenantID: c.TenantID, Name: in.Name, Scope: scopeOf(in.Scope),
					Value: in.Value, Description: in.Description, IdempotencyKey: in.IdempotencyKey, By: c.Caller.IdentityID})
			}},
		&rpc.Method[DeleteInput, Secret]{Name: Delete, Action: "compute:secrets:manage", DecidedOn: "compute-tenant or compute-fleet",
			Phase: "v0.2", Kind: core.KindMutation,
			DecideOn: func(_ context.Context, _ *rpc.Call, _ store.Tx, in DeleteInput) (string, error) {
				return decideOn(in.Scope)
			},
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in DeleteInput) (Secret, error) {
				return d.Secrets.Delete(ctx, tx, c.TenantID, scopeOf(in.Scope), in.Name)
			}},
	}
}
