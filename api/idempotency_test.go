package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
)

// concurrently posts the same body n times at once over real HTTP and
// returns each answer's status and raw body.
func (e *env) concurrently(n int, token, method, body string) ([]int, []string) {
	e.t.Helper()
	statuses, bodies := make([]int, n), make([]string, n)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}, Timeout: 60 * time.Second}
	url := e.url + "/api/compute/" + strings.Replace(method, ".", "/", 1)
	ready := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("X-Request-Id", testRequestID)
			<-ready
			resp, err := client.Do(req)
			if err != nil {
				bodies[i] = err.Error()
				return
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			statuses[i], bodies[i] = resp.StatusCode, string(raw)
		}()
	}
	close(ready)
	wg.Wait()
	return statuses, bodies
}

// Fifty callers sending one idempotency key at once all get the winner's
// answer: the losers wait for it instead of racing it to the draft's
// primary key (500) or deciding on a draft the winner is completing (403).
func TestConcurrentReplaysOfOneKeyGetTheWinnersAnswer(t *testing.T) {
	e := newEnv(t)
	p, _ := h100Pool(t, e)
	body := fmt.Sprintf(`{"tenantId":"acme","poolId":%q,"devices":{"class":"gpu","count":1},"start":%d,"duration":3600,"idempotencyKey":"same-key"}`,
		p.ID, reservationsT0.UnixMilli())
	e.outer.reset()
	statuses, bodies := e.concurrently(50, e.boot.UserToken, "reservations.create", body)
	// One process decides once: concurrent decisions would each refresh
	// the draft in its projection, and one made while another refresh
	// holds the row out of it can be a spurious denial.
	if r, q := e.outer.require.Load(), e.outer.refresh.Load(); r != 1 || q != 1 {
		t.Errorf("%d Require and %d RefreshResource for one key, want 1 and 1", r, q)
	}
	for i := range statuses {
		if statuses[i] != 200 || bodies[i] != bodies[0] {
			t.Fatalf("call %d = %d %s; call 0 = %d %s", i, statuses[i], bodies[i], statuses[0], bodies[0])
		}
	}
	if !strings.Contains(bodies[0], `"placed"`) {
		t.Fatalf("answer %s, want a placed reservation", bodies[0])
	}
	if n := e.count(`SELECT count(*) FROM reservations`); n != 1 {
		t.Fatalf("%d reservations, want 1", n)
	}
	if n := e.count(`SELECT count(*) FROM device_bookings`); n != 1 {
		t.Fatalf("%d bookings, want 1", n)
	}
	if n := e.count(`SELECT count(*) FROM idempotency_keys WHERE result IS NOT NULL`); n != 1 {
		t.Fatalf("%d completed idempotency rows, want 1", n)
	}
}

// projects.create takes no idempotency key (names are unique in a tenant):
// fifty concurrent creates of one name make one project, and every other
// caller gets the same CONFLICT, never a 500 from the unique index.
func TestConcurrentCreatesOfOneProjectName(t *testing.T) {
	e := newEnv(t)
	statuses, bodies := e.concurrently(50, e.boot.UserToken, "projects.create", `{"tenantId":"acme","name":"same-name"}`)
	created, conflict := 0, ""
	for i, s := range statuses {
		switch {
		case s == 200:
			created++
		case s == 409 && strings.Contains(bodies[i], "CONFLICT") && (conflict == "" || conflict == bodies[i]):
			conflict = bodies[i]
		default:
			t.Fatalf("call %d = %d %s", i, s, bodies[i])
		}
	}
	if created != 1 {
		t.Fatalf("%d creates answered 200, want 1", created)
	}
	if n := e.count(`SELECT count(*) FROM projects WHERE name = 'same-name'`); n != 1 {
		t.Fatalf("%d projects, want 1", n)
	}
}

// A call that decides on a draft while a concurrent call with its key
// completes it answers the stored result, whatever its own decision said:
// the draft it decided on was already being changed under it.
func TestAdmissionDecidingWhileTheKeyCompletesAnswersTheStoredResult(t *testing.T) {
	e := newEnv(t)
	serveCloudResourceDrafts(t, e)
	stored := `{"id":"crs_done","state":"pending"}`
	deny := func(iam.Request) error {
		// The concurrent winner commits its transaction 2 now.
		if _, err := e.store.Pool.Exec(context.Background(), `UPDATE idempotency_keys SET result = $1, completed_at = now()`, stored); err != nil {
			t.Error(err)
		}
		return core.Errorf(core.CodeAccessDenied, "access denied")
	}
	e.outer.onRequire.Store(&deny)
	status, body := e.call(e.stranger, "cloudResources.create", createBody("k5", "postgres"))
	if status != 200 || body != stored {
		t.Fatalf("create = %d %s, want the stored %s", status, body, stored)
	}
}

// When the first call is refused (nothing fits), the concurrent ones with
// its key are refused alike, and the draft is failed once.
func TestConcurrentReplaysOfARefusedKeyAreRefusedAlike(t *testing.T) {
	e := newEnv(t)
	p, _ := h100Pool(t, e)
	body := fmt.Sprintf(`{"tenantId":"acme","poolId":%q,"devices":{"class":"gpu","count":9},"start":%d,"duration":3600,"idempotencyKey":"too-big"}`,
		p.ID, reservationsT0.UnixMilli())
	statuses, bodies := e.concurrently(50, e.boot.UserToken, "reservations.create", body)
	// The first answers the placement's refusal, the others the failure it
	// recorded on the draft: the same code, reason and reservation.
	var first string
	for i := range statuses {
		var out struct {
			Error struct {
				Code    string         `json:"code"`
				Details map[string]any `json:"details"`
			} `json:"error"`
		}
		_ = json.Unmarshal([]byte(bodies[i]), &out)
		id, _ := out.Error.Details["reservationId"].(string)
		if first == "" {
			first = id
		}
		if statuses[i] != 409 || out.Error.Code != "INVALID_STATE" || out.Error.Details["reason"] != "noCapacity" || id != first {
			t.Fatalf("call %d = %d %s", i, statuses[i], bodies[i])
		}
	}
	if n := e.count(`SELECT count(*) FROM reservations`); n != 1 {
		t.Fatalf("%d reservations, want 1", n)
	}
	if n := e.count(`SELECT count(*) FROM device_bookings`); n != 0 {
		t.Fatalf("%d bookings, want 0", n)
	}
}
