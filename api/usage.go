package api

import (
	"context"
	"time"

	"github.com/better-compute/better-compute/store"
)

// maxUsageWindow is the longest window usage.list sums over.
const maxUsageWindow = 366 * 24 * time.Hour

// UsageItem is one group's usage of one (class, gpuModel): unit-hours are
// atoms held × hours within the window; GPU-hours are the unit-hours of
// class gpu (0 for other classes).
type UsageItem struct {
	TenantID      string  `json:"tenantId"`
	ProjectID     string  `json:"projectId,omitempty"`
	ReservationID string  `json:"reservationId,omitempty"`
	Class         string  `json:"class"`
	GPUModel      string  `json:"gpuModel"`
	UnitHours     float64 `json:"unitHours"`
	GPUHours      float64 `json:"gpuHours"`
}

// UsageList is usage.list's answer over [From, To) (epoch milliseconds);
// Total is the items' GPU-hours.
type UsageList struct {
	From    int64       `json:"from"`
	To      int64       `json:"to"`
	GroupBy string      `json:"groupBy"`
	Items   []UsageItem `json:"items"`
	Total   float64     `json:"total"`
}

func (s *Server) usageList(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		From      int64  `json:"from"`
		To        int64  `json:"to"`
		ProjectID string `json:"projectId"`
		GroupBy   string `json:"groupBy"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	switch {
	case in.From < 0:
		return nil, badField("from", "range", "from must be epoch milliseconds, at least 0")
	case in.To <= in.From:
		return nil, badField("to", "range", "to must be after from")
	case in.To-in.From > maxUsageWindow.Milliseconds():
		return nil, badField("to", "range", "from and to are at most 366 days apart")
	}
	if in.GroupBy == "" {
		in.GroupBy = store.UsageByTenant
	}
	rows, err := store.SumUsage(ctx, tx, store.UsageQuery{TenantID: c.TenantID, ProjectID: in.ProjectID,
		From: time.UnixMilli(in.From), To: time.UnixMilli(in.To), GroupBy: in.GroupBy})
	if err != nil {
		return nil, err
	}
	out := UsageList{From: in.From, To: in.To, GroupBy: in.GroupBy, Items: make([]UsageItem, len(rows))}
	for i, r := range rows {
		out.Items[i] = UsageItem{TenantID: r.TenantID, ProjectID: r.ProjectID, ReservationID: r.ReservationID,
			Class: r.Class, GPUModel: r.GPUModel, UnitHours: r.UnitHours, GPUHours: r.GPUHours}
		out.Total += r.GPUHours
	}
	return out, nil
}
