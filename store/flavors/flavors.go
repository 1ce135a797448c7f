// Package flavors is the flavors domain's store: a pool's instance shapes
// (the flavors table). It is the only writer of flavors. The instances
// domain reads a flavor with Get in its admission's transaction.
package flavors

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

// IDPrefix starts every flavor id.
const IDPrefix = "flv"

// Runtimes of vps-host flavors.
const (
	RuntimeContainer = "container"
	RuntimeVM        = "vm"
)

// Flavor is one of a pool's instance shapes, as the API answers it.
type Flavor struct {
	ID        string  `json:"id"`
	TenantID  string  `json:"tenantId"`
	PoolID    string  `json:"poolId"`
	Name      string  `json:"name"`
	VCPU      int     `json:"vcpu"`
	MemoryMiB int64   `json:"memoryMiB"`
	MemoryGiB float64 `json:"memoryGiB"`
	DiskGiB   int     `json:"diskGiB"`
	GPUs      int     `json:"gpus"`
	// GPUClass is the placement class of the GPUs (gpu, mig or slot),
	// empty without GPUs.
	GPUClass string `json:"gpuClass,omitempty"`
	// Runtime is container or vm on vps-host pools; ProviderSize the
	// provider's size slug on provider pools (exactly one is set).
	Runtime      string `json:"runtime,omitempty"`
	ProviderSize string `json:"providerSize,omitempty"`
	CreatedAt    int64  `json:"createdAt"`
	UpdatedAt    int64  `json:"updatedAt"`
	DeletedAt    int64  `json:"deletedAt,omitempty"`
}

// columns are what scan reads; instants in epoch milliseconds.
const columns = `id, tenant_id, pool_id, name, vcpu, memory_mib, disk_gib, gpus, gpu_class, runtime, provider_size,
	(floor(extract(epoch FROM created_at) * 1000)::bigint), (floor(extract(epoch FROM updated_at) * 1000)::bigint),
	COALESCE((floor(extract(epoch FROM deleted_at) * 1000)::bigint), 0)`

func scan(row pgx.Row) (Flavor, error) {
	var f Flavor
	err := row.Scan(&f.ID, &f.TenantID, &f.PoolID, &f.Name, &f.VCPU, &f.MemoryMiB, &f.DiskGiB, &f.GPUs, &f.GPUClass,
		&f.Runtime, &f.ProviderSize, &f.CreatedAt, &f.UpdatedAt, &f.DeletedAt)
	f.MemoryGiB = float64(f.MemoryMiB) / 1024
	return f, err
}

// Get reads a live flavor of the pool; a missing or deleted one is
// NOT_FOUND.
func Get(ctx context.Context, tx store.DBTX, poolID, id string) (Flavor, error) {
	f, err := scan(tx.QueryRow(ctx, `SELECT `+columns+` FROM flavors
		WHERE id = $1 AND pool_id = $2 AND deleted_at IS NULL`, id, poolID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Flavor{}, core.Errorf(core.CodeNotFound, "flavor %s not found", id)
	}
	if err != nil {
		return Flavor{}, fmt.Errorf("flavors: reading %s: %w", id, err)
	}
	return f, nil
}
