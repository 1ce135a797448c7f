package iam

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	golanglru "github.com/hashicorp/golang-lru/v2"
	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
)

// HostPathTenant is the IAM host's tenant lookup (TenantKnown).
const HostPathTenant = HostPathPrefix + "tenant"

// knownTenantsSize bounds the cache of tenants known to exist. IAM never
// deletes a tenant, so a known tenant stays known and only unknown ones
// are asked again each time.
const knownTenantsSize = 4096

// knownTenants caches the tenants IAM answered as known: a root caller's
// every call into another tenant asks, so a known tenant must not cost a
// query (or a round trip to the IAM host) each time.
type knownTenants struct {
	c *golanglru.Cache[string, struct{}]
}

func newKnownTenants() knownTenants {
	c, err := golanglru.New[string, struct{}](knownTenantsSize)
	if err != nil { // only for a size below one
		panic(fmt.Sprintf("iam: known-tenant cache: %v", err))
	}
	return knownTenants{c}
}

// lookup answers from the cache, else asks and caches a known tenant.
func (k knownTenants) lookup(tenantID string, ask func() (bool, error)) (bool, error) {
	if k.c.Contains(tenantID) {
		return true, nil
	}
	known, err := ask()
	if err == nil && known {
		k.c.Add(tenantID, struct{}{})
	}
	return known, err
}

// TenantKnown reports whether tenantID is one of IAM's tenants (ids are
// case-sensitive: "ROOT" is not the root tenant "root").
func (e *Embedded) TenantKnown(ctx context.Context, _ *Caller, tenantID string) (bool, error) {
	return e.tenants.lookup(tenantID, func() (bool, error) {
		var one int
		err := e.db.Pool.QueryRow(ctx, `SELECT 1 FROM iam_tenants WHERE id = $1`, tenantID).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		if err != nil {
			return false, core.Wrap(core.CodeUnavailable, err, "IAM is unavailable")
		}
		return true, nil
	})
}

// TenantKnown passes the question through: the port behind keeps the
// known tenants.
func (p *CachingPort) TenantKnown(ctx context.Context, c *Caller, tenantID string) (bool, error) {
	return p.inner.TenantKnown(ctx, c, tenantID)
}

type wireTenant struct {
	TenantID string `json:"tenantId"`
}

type wireTenantKnown struct {
	Known bool `json:"known"`
}

// TenantKnown asks the IAM host with c's credential; the host answers only
// callers with root authority.
func (p *RemotePort) TenantKnown(ctx context.Context, c *Caller, tenantID string) (bool, error) {
	return p.tenants.lookup(tenantID, func() (bool, error) {
		h, err := decisionHeaders(&Request{Caller: c})
		if err != nil {
			return false, err
		}
		var out wireTenantKnown
		if err := p.call(ctx, HostPathTenant, h, wireTenant{TenantID: tenantID}, &out); err != nil {
			return false, err
		}
		return out.Known, nil
	})
}

// tenantKnown serves HostPathTenant: only a caller with root authority may
// learn whether a tenant exists, as only such a caller acts in another
// tenant.
func (h *iamHost) tenantKnown(w http.ResponseWriter, r *http.Request) {
	c, err := h.caller(r)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	var in wireTenant
	if err := readStrict(w, r, &in); err != nil {
		h.writeErr(w, r, err)
		return
	}
	if !c.RootAuthority {
		h.writeErr(w, r, core.Errorf(core.CodeAccessDenied, "access denied"))
		return
	}
	known, err := h.port.TenantKnown(r.Context(), c, in.TenantID)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	hostWriteJSON(w, http.StatusOK, wireTenantKnown{Known: known})
}
