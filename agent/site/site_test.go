package site_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/better-compute/better-compute/agent/site"
	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/agentgateway"
	"github.com/better-compute/better-compute/core"
	dtemporal "github.com/better-compute/better-compute/deploy/temporal"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
	sitedomain "github.com/better-compute/better-compute/store/sites"
	"github.com/better-compute/better-compute/workers"
	"github.com/better-compute/better-compute/workflows/sites"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// testTimeout bounds every wait: a safety net against hangs, not a
// performance assertion.
const testTimeout = 2 * time.Minute

const namespace = "better-compute"

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newSite records a site of tenant acme and a site token for it, as
// sites.create and siteTokens.create would, and returns both ids and the
// token.
func newSite(t *testing.T, st *store.Store) (siteID, tokenID, token string) {
	t.Helper()
	ctx := context.Background()
	siteID, tokenID = core.NewID("site"), core.NewID("stok")
	token = sitedomain.TokenPrefix + "test" + core.NewID("t")
	if _, err := st.Pool.Exec(ctx, `INSERT INTO sites (id, tenant_id, name, region, iam_region, kind, created_by)
		VALUES ($1, 'acme', $1, 'eu', 'eu-west', 'custom', 'idn_x')`, siteID); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool.Exec(ctx, `INSERT INTO site_tokens (id, site_id, tenant_id, name, token_hash, created_by)
		VALUES ($1, $2, 'acme', 'agent', $3, 'idn_x')`, tokenID, siteID, sitedomain.HashToken(token)); err != nil {
		t.Fatal(err)
	}
	return siteID, tokenID, token
}

// tracker records which agents serve, and whether two ever served at once.
type tracker struct {
	mu      sync.Mutex
	serving map[string]site.State
	overlap bool
}

func (tr *tracker) observe(holder string) func(site.State) {
	return func(s site.State) {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		if s.Serving {
			if len(tr.serving) > 0 {
				tr.overlap = true
			}
			tr.serving[holder] = s
		} else {
			delete(tr.serving, holder)
		}
	}
}

// only is the one serving agent and its state, if exactly one serves.
func (tr *tracker) only() (string, site.State, bool) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for h, s := range tr.serving {
		return h, s, len(tr.serving) == 1
	}
	return "", site.State{}, false
}

func eventually(t *testing.T, ctx context.Context, what string, ok func() bool) {
	t.Helper()
	for !ok() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func leaseOf(t *testing.T, st *store.Store, siteID string) (holder string, epoch int64) {
	t.Helper()
	if err := st.Pool.QueryRow(context.Background(), `SELECT holder, epoch FROM leases WHERE name = $1`,
		store.SiteBootLease(siteID)).Scan(&holder, &epoch); err != nil {
		t.Fatal(err)
	}
	return holder, epoch
}

func siteHealth(t *testing.T, ctx context.Context, c client.Client, siteID string) sites.SiteHealth {
	t.Helper()
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: core.NewID("wf"), TaskQueue: workers.ControlPlaneQueue},
		sites.SiteHealthWorkflowName, sites.SiteHealthInput{SiteID: siteID})
	if err != nil {
		t.Fatal(err)
	}
	var h sites.SiteHealth
	if err := run.Get(ctx, &h); err != nil {
		t.Fatalf("SiteHealthWorkflow: %v", err)
	}
	return h
}

// Two agents for one site: exactly one holds the lease and serves the
// site's queue; when it stops, the other takes over with a higher epoch
// once the lease expired, and the control plane's SiteHealthWorkflow now
// reaches it. A revoked token stops the agent; a bad one never starts.
func TestTwoAgentsOneSite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	st := testenv.Store(t)
	ts, err := dtemporal.Start(ctx, dtemporal.Options{Namespaces: []string{namespace}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ts.Stop)
	cfg := workers.TemporalConfig{Address: ts.FrontendAddr(), Namespace: namespace}
	tc, err := workers.Dial(ctx, cfg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	cp := workers.NewControlPlane(tc, workers.Deps{Store: st})
	if err := cp.Start(); err != nil {
		t.Fatal(err)
	}
	defer cp.Stop()

	gw, err := agentgateway.New(agentgateway.Deps{Store: st, Logger: quiet(), TemporalAddress: cfg.Address,
		TemporalNamespace: namespace, SiteLease: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Deps{Store: st, Logger: quiet(), Routes: gw})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	siteID, tokenID, token := newSite(t, st)

	tr := &tracker{serving: map[string]site.State{}}
	type agent struct {
		cancel context.CancelFunc
		done   chan error
	}
	agents := map[string]*agent{}
	for _, h := range []string{"agent-a", "agent-b"} {
		actx, acancel := context.WithCancel(ctx)
		a := &agent{cancel: acancel, done: make(chan error, 1)}
		agents[h] = a
		go func() {
			a.done <- site.Run(actx, site.Options{APIURL: hs.URL, Token: token, Holder: h, Logger: quiet(),
				RetryMin: 100 * time.Millisecond, RetryMax: 400 * time.Millisecond, OnState: tr.observe(h)})
		}()
	}
	defer func() {
		for _, a := range agents {
			a.cancel()
		}
	}()

	// Exactly one serves, and it is the lease's holder.
	var first string
	var firstState site.State
	eventually(t, ctx, "one agent serving", func() bool {
		h, s, ok := tr.only()
		first, firstState = h, s
		return ok
	})
	if holder, epoch := leaseOf(t, st, siteID); holder != first || epoch != firstState.Epoch || firstState.SiteID != siteID {
		t.Fatalf("lease = %s@%d, serving %s %+v", holder, epoch, first, firstState)
	}
	if h := siteHealth(t, ctx, tc, siteID); h.SiteID != siteID || h.Holder != first || h.Epoch != firstState.Epoch || h.Time.IsZero() {
		t.Fatalf("site health = %+v, want %s at epoch %d", h, first, firstState.Epoch)
	}
	var n int
	if err := st.Pool.QueryRow(ctx, `SELECT count(*) FROM site_agents WHERE site_id = $1 AND site_token_id = $2`, siteID, tokenID).Scan(&n); err != nil || n < 1 {
		t.Fatalf("site_agents rows = %d, %v", n, err)
	}

	// The holder stops (releasing nothing); the other takes over after the
	// lease expired, with a higher epoch.
	second := "agent-a"
	if first == "agent-a" {
		second = "agent-b"
	}
	agents[first].cancel()
	if err := <-agents[first].done; err != nil {
		t.Fatalf("Run of the stopped agent = %v, want nil", err)
	}
	var secondState site.State
	eventually(t, ctx, second+" serving", func() bool {
		h, s, ok := tr.only()
		secondState = s
		return ok && h == second
	})
	if secondState.Epoch <= firstState.Epoch {
		t.Fatalf("the new holder's epoch %d is not above %d", secondState.Epoch, firstState.Epoch)
	}
	if h := siteHealth(t, ctx, tc, siteID); h.Holder != second || h.Epoch != secondState.Epoch {
		t.Fatalf("site health after takeover = %+v, want %s at epoch %d", h, second, secondState.Epoch)
	}

	// Revoking the token ends the serving agent at its next renewal.
	if _, err := st.Pool.Exec(ctx, `UPDATE site_tokens SET revoked_at = now() WHERE id = $1`, tokenID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-agents[second].done:
		if core.AsError(err).Code != core.CodeUnauthn {
			t.Fatalf("Run with a revoked token = %v, want UNAUTHENTICATED", err)
		}
	case <-ctx.Done():
		t.Fatal("the agent kept running with a revoked token")
	}
	if _, _, ok := tr.only(); ok {
		t.Fatal("an agent still serves after its token was revoked")
	}

	tr.mu.Lock()
	overlap := tr.overlap
	tr.mu.Unlock()
	if overlap {
		t.Fatal("two agents served the site at once")
	}

	// A revoked token and an unknown one never start.
	for _, tok := range []string{token, sitedomain.TokenPrefix + "nope"} {
		err := site.Run(ctx, site.Options{APIURL: hs.URL, Token: tok, Holder: "agent-c", Logger: quiet()})
		if e := (*core.Error)(nil); !errors.As(err, &e) || e.Code != core.CodeUnauthn {
			t.Fatalf("Run with a refused token = %v, want UNAUTHENTICATED", err)
		}
	}
}
