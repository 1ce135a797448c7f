// Package flavors is the flavors domain's store: a pool's instance shapes
// (the flavors table). It is the only writer of flavors. The instances
// domain reads a flavor with Get in its admission's transaction.
package flavors

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/pools"
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

// prefixed is columns qualified by the alias f.
const prefixed = `f.id, f.tenant_id, f.pool_id, f.name, f.vcpu, f.memory_mib, f.disk_gib, f.gpus, f.gpu_class, f.runtime, f.provider_size,
	(floor(extract(epoch FROM f.created_at) * 1000)::bigint), (floor(extract(epoch FROM f.updated_at) * 1000)::bigint),
	COALESCE((floor(extract(epoch FROM f.deleted_at) * 1000)::bigint), 0)`

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

// Pool classes that have flavors.
const (
	ClassVPSHost  = "vps-host"
	ClassProvider = "provider"
)

// Bounds of a flavor's shape.
const (
	MinVCPU      = 1
	MaxVCPU      = 256
	MinMemoryMiB = 64          // 0.0625 GiB
	MaxMemoryMiB = 4096 * 1024 // 4096 GiB
	MaxDiskGiB   = 65536
	MaxGPUs      = 16
)

// GPUClassOf is the placement class a pool's GPUs are booked as under its
// sharing: whole GPUs, MIG instances or time-sliced (or MPS) slots.
func GPUClassOf(sharing string) string {
	switch sharing {
	case "mig":
		return placement.ClassMIG
	case "timeslice", "mps":
		return placement.ClassSlot
	default:
		return placement.ClassGPU
	}
}

// Shape is a flavor's size. On provider pools it is the provider size's,
// as providerAccounts.offers answers it.
type Shape struct {
	VCPU      int
	MemoryMiB int64
	DiskGiB   int
	GPUs      int
}

// MemoryMiBOf is memoryGiB in MiB; a value that is not a whole number of
// MiB is INVALID_INPUT naming the field.
func MemoryMiBOf(gib float64) (int64, error) {
	mib := gib * 1024
	if math.IsNaN(mib) || mib != math.Trunc(mib) {
		return 0, bad("memoryGiB", "multipleOf", "memoryGiB must be a whole number of MiB (a multiple of 1/1024)")
	}
	return int64(mib), nil
}

func bad(field, reason, format string, args ...any) error {
	return core.Errorf(core.CodeInvalidInput, format, args...).WithDetails(map[string]any{"field": field, "reason": reason})
}

// check refuses a shape out of bounds (the schema bounds the input; this
// holds for updates that keep some fields).
func (s Shape) check() error {
	switch {
	case s.VCPU < MinVCPU || s.VCPU > MaxVCPU:
		return bad("vcpu", "range", "vcpu must be %d to %d", MinVCPU, MaxVCPU)
	case s.MemoryMiB < MinMemoryMiB || s.MemoryMiB > MaxMemoryMiB:
		return bad("memoryGiB", "range", "memoryGiB must be 0.0625 to 4096")
	case s.DiskGiB < 0 || s.DiskGiB > MaxDiskGiB:
		return bad("diskGiB", "range", "diskGiB must be 0 to %d", MaxDiskGiB)
	case s.GPUs < 0 || s.GPUs > MaxGPUs:
		return bad("gpus", "range", "gpus must be 0 to %d", MaxGPUs)
	}
	return nil
}

// New is what flavors.create is given.
type New struct {
	PoolID string
	Name   string
	Shape
	Runtime      string
	ProviderSize string
}

// ownPool reads the tenant's own live pool, locked, for a change of its
// flavors; a pool of another class than vps-host or provider is
// INVALID_INPUT naming poolId, reason poolClass.
func ownPool(ctx context.Context, tx store.Tx, tenantID, poolID string) (pools.Pool, error) {
	p, err := pools.Live(ctx, tx, tenantID, poolID)
	if err != nil {
		return pools.Pool{}, poolField(err)
	}
	if p.Class != ClassVPSHost && p.Class != ClassProvider {
		return pools.Pool{}, bad("poolId", "poolClass", "pool %s is a %s pool; flavors are for vps-host and provider pools", p.ID, p.Class)
	}
	return p, nil
}

// poolField names the input's poolId in a pool's NOT_FOUND or
// INVALID_STATE.
func poolField(err error) error {
	ce := core.AsError(err)
	if ce == nil || (ce.Code != core.CodeNotFound && ce.Code != core.CodeInvalidState) {
		return err
	}
	return ce.WithDetails(map[string]any{"field": "poolId"})
}

// checkClass applies the pool's class: a vps-host flavor has a runtime and
// no provider size, its GPUs booked under the pool's sharing; a provider
// flavor has a provider size and no runtime. It answers the GPU class.
func checkClass(p pools.Pool, runtime, providerSize string, gpus int) (string, error) {
	switch p.Class {
	case ClassVPSHost:
		if providerSize != "" {
			return "", bad("providerSize", "poolClass", "providerSize is for provider pools; pool %s is a vps-host pool", p.ID)
		}
		if runtime != RuntimeContainer && runtime != RuntimeVM {
			return "", bad("runtime", "required", "a vps-host flavor needs runtime (container or vm)")
		}
	default:
		if runtime != "" {
			return "", bad("runtime", "poolClass", "runtime is for vps-host pools; pool %s is a provider pool", p.ID)
		}
		if providerSize == "" {
			return "", bad("providerSize", "required", "a provider flavor needs providerSize, a size slug providerAccounts.offers lists")
		}
	}
	if gpus == 0 {
		return "", nil
	}
	if p.Class == ClassProvider {
		return placement.ClassGPU, nil
	}
	return GPUClassOf(p.Sharing), nil
}

func nameTaken(err error, name string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return core.Errorf(core.CodeConflict, "a flavor named %q exists in this pool", name).WithDetails(map[string]any{"field": "name"})
	}
	return err
}

// Create inserts a flavor of the tenant's own live pool. A live flavor's
// name taken in the pool is CONFLICT naming the field name.
func Create(ctx context.Context, tx store.Tx, tenantID string, n New) (Flavor, error) {
	p, err := ownPool(ctx, tx, tenantID, n.PoolID)
	if err != nil {
		return Flavor{}, err
	}
	if err := n.Shape.check(); err != nil {
		return Flavor{}, err
	}
	gpuClass, err := checkClass(p, n.Runtime, n.ProviderSize, n.GPUs)
	if err != nil {
		return Flavor{}, err
	}
	f, err := scan(tx.QueryRow(ctx, `INSERT INTO flavors
		(id, tenant_id, pool_id, name, vcpu, memory_mib, disk_gib, gpus, gpu_class, runtime, provider_size)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING `+columns,
		core.NewID(IDPrefix), p.TenantID, p.ID, n.Name, n.VCPU, n.MemoryMiB, n.DiskGiB, n.GPUs, gpuClass, n.Runtime, n.ProviderSize))
	if err != nil {
		return Flavor{}, nameTaken(err, n.Name)
	}
	return f, nil
}

// Change is what flavors.update changes; nil fields are kept. The runtime
// never changes.
type Change struct {
	Name         *string
	VCPU         *int
	MemoryMiB    *int64
	DiskGiB      *int
	GPUs         *int
	ProviderSize *string
}

// Update changes a live flavor of the tenant's own live pool: its name or
// shape (instances keep running on their shape until resized).
func Update(ctx context.Context, tx store.Tx, tenantID, poolID, id string, ch Change) (Flavor, error) {
	p, err := ownPool(ctx, tx, tenantID, poolID)
	if err != nil {
		return Flavor{}, err
	}
	f, err := scan(tx.QueryRow(ctx, `SELECT `+columns+` FROM flavors WHERE id = $1 AND pool_id = $2 AND deleted_at IS NULL FOR UPDATE`, id, p.ID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Flavor{}, notFound(id)
	}
	if err != nil {
		return Flavor{}, fmt.Errorf("flavors: reading %s: %w", id, err)
	}
	if ch.Name != nil {
		f.Name = *ch.Name
	}
	if ch.VCPU != nil {
		f.VCPU = *ch.VCPU
	}
	if ch.MemoryMiB != nil {
		f.MemoryMiB = *ch.MemoryMiB
	}
	if ch.DiskGiB != nil {
		f.DiskGiB = *ch.DiskGiB
	}
	if ch.GPUs != nil {
		f.GPUs = *ch.GPUs
	}
	if ch.ProviderSize != nil {
		f.ProviderSize = *ch.ProviderSize
	}
	if err := (Shape{VCPU: f.VCPU, MemoryMiB: f.MemoryMiB, DiskGiB: f.DiskGiB, GPUs: f.GPUs}).check(); err != nil {
		return Flavor{}, err
	}
	if f.GPUClass, err = checkClass(p, f.Runtime, f.ProviderSize, f.GPUs); err != nil {
		return Flavor{}, err
	}
	out, err := scan(tx.QueryRow(ctx, `UPDATE flavors SET name = $2, vcpu = $3, memory_mib = $4, disk_gib = $5, gpus = $6,
		gpu_class = $7, provider_size = $8, updated_at = now() WHERE id = $1 RETURNING `+columns,
		f.ID, f.Name, f.VCPU, f.MemoryMiB, f.DiskGiB, f.GPUs, f.GPUClass, f.ProviderSize))
	if err != nil {
		return Flavor{}, nameTaken(err, f.Name)
	}
	return out, nil
}

// Delete marks a live flavor of the tenant's own pool deleted; its row
// stays for the instances that name it. The pool may be archived: its
// flavors may still be cleaned up.
func Delete(ctx context.Context, tx store.Tx, tenantID, poolID, id string) (Flavor, error) {
	if _, err := pools.Load(ctx, tx, tenantID, poolID); err != nil {
		return Flavor{}, poolField(err)
	}
	f, err := scan(tx.QueryRow(ctx, `UPDATE flavors SET deleted_at = now(), updated_at = now()
		WHERE id = $1 AND pool_id = $2 AND deleted_at IS NULL RETURNING `+columns, id, poolID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Flavor{}, notFound(id)
	}
	return f, err
}

func notFound(id string) error {
	return core.Errorf(core.CodeNotFound, "flavor %s not found", id).WithDetails(map[string]any{"field": "flavorId"})
}

// List reads the live flavors of a pool in the tenant's view (its own, or
// one offered to it), oldest first. A pool outside the view is NOT_FOUND
// naming poolId, exactly like a missing one.
func List(ctx context.Context, tx store.Tx, tenantID, poolID string, page store.PageQuery) ([]Flavor, error) {
	if _, err := pools.View(ctx, tx, tenantID, poolID); err != nil {
		return nil, poolField(err)
	}
	after := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT `+columns+` FROM flavors
		WHERE pool_id = $1 AND deleted_at IS NULL AND (`+store.MsOf("created_at")+`, id) > ($3, $4)
		ORDER BY `+store.MsOf("created_at")+`, id LIMIT $2`, poolID, page.Fetch(), after.At, after.ID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Flavor, error) { return scan(r) })
}

// OfAccount reads the live flavors of the tenant's live provider pools
// backed by the account, oldest first: what providerAccounts.offers maps
// onto the provider's sizes. Pools of other tenants are never read.
func OfAccount(ctx context.Context, tx store.DBTX, tenantID, accountID string) ([]Flavor, error) {
	rows, err := tx.Query(ctx, `SELECT `+prefixed+` FROM flavors f JOIN pools p ON p.id = f.pool_id
		WHERE p.tenant_id = $1 AND p.provider_account_id = $2 AND p.class = 'provider' AND p.archived_at IS NULL
		  AND f.deleted_at IS NULL
		ORDER BY f.created_at, f.id`, tenantID, accountID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Flavor, error) { return scan(r) })
}
