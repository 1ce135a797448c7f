package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	"github.com/better-compute/better-compute/api/projects"
	"github.com/better-compute/better-compute/api/reservations"
)

// reservations.list builds its items' JSON in SQL: each item must be the
// answer reservations.get gives for the same row, key for key (fields
// left out stay left out), whatever the row holds.
func TestReservationsListAnswersAsGet(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a := e.client(e.boot.UserToken)
	p, _ := h100Pool(t, e)
	prj, err := projects.Create.Call(ctx, a, projects.CreateInput{TenantID: "acme", Name: "listed"})
	if err != nil {
		t.Fatal(err)
	}
	lease := int64(600)
	inputs := []reservations.CreateInput{
		reserveInput("acme", p.ID, "plain", 2, reservationsT0, 3600),
		reserveInput("acme", p.ID, "project", 1, reservationsT0, 7200),
		reserveInput("acme", p.ID, "spot", 1, reservationsT0.Add(3*3600e9), 3600),
		reserveInput("acme", p.ID, "cancelled", 1, reservationsT0.Add(5*3600e9), 3600),
		reserveInput("acme", p.ID, "odd", 1, reservationsT0.Add(7*3600e9), 3600),
	}
	inputs[1].ProjectID, inputs[1].LeaseSeconds = prj.ID, &lease
	inputs[2].Spot = true
	var ids []string
	for _, in := range inputs {
		r, err := reservations.Create.Call(ctx, a, in)
		if err != nil {
			t.Fatalf("%s: %v", in.IdempotencyKey, err)
		}
		ids = append(ids, r.ID)
	}
	if _, err := reservations.Cancel.Call(ctx, a, reservations.ReservationInput{TenantID: "acme", ReservationID: ids[3]}); err != nil {
		t.Fatal(err)
	}
	// Every nullable column set, with text JSON must escape.
	if _, err := e.store.Pool.Exec(ctx, `UPDATE reservations SET failure = '{"code":"X","message":"<a & \"b\">\u2028"}',
		end_reason = 'nodeLost', ended_at = now(), lease_expires_at = now(),
		conditions = '[{"type":"NodeUnreachable","nodeId":"node_x","since":5}]' WHERE id = $1`, ids[4]); err != nil {
		t.Fatal(err)
	}

	status, body := e.call(e.boot.UserToken, "reservations.list", `{"tenantId":"acme","scope":"all"}`)
	var list struct {
		Items []map[string]any `json:"items"`
	}
	if status != 200 || json.Unmarshal([]byte(body), &list) != nil || len(list.Items) != len(ids) {
		t.Fatalf("list = %d %.300s", status, body)
	}
	// The rows do hold what the comparison is about.
	has := map[string][]string{ids[1]: {"projectId", "leaseSeconds"}, ids[4]: {"failure", "endReason", "endedAt", "leaseExpiresAt"}}
	for _, item := range list.Items {
		id, _ := item["id"].(string)
		for _, k := range has[id] {
			if _, ok := item[k]; !ok {
				t.Errorf("listed %s has no %s: %v", id, k, item)
			}
		}
		status, got := e.call(e.boot.UserToken, "reservations.get", fmt.Sprintf(`{"tenantId":"acme","reservationId":%q}`, id))
		var want map[string]any
		if status != 200 || json.Unmarshal([]byte(got), &want) != nil {
			t.Fatalf("get %s = %d %s", id, status, got)
		}
		if !reflect.DeepEqual(item, want) {
			t.Errorf("listed %s:\n %v\nget answers:\n %v", id, item, want)
		}
	}
}
