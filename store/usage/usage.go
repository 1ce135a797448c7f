// Package usage is the usage domain: summing the metering intervals that
// reservations open and close (store.OpenUsage, store.CloseUsage) into
// unit-hours and GPU-hours over a window. The interval writers stay in
// store, next to the reservation state writer that calls them.
package usage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

// ClassGPU is the atom class whose unit-hours are GPU-hours (whole GPUs;
// core/placement.ClassGPU).
const ClassGPU = "gpu"

// MaxWindow is the longest window a list sums over.
const MaxWindow = 366 * 24 * time.Hour

// Groupings: what an Item's key holds besides the tenant.
const (
	ByTenant      = "tenant"
	ByProject     = "project"
	ByReservation = "reservation"
)

// Item is one group's usage of one (class, gpuModel): unit-hours are atoms
// held × hours within the window; GPU-hours are the unit-hours of class gpu
// (0 for other classes).
type Item struct {
	TenantID      string  `json:"tenantId"`
	ProjectID     string  `json:"projectId,omitempty"`     // set when grouped by project or reservation
	ReservationID string  `json:"reservationId,omitempty"` // set when grouped by reservation
	Class         string  `json:"class"`
	GPUModel      string  `json:"gpuModel"`
	UnitHours     float64 `json:"unitHours"` // units × hours, clipped to the window
	GPUHours      float64 `json:"gpuHours"`  // UnitHours for class "gpu", 0 otherwise
}

// Report is a tenant's usage over [From, To) (epoch milliseconds), a page
// of its groups; Total is the GPU-hours of every group, on every page.
type Report struct {
	From       int64   `json:"from"`
	To         int64   `json:"to"`
	GroupBy    string  `json:"groupBy"`
	Items      []Item  `json:"items"`
	Total      float64 `json:"total"`
	NextCursor string  `json:"nextCursor,omitempty"`
}

// GroupKey is an item's place in a report's order (project, reservation,
// class, gpuModel), as a cursor holds it.
func (it Item) GroupKey() store.Key {
	raw, err := json.Marshal([]string{it.ProjectID, it.ReservationID, it.Class, it.GPUModel})
	if err != nil {
		panic(err) // strings always marshal
	}
	return store.Key{ID: string(raw)}
}

// groupAfter reads a cursor's group key.
func groupAfter(page store.PageQuery) ([]string, error) {
	if page.First() {
		return []string{"", "", "", ""}, nil
	}
	var g []string
	if err := json.Unmarshal([]byte(page.After.ID), &g); err != nil || len(g) != 4 {
		return nil, core.Errorf(core.CodeInvalidInput, "cursor is not a cursor this list answered").
			WithDetails(map[string]any{"field": "cursor", "reason": "malformed"})
	}
	return g, nil
}

// List sums the tenant's usage (one project's when projectID is set) over
// [from, to), epoch milliseconds, grouped by groupBy (ByTenant when "").
// The window must be non-empty and at most MaxWindow long: INVALID_INPUT on
// "to" otherwise. The groups are paged in their order (project,
// reservation, class, gpuModel, ascending); the caller cuts the page
// (Sum reads one group past it).
func List(ctx context.Context, tx store.Tx, tenantID, projectID string, from, to int64, groupBy string, page store.PageQuery) (Report, error) {
	if err := CheckWindow(from, to); err != nil {
		return Report{}, err
	}
	if groupBy == "" {
		groupBy = ByTenant
	}
	q := Query{TenantID: tenantID, ProjectID: projectID,
		From: time.UnixMilli(from), To: time.UnixMilli(to), GroupBy: groupBy, Page: &page}
	rows, err := Sum(ctx, tx, q)
	if err != nil {
		return Report{}, err
	}
	out := Report{From: from, To: to, GroupBy: groupBy, Items: rows}
	if out.Items == nil {
		out.Items = []Item{}
	}
	// The total is every group's, whichever page this is.
	all, err := Sum(ctx, tx, Query{TenantID: tenantID, ProjectID: projectID, From: q.From, To: q.To})
	for _, r := range all {
		out.Total += r.GPUHours
	}
	return out, err
}

// CheckWindow refuses an empty window or one longer than MaxWindow
// (INVALID_INPUT on to).
func CheckWindow(from, to int64) error {
	switch {
	case to <= from:
		return badField("to", "range", "to must be after from")
	case to-from > MaxWindow.Milliseconds():
		return badField("to", "range", "from and to are at most 366 days apart")
	}
	return nil
}

func badField(field, reason, msg string) error {
	return core.Errorf(core.CodeInvalidInput, "%s", msg).WithDetails(map[string]any{"field": field, "reason": reason})
}

// Query sums a tenant's usage over [From, To).
type Query struct {
	TenantID  string
	ProjectID string // "" means every project (and none)
	From, To  time.Time
	GroupBy   string // ByTenant (default), ByProject or ByReservation
	// Page, when set, reads the groups after its key, one past its limit.
	Page *store.PageQuery
}

// Sum clips every interval of the tenant, [started_at, ended_at or now()),
// to [q.From, q.To) and sums units × hours per group and per (class,
// gpuModel), in the groups' order.
func Sum(ctx context.Context, tx store.Tx, q Query) ([]Item, error) {
	if q.TenantID == "" {
		return nil, errors.New("usage: a query without a tenant")
	}
	if !q.To.After(q.From) {
		return nil, fmt.Errorf("usage: the window [%s, %s) is empty", q.From, q.To)
	}
	var project, reservation string
	switch q.GroupBy {
	case "", ByTenant:
		project, reservation = `''`, `''`
	case ByProject:
		project, reservation = `project_id`, `''`
	case ByReservation:
		project, reservation = `project_id`, `reservation_id`
	default:
		return nil, fmt.Errorf("usage: grouped by %q", q.GroupBy)
	}
	// [$3, $4) is the window. An interval counts for the part of it inside
	// the window; intervals that miss the window (or, open and started after
	// now(), have no length yet) are left out, so every span summed is
	// positive.
	first, limit, after := true, -1, []string{"", "", "", ""}
	if q.Page != nil {
		var err error
		if after, err = groupAfter(*q.Page); err != nil {
			return nil, err
		}
		first, limit = q.Page.First(), q.Page.Fetch()
	}
	// The sum is of whole unit-microseconds (exact, in numeric), then one
	// division in float8: what a client summing an export's units ×
	// microseconds computes, to the bit.
	rows, err := tx.Query(ctx, `SELECT * FROM (SELECT `+project+` AS p, `+reservation+` AS r, class, gpu_model,
			sum(units::numeric * (extract(epoch FROM least(coalesce(ended_at, now()), $4) - greatest(started_at, $3)) * 1000000)::bigint)::float8
				/ 3600000000::float8
		FROM usage_intervals
		WHERE tenant_id = $1 AND ($2 = '' OR project_id = $2)
		  AND started_at < $4 AND (ended_at IS NULL OR ended_at > $3)
		  AND least(coalesce(ended_at, now()), $4) > greatest(started_at, $3)
		GROUP BY 1, 2, 3, 4) g
		WHERE $5 OR (g.p, g.r, g.class, g.gpu_model) > ($6, $7, $8, $9)
		ORDER BY 1, 2, 3, 4
		LIMIT CASE WHEN $10 < 0 THEN NULL ELSE $10 END`, q.TenantID, q.ProjectID, q.From, q.To,
		first, after[0], after[1], after[2], after[3], limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Item
	for rows.Next() {
		r := Item{TenantID: q.TenantID}
		if err := rows.Scan(&r.ProjectID, &r.ReservationID, &r.Class, &r.GPUModel, &r.UnitHours); err != nil {
			return nil, err
		}
		if r.Class == ClassGPU {
			r.GPUHours = r.UnitHours
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Interval is one metering interval as an export writes it: clipped to the
// window, what it metered (the class's meter, <class>.hours), how many
// units it held, and its quantity, units × hours within the window.
// Microseconds is the clipped length, exact: units × Microseconds / 3.6e9
// is Quantity, and the sums of a class's unit-microseconds are what
// usage.list sums.
type Interval struct {
	ID            int64   `json:"intervalId"`
	TenantID      string  `json:"tenantId"`
	ProjectID     string  `json:"projectId"`
	ReservationID string  `json:"resourceId"`
	PoolID        string  `json:"poolId"`
	Class         string  `json:"class"`
	Meter         string  `json:"meter"`
	Unit          string  `json:"unit"`
	GPUModel      string  `json:"gpuModel"`
	Units         int     `json:"units"`
	Start         int64   `json:"start"`
	End           int64   `json:"end"`
	Open          bool    `json:"open"`
	Microseconds  int64   `json:"microseconds"`
	Quantity      float64 `json:"quantity"`
}

// Export reads every interval of the tenant (one project's when set) that
// overlaps [q.From, q.To), oldest first, clipped as Sum clips them, and
// hands each to row as it is read: nothing is held but the row.
func Export(ctx context.Context, tx store.Tx, q Query, row func(Interval) error) error {
	rows, err := tx.Query(ctx, `SELECT id, tenant_id, project_id, reservation_id, pool_id, class, gpu_model, units,
			`+store.MsOf("greatest(started_at, $3)")+`, `+store.MsOf("least(coalesce(ended_at, now()), $4)")+`,
			ended_at IS NULL OR ended_at > $4,
			(extract(epoch FROM least(coalesce(ended_at, now()), $4) - greatest(started_at, $3)) * 1000000)::bigint
		FROM usage_intervals
		WHERE tenant_id = $1 AND ($2 = '' OR project_id = $2)
		  AND started_at < $4 AND (ended_at IS NULL OR ended_at > $3)
		  AND least(coalesce(ended_at, now()), $4) > greatest(started_at, $3)
		ORDER BY started_at, id`, q.TenantID, q.ProjectID, q.From, q.To)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var it Interval
		if err := rows.Scan(&it.ID, &it.TenantID, &it.ProjectID, &it.ReservationID, &it.PoolID, &it.Class, &it.GPUModel, &it.Units,
			&it.Start, &it.End, &it.Open, &it.Microseconds); err != nil {
			return err
		}
		it.Meter, it.Unit = it.Class+".hours", "hour"
		it.Quantity = float64(it.Units) * float64(it.Microseconds) / 3.6e9
		if err := row(it); err != nil {
			return err
		}
	}
	return rows.Err()
}
