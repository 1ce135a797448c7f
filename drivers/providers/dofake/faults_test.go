package dofake_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/godo"
	"golang.org/x/oauth2"

	"github.com/better-compute/better-compute/drivers/providers/dofake"
	"github.com/better-compute/better-compute/internal/testutil"
)

func TestAuthentication(t *testing.T) {
	e := newEnv(t, dofake.Settings{})
	for _, tc := range []struct {
		name   string
		token  string
		status int
	}{
		{"no token", "", 401},
		{"an unknown token", "dop_v1_other", 401},
		{"the token", token, 200},
	} {
		_, resp, err := newClient(t, e.srv.URL, tc.token).Sizes.List(context.Background(), nil)
		if resp.StatusCode != tc.status {
			t.Errorf("%s: %d %v, want %d", tc.name, resp.StatusCode, err, tc.status)
		}
	}
	e.fake.AddToken("dop_v1_other")
	if _, _, err := newClient(t, e.srv.URL, "dop_v1_other").Sizes.List(context.Background(), nil); err != nil {
		t.Fatalf("an added token: %v", err)
	}
	if n := e.fake.Requests("GET /v2/sizes"); n != 4 {
		t.Fatalf("GET /v2/sizes counted %d, want 4", n)
	}
}

// TestErrorBodies reads DigitalOcean's error body as it is on the wire
// (godo keeps only its message).
func TestErrorBodies(t *testing.T) {
	e := newEnv(t, dofake.Settings{PerMinute: 1})
	for _, tc := range []struct {
		method, path, token, body string
		status                    int
		id                        string
	}{
		{"GET", "/v2/droplets", "", "", 401, "unauthorized"},
		{"GET", "/v2/droplets/12", token, "", 404, "not_found"},
		{"POST", "/v2/droplets", "other", `{"name":"a"}`, 401, "unauthorized"},
		{"GET", "/v2/droplets/12", token, "", 429, "too_many_requests"},
	} {
		req, _ := http.NewRequest(tc.method, e.srv.URL+tc.path, bytes.NewBufferString(tc.body))
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			ID        string `json:"id"`
			Message   string `json:"message"`
			RequestID string `json:"request_id"`
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err := json.Unmarshal(raw, &body); err != nil {
			t.Fatalf("%s %s: %q: %v", tc.method, tc.path, raw, err)
		}
		if resp.StatusCode != tc.status || body.ID != tc.id || body.Message == "" || body.RequestID == "" ||
			resp.Header.Get("X-Request-Id") != body.RequestID || resp.Header.Get("Content-Type") != "application/json; charset=utf-8" {
			t.Errorf("%s %s: %d %s %v", tc.method, tc.path, resp.StatusCode, raw, resp.Header)
		}
	}
	// A 422 names its reason.
	e.clock.Advance(time.Minute)
	_, _, err := e.do.Droplets.Create(context.Background(), &godo.DropletCreateRequest{Name: "a", Region: "nyc3", Size: "nope", Image: godo.DropletCreateImage{Slug: "debian-12-x64"}})
	var er *godo.ErrorResponse
	if !errors.As(err, &er) || er.Response.StatusCode != 422 || er.Message != "You specified an invalid size for Droplet creation." || er.RequestID == "" {
		t.Fatalf("422: %v", err)
	}
}

func TestRateLimits(t *testing.T) {
	e := newEnv(t, dofake.Settings{PerMinute: 3, PerHour: 5})
	other := newClient(t, e.srv.URL, "dop_v1_second")
	e.fake.AddToken("dop_v1_second")
	ctx := context.Background()
	start := epoch.Unix()
	for i, step := range []struct {
		advance    time.Duration
		status     int
		remaining  int
		reset      int64 // seconds after the start
		retryAfter string
	}{
		{0, 200, 4, 3600, ""},
		{0, 200, 3, 3600, ""},
		{30 * time.Second, 200, 2, 3600, ""},
		{0, 429, 2, 3600, "30"}, // the minute's burst is spent; the oldest leaves it in 30 s
		{30 * time.Second, 200, 1, 3600, ""},
		{30 * time.Second, 200, 0, 3600, ""},
		{5 * time.Minute, 429, 0, 3600, "3210"}, // the hour is spent: the first two expire at +3600 s
		{3210 * time.Second, 200, 1, 3630, ""},  // they did; the next oldest expires at +3630 s
		{0, 200, 0, 3630, ""},
		{0, 429, 0, 3630, "30"},
	} {
		e.clock.Advance(step.advance)
		_, resp, err := e.do.Regions.List(ctx, nil)
		if resp.StatusCode != step.status || resp.Rate.Limit != 5 || resp.Rate.Remaining != step.remaining ||
			resp.Rate.Reset.Unix() != start+step.reset || resp.Header.Get("Retry-After") != step.retryAfter {
			t.Fatalf("request %d: %d (%v), limit %d remaining %d reset +%ds retry-after %q; want %d, remaining %d, reset +%ds, retry-after %q",
				i, resp.StatusCode, err, resp.Rate.Limit, resp.Rate.Remaining, resp.Rate.Reset.Unix()-start,
				resp.Header.Get("Retry-After"), step.status, step.remaining, step.reset, step.retryAfter)
		}
	}
	// Each token has its own windows.
	if _, resp, err := other.Regions.List(ctx, nil); err != nil || resp.Rate.Remaining != 4 {
		t.Fatalf("another token: %v, remaining %d", err, resp.Rate.Remaining)
	}
}

func TestFaults(t *testing.T) {
	ctx := context.Background()
	create := func(e *env) (*godo.Droplet, *godo.Response, error) {
		return e.do.Droplets.Create(ctx, basicCreate("web-1", "owner"))
	}
	for _, tc := range []struct {
		name     string
		faults   []dofake.Fault
		first    func(*testing.T, *godo.Response, error) // the first create's outcome
		created  int                                     // droplets after the first create
		retries  int                                     // creates that still fail before one succeeds
		finalNum int                                     // droplets in the end
	}{
		{
			name:   "429 then success",
			faults: []dofake.Fault{{Method: "POST", Path: "/v2/droplets", Kind: dofake.FaultStatus, Status: 429, RetryAfter: 2 * time.Second}},
			first: func(t *testing.T, resp *godo.Response, err error) {
				if statusOf(err) != 429 || resp.Rate.Remaining != 0 || resp.Header.Get("Retry-After") != "2" || resp.Rate.Reset.Unix() != epoch.Unix()+2 {
					t.Fatalf("injected 429: %v %v", err, resp.Header)
				}
			},
			created: 0, finalNum: 1,
		},
		{
			name:   "503 twice then success",
			faults: []dofake.Fault{{Path: "/v2/droplets", Kind: dofake.FaultStatus, Status: 503, Count: 2}},
			first: func(t *testing.T, resp *godo.Response, err error) {
				if statusOf(err) != 503 || resp.Header.Get("Retry-After") != "1" {
					t.Fatalf("injected 503: %v", err)
				}
			},
			created: 0, retries: 1, finalNum: 1,
		},
		{
			name:   "500 after the create took effect",
			faults: []dofake.Fault{{Method: "POST", Path: "/v2/droplets", Kind: dofake.FaultApplyThenStatus}},
			first: func(t *testing.T, _ *godo.Response, err error) {
				if statusOf(err) != 500 {
					t.Fatalf("apply then 500: %v", err)
				}
			},
			created: 1, finalNum: 2,
		},
		{
			name:   "connection closed after the create took effect",
			faults: []dofake.Fault{{Method: "POST", Path: "/v2/droplets", Kind: dofake.FaultApplyThenDrop}},
			first: func(t *testing.T, _ *godo.Response, err error) {
				if err == nil || statusOf(err) != 0 {
					t.Fatalf("apply then drop: %v, want a transport error", err)
				}
			},
			created: 1, finalNum: 2,
		},
		{
			name:   "connection closed before anything happened",
			faults: []dofake.Fault{{Method: "POST", Kind: dofake.FaultDrop}},
			first: func(t *testing.T, _ *godo.Response, err error) {
				if err == nil || statusOf(err) != 0 {
					t.Fatalf("drop: %v, want a transport error", err)
				}
			},
			created: 0, finalNum: 1,
		},
		{
			name: "a fault for other requests",
			faults: []dofake.Fault{
				{Method: "POST", Path: "/v2/droplets/*/actions", Kind: dofake.FaultStatus, Status: 500, Count: dofake.Always},
				{Method: "GET", Path: "/v2/sizes", Kind: dofake.FaultStatus, Status: 503},
			},
			first: func(t *testing.T, resp *godo.Response, err error) {
				if err != nil || resp.StatusCode != 202 {
					t.Fatalf("unaffected create: %v", err)
				}
			},
			created: 1, finalNum: 2,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, dofake.Settings{})
			for _, ft := range tc.faults {
				if err := e.fake.Inject(ft); err != nil {
					t.Fatal(err)
				}
			}
			_, resp, err := create(e)
			tc.first(t, resp, err)
			if n := e.fake.DropletsCreated(); n != tc.created {
				t.Fatalf("after the first create, %d droplets; want %d", n, tc.created)
			}
			for range tc.retries {
				if _, _, err := create(e); err == nil {
					t.Fatal("a retry succeeded while the fault lasts")
				}
			}
			if _, _, err := create(e); err != nil {
				t.Fatalf("once the fault is spent: %v", err)
			}
			if n := e.fake.DropletsCreated(); n != tc.finalNum {
				t.Fatalf("%d droplets in the end; want %d", n, tc.finalNum)
			}
			listed, _, err := e.do.Droplets.ListByTag(ctx, "owner", nil)
			if err != nil || len(listed) != tc.finalNum {
				t.Fatalf("listed %d droplets (%v); want %d", len(listed), err, tc.finalNum)
			}
			if n := e.fake.Requests("POST /v2/droplets"); n != 2+tc.retries {
				t.Fatalf("POST /v2/droplets counted %d", n)
			}
		})
	}

	t.Run("always, until cleared", func(t *testing.T) {
		e := newEnv(t, dofake.Settings{})
		if err := e.fake.Inject(dofake.Fault{Path: "/v2/sizes", Kind: dofake.FaultStatus, Status: 500, Count: dofake.Always}); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if _, _, err := e.do.Sizes.List(ctx, nil); statusOf(err) != 500 {
				t.Fatalf("always: %v", err)
			}
		}
		e.fake.ClearFaults()
		if _, _, err := e.do.Sizes.List(ctx, nil); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a slow answer past the client's timeout", func(t *testing.T) {
		e := newEnv(t, dofake.Settings{})
		if err := e.fake.Inject(dofake.Fault{Method: "POST", Path: "/v2/droplets", Kind: dofake.FaultSlow, Delay: time.Minute}); err != nil {
			t.Fatal(err)
		}
		tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		if _, _, err := e.do.Droplets.Create(tctx, basicCreate("web-1")); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("slow create: %v, want the client's deadline", err)
		}
		if e.fake.DropletsCreated() != 1 {
			t.Fatal("the slow create did not take effect")
		}
	})

	t.Run("invalid faults", func(t *testing.T) {
		e := newEnv(t, dofake.Settings{})
		for _, ft := range []dofake.Fault{
			{Kind: "explode"},
			{Kind: dofake.FaultStatus},
			{Kind: dofake.FaultStatus, Status: 302},
			{Kind: dofake.FaultSlow},
			{Kind: dofake.FaultDrop, Path: "[unclosed"},
		} {
			if err := e.fake.Inject(ft); err == nil {
				t.Errorf("fault %+v accepted", ft)
			}
		}
		if n := len(e.fake.Faults()); n != 0 {
			t.Fatalf("%d faults waiting", n)
		}
	})
}

// TestGodoRetriesRepeatACreate shows why the provider driver must not let
// godo retry a create: godo's own retrying client (NewFromToken's default,
// here with short waits) repeats a POST that failed after it took effect,
// and two droplets exist where the caller asked for one.
func TestGodoRetriesRepeatACreate(t *testing.T) {
	e := newEnv(t, dofake.Settings{})
	ctx := context.Background()
	oauth := oauth2.NewClient(ctx, oauth2.StaticTokenSource(&oauth2.Token{AccessToken: token}))
	retrying, err := godo.New(oauth, godo.SetBaseURL(e.srv.URL), godo.WithRetryAndBackoffs(godo.RetryConfig{
		RetryMax: 2, RetryWaitMin: godo.PtrTo(0.001), RetryWaitMax: godo.PtrTo(0.002),
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.fake.Inject(dofake.Fault{Method: "POST", Path: "/v2/droplets", Kind: dofake.FaultApplyThenStatus, Status: 500}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := retrying.Droplets.Create(ctx, basicCreate("web-1")); err != nil {
		t.Fatalf("the retried create: %v", err)
	}
	if n := e.fake.DropletsCreated(); n != 2 {
		t.Fatalf("%d droplets after a retried create; want the 2 this test warns of", n)
	}
}

// admin calls the fake's admin surface and answers the body, failing t
// unless the status is want.
func (e *env) admin(t *testing.T, method, path, body string, want int) []byte {
	t.Helper()
	req, _ := http.NewRequest(method, e.srv.URL+path, bytes.NewBufferString(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("%s %s: %d %s, want %d", method, path, resp.StatusCode, raw, want)
	}
	return raw
}

func TestAdminSurface(t *testing.T) {
	e := newEnv(t, dofake.Settings{})
	ctx := context.Background()
	admin := func(method, path, body string, want int) []byte { return e.admin(t, method, path, body, want) }

	admin("POST", "/_fake/faults", `{"method":"GET","path":"/v2/sizes","kind":"status","status":503,"retryAfter":"3s"}`, 200)
	admin("POST", "/_fake/faults", `[{"kind":"apply-then-drop","method":"POST","path":"/v2/droplets"},{"kind":"slow","delay":"1ms","path":"/v2/regions","count":-1}]`, 200)
	var faults []dofake.Fault
	if err := json.Unmarshal(admin("GET", "/_fake/faults", "", 200), &faults); err != nil || len(faults) != 3 ||
		faults[0].RetryAfter != 3*time.Second || faults[2].Count != dofake.Always || faults[2].Delay != time.Millisecond {
		t.Fatalf("faults = %+v, %v", faults, err)
	}
	admin("POST", "/_fake/faults", `{"kind":"status","status":200}`, 422)
	admin("POST", "/_fake/faults", `{"kind":`, 400)
	if _, resp, err := e.do.Sizes.List(ctx, nil); statusOf(err) != 503 || resp.Header.Get("Retry-After") != "3" {
		t.Fatalf("the fault set over HTTP: %v", err)
	}
	admin("DELETE", "/_fake/faults", "", 204)
	if len(e.fake.Faults()) != 0 {
		t.Fatal("faults not cleared")
	}

	var s dofake.Settings
	if err := json.Unmarshal(admin("PATCH", "/_fake/settings", `{"listLag":"1m","actionDelay":"2s"}`, 200), &s); err != nil ||
		s.ListLag != time.Minute || s.ActionDelay != 2*time.Second || s.PerMinute != dofake.DefaultPerMinute || s.PerHour != dofake.DefaultPerHour {
		t.Fatalf("settings = %+v, %v", s, err)
	}
	admin("PATCH", "/_fake/settings", `{"bootDelay":"soon"}`, 400)
	if got := e.fake.Settings(); got != s {
		t.Fatalf("a refused patch changed the settings: %+v", got)
	}
	req := basicCreate("web-1")
	req.UserData = "#!/bin/sh\necho joined\n"
	d := e.create(t, req)
	if all, _, _ := e.do.Droplets.List(ctx, nil); len(all) != 0 {
		t.Fatal("the listing lag set over HTTP does not hide the droplet")
	}
	var records []dofake.DropletRecord
	if err := json.Unmarshal(admin("GET", "/_fake/droplets", "", 200), &records); err != nil || len(records) != 1 ||
		records[0].ID != d.ID || records[0].UserData != req.UserData || records[0].ListedAt-records[0].CreatedAt != time.Minute.Milliseconds() {
		t.Fatalf("droplets = %+v, %v", records, err)
	}
	var stats dofake.Stats
	if err := json.Unmarshal(admin("GET", "/_fake/stats", "", 200), &stats); err != nil || stats.DropletsCreated != 1 ||
		stats.Requests["POST /v2/droplets"] != 1 || stats.Requests["GET /v2/sizes"] != 1 {
		t.Fatalf("stats = %+v, %v", stats, err)
	}
	admin("POST", "/_fake/tokens", `{"token":"dop_v1_added"}`, 204)
	if _, _, err := newClient(t, e.srv.URL, "dop_v1_added").Regions.List(ctx, nil); err != nil {
		t.Fatalf("a token added over HTTP: %v", err)
	}
}

func TestConcurrentCreates(t *testing.T) {
	e := newEnv(t, dofake.Settings{})
	ctx := context.Background()
	const n = 32
	ids := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			d, _, err := e.do.Droplets.Create(ctx, basicCreate("web-"+strconv.Itoa(i), "batch"))
			if err != nil {
				t.Error(err)
				return
			}
			ids <- d.ID
		})
	}
	wg.Wait()
	close(ids)
	seen := map[int]bool{}
	for id := range ids {
		seen[id] = true
	}
	listed, resp, err := e.do.Droplets.ListByTag(ctx, "batch", &godo.ListOptions{PerPage: 200})
	if len(seen) != n || e.fake.DropletsCreated() != n || err != nil || len(listed) != n || resp.Meta.Total != n {
		t.Fatalf("%d distinct ids, %d created, %d listed (%v); want %d", len(seen), e.fake.DropletsCreated(), len(listed), err, n)
	}
}

// TestServer runs the fake on a port of its own with the real clock, as
// the dev stack does.
func TestServer(t *testing.T) {
	s, err := dofake.Start("127.0.0.1:0", dofake.Config{Tokens: []string{token}, Settings: dofake.Settings{BootDelay: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	c := newClient(t, s.URL, token)
	ctx := context.Background()
	d, _, err := c.Droplets.Create(ctx, basicCreate("web-1"))
	if err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyNil(t, 5*time.Second, func() error {
		got, _, err := c.Droplets.Get(ctx, d.ID)
		if err != nil {
			return err
		}
		if got.Status != "active" {
			return errors.New("the droplet is " + got.Status)
		}
		return nil
	})
}
