package api

import "context"

// EventsListInput is events.list's input; zero fields are left out.
type EventsListInput struct {
	TenantID   string   `json:"tenantId"`
	After      int64    `json:"after,omitempty"`
	Types      []string `json:"types,omitempty"`
	ResourceID string   `json:"resourceId,omitempty"`
	Limit      int      `json:"limit,omitempty"`
}

// EventsList calls events.list.
func (c *Client) EventsList(ctx context.Context, in EventsListInput) (EventList, error) {
	var out EventList
	return out, c.Call(ctx, "events.list", in, &out)
}

// UsageListInput is usage.list's input; from and to are epoch milliseconds.
type UsageListInput struct {
	TenantID  string `json:"tenantId"`
	From      int64  `json:"from"`
	To        int64  `json:"to"`
	ProjectID string `json:"projectId,omitempty"`
	GroupBy   string `json:"groupBy,omitempty"`
}

// UsageList calls usage.list.
func (c *Client) UsageList(ctx context.Context, in UsageListInput) (UsageList, error) {
	var out UsageList
	return out, c.Call(ctx, "usage.list", in, &out)
}
