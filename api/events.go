package api

import (
	"context"
	"encoding/json"

	"github.com/better-compute/better-compute/store"
)

// events.list's bounds: a page holds up to maxEventLimit events
// (defaultEventLimit when the input says nothing, as nodes.events), and a
// filter names at most maxEventTypes types of at most maxEventTypeLength
// characters.
const (
	maxEventTypes      = 32
	maxEventTypeLength = 128
)

// Event is one domain event as events.list returns it.
type Event struct {
	ID           string         `json:"id"`
	Seq          int64          `json:"seq"`
	Type         string         `json:"type"`
	ResourceType string         `json:"resourceType"`
	ResourceID   string         `json:"resourceId"`
	ProjectID    string         `json:"projectId,omitempty"`
	Data         map[string]any `json:"data"`
	CreatedAt    int64          `json:"createdAt"`
}

// EventList is events.list's answer. Next is the cursor of the next page:
// the last item's seq, or the input's cursor when the page is empty.
type EventList struct {
	Items []Event `json:"items"`
	Next  int64   `json:"next"`
}

func (s *Server) eventsList(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		After      *int64          `json:"after"`
		Types      json.RawMessage `json:"types"`
		ResourceID string          `json:"resourceId"`
		Limit      *int            `json:"limit"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	limit, err := limitOf(in.Limit, defaultEventLimit, maxEventLimit)
	if err != nil {
		return nil, err
	}
	var after int64
	if in.After != nil {
		if *in.After < 0 {
			return nil, badField("after", "range", "after must be a seq, at least 0")
		}
		after = *in.After
	}
	types, err := eventTypes(in.Types)
	if err != nil {
		return nil, err
	}
	got, err := store.ListEvents(ctx, tx, store.EventQuery{TenantID: c.TenantID, After: after, Types: types,
		ResourceID: in.ResourceID, Limit: limit})
	if err != nil {
		return nil, err
	}
	out := EventList{Items: make([]Event, len(got)), Next: after}
	for i, e := range got {
		out.Items[i] = Event{ID: e.ID, Seq: e.Seq, Type: e.Type, ResourceType: e.ResourceType, ResourceID: e.ResourceID,
			ProjectID: e.ProjectID, Data: e.Data, CreatedAt: e.CreatedAt.UnixMilli()}
		out.Next = e.Seq
	}
	return out, nil
}

// eventTypes reads the types filter: at most maxEventTypes non-empty strings.
func eventTypes(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var types []string
	if err := json.Unmarshal(raw, &types); err != nil {
		return nil, badField("types", "type", "types must be an array of event types")
	}
	if len(types) > maxEventTypes {
		return nil, badField("types", "maxItems", "types names at most %d event types", maxEventTypes)
	}
	for _, t := range types {
		if t == "" || len(t) > maxEventTypeLength {
			return nil, badField("types", "item", "an event type is 1 to %d characters", maxEventTypeLength)
		}
	}
	return types, nil
}
