// Package usage describes the usage.* methods.
package usage

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/usage"
)

// Item is one group's usage of one (class, gpuModel).
type Item = domain.Item

// Report is usage.list's answer: the items and their total GPU-hours.
type Report = domain.Report

// ListInput is usage.list's input. From and To are epoch milliseconds, To
// after From and at most 366 days later (the domain checks the window);
// GroupBy defaults to "tenant". With a project, the call is decided on it.
type ListInput struct {
	TenantID  string `json:"tenantId" jsonschema:"required" id:"tenant"`
	From      int64  `json:"from" jsonschema:"required,minimum=0,maximum=9007199254740992" unit:"epoch-ms"`
	To        int64  `json:"to" jsonschema:"required" unit:"epoch-ms"`
	ProjectID string `json:"projectId,omitempty" id:"prj"`
	GroupBy   string `json:"groupBy,omitempty" jsonschema:"enum=tenant,enum=project,enum=reservation"`
	rpc.ListInput
}

// The groupings usage.list's groupBy names.
const (
	ByTenant      = domain.ByTenant
	ByProject     = domain.ByProject
	ByReservation = domain.ByReservation
)

// ExportInput is usage.export's input: the window (as usage.list's) and
// the format, jsonl (one JSON object a line, the default) or csv (a header
// line, then one line an interval).
type ExportInput struct {
	TenantID  string `json:"tenantId" jsonschema:"required" id:"tenant"`
	From      int64  `json:"from" jsonschema:"required,minimum=0,maximum=9007199254740992" unit:"epoch-ms"`
	To        int64  `json:"to" jsonschema:"required" unit:"epoch-ms"`
	ProjectID string `json:"projectId,omitempty" id:"prj"`
	Format    string `json:"format,omitempty" jsonschema:"enum=jsonl,enum=csv"`
}

// Interval is one exported line.
type Interval = domain.Interval

// The methods.
const (
	List   rpc.Ref[ListInput, Report]       = "usage.list"
	Export rpc.Ref[ExportInput, rpc.Stream] = "usage.export"
)

// csvHeader is the csv export's first line, Interval's fields in order.
var csvHeader = []string{"intervalId", "tenantId", "projectId", "resourceId", "poolId", "class", "meter", "unit", "gpuModel",
	"units", "start", "end", "open", "microseconds", "quantity"}

func csvRecord(it Interval) []string {
	return []string{strconv.FormatInt(it.ID, 10), it.TenantID, it.ProjectID, it.ReservationID, it.PoolID, it.Class, it.Meter, it.Unit,
		it.GPUModel, strconv.Itoa(it.Units), strconv.FormatInt(it.Start, 10), strconv.FormatInt(it.End, 10), strconv.FormatBool(it.Open),
		strconv.FormatInt(it.Microseconds, 10), strconv.FormatFloat(it.Quantity, 'g', -1, 64)}
}

// export streams the intervals of the window in one read-only snapshot
// (REPEATABLE READ), so the lines are one consistent state however long
// the client takes to read them.
func export(d rpc.Deps, c *rpc.Call, in ExportInput) rpc.Stream {
	q := domain.Query{TenantID: c.TenantID, ProjectID: in.ProjectID, From: time.UnixMilli(in.From), To: time.UnixMilli(in.To)}
	contentType := "application/x-ndjson"
	if in.Format == "csv" {
		contentType = "text/csv; charset=utf-8"
	}
	return rpc.Stream{ContentType: contentType, Write: func(ctx context.Context, w rpc.StreamWriter) error {
		return d.Store.InTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead}, func(tx store.Tx) error {
			if in.Format == "csv" {
				cw := csv.NewWriter(w)
				if err := cw.Write(csvHeader); err != nil {
					return err
				}
				err := domain.Export(ctx, tx, q, func(it Interval) error {
					w.Row()
					return cw.Write(csvRecord(it))
				})
				cw.Flush()
				if err != nil {
					return err
				}
				return cw.Error()
			}
			enc := json.NewEncoder(w)
			return domain.Export(ctx, tx, q, func(it Interval) error {
				w.Row()
				return enc.Encode(it)
			})
		})
	}}
}

// Methods describes the usage.* methods.
func Methods(d rpc.Deps) []rpc.Descriptor {
	return []rpc.Descriptor{
		// Streamed, never buffered: the envelope decides, then the answer's
		// lines go out as they are read (rpc.Stream).
		&rpc.Method[ExportInput, rpc.Stream]{Name: Export, Action: "compute:usage:read", DecidedOn: "compute-tenant or compute-project",
			Phase: "v0.2", Kind: core.KindRead,
			Direct: func(ctx context.Context, c *rpc.Call, in ExportInput) (rpc.Stream, error) {
				if err := domain.CheckWindow(in.From, in.To); err != nil {
					return rpc.Stream{}, err
				}
				return export(d, c, in), nil
			}},
		&rpc.Method[ListInput, Report]{Name: List, Action: "compute:usage:read", DecidedOn: "compute-tenant or compute-project",
			Phase: "v0.1", Kind: core.KindRead,
			// By group: project, reservation, class, gpuModel, ascending.
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ListInput) (Report, error) {
				q, err := in.Page()
				if err != nil {
					return Report{}, err
				}
				r, err := domain.List(ctx, tx, c.TenantID, in.ProjectID, in.From, in.To, in.GroupBy, q)
				r.Items, r.NextCursor = rpc.Paged(r.Items, q, Item.GroupKey)
				return r, err
			}},
	}
}
