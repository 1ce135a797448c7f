package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/capacity"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/api/reservations"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/inventory"
	nodestate "github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/deploy/devstack"
	"github.com/better-compute/better-compute/internal/freeport"
	"github.com/better-compute/better-compute/store"
	nodesdomain "github.com/better-compute/better-compute/store/nodes"
)

// target is what the scenarios call: a tenant user's client and the pool
// it reserves in, plus what the run has created so far.
type target struct {
	user     *api.Client
	tenant   string
	pool     string
	dbURL    string // the cluster's URL for the floor; empty: no floor
	embedded bool
	// analyze refreshes the statistics of tables the run has filled (nil:
	// a deployment's own statistics stand).
	analyze func(ctx context.Context, tables ...string) error
	// owedStarts counts the live reservations whose workflow start is
	// still owed (nil: not known to the bench).
	owedStarts func(ctx context.Context) (int, error)
	perWindow  int // reservations sharing one window in create (see createInput)
	runID      string
	base       int64 // epoch ms of the first window, a day ahead
	// contention makes a pool with one free 8-GPU node and returns it and
	// the window to race for; nil when the target cannot (an external
	// deployment: nodes have no public create method yet).
	contention func(ctx context.Context) (poolID string, start int64, err error)
	// activation makes a pool of nodes GPUs whose holds bind at once (no
	// agent to expose them) and returns it; nil against an external
	// deployment, where activate reserves in the -pool.
	activation func(ctx context.Context, nodes int) (poolID string, err error)
	// capacity makes a pool of n bulk-inserted nodes and says who asks
	// for its summary; nil against an external deployment (no SQL there).
	capacity func(ctx context.Context, n int) (capacityTarget, error)

	seq     atomic.Int64
	mu      sync.Mutex
	created []string // reservation ids, for get and list
}

// windowSeconds is the length of a create scenario's reservation.
const windowSeconds = 600

// createInput is the next create's input. Windows start a day ahead, so
// the reservation workflow only arms a timer (no activation during the
// run), and perWindow reservations share a window: placement then works on
// partly booked nodes, while the pool never runs out (the next window is
// empty).
func (t *target) createInput(gpus int) reservations.CreateInput {
	i := t.seq.Add(1) - 1
	start := t.base + (i/int64(t.perWindow))*windowSeconds*1000
	return reservations.CreateInput{
		TenantID: t.tenant, PoolID: t.pool, Start: &start, Duration: windowSeconds,
		Devices:        placement.Request{Class: placement.ClassGPU, Count: gpus},
		IdempotencyKey: fmt.Sprintf("bench-%s-%d", t.runID, i),
	}
}

func (t *target) remember(id string) {
	t.mu.Lock()
	t.created = append(t.created, id)
	t.mu.Unlock()
}

func (t *target) reservations() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.created...)
}

func newTarget(user *api.Client, tenant, pool, dbURL string, perWindow int) *target {
	now := time.Now()
	return &target{
		user: user, tenant: tenant, pool: pool, dbURL: dbURL, perWindow: max(perWindow, 1),
		runID: fmt.Sprintf("%x", now.UnixNano()),
		base:  now.Add(24 * time.Hour).Truncate(time.Hour).UnixMilli(),
	}
}

// externalTarget calls a deployment the flags name. Its pool's capacity is
// unknown, so only one node's worth of GPUs shares a window.
func externalTarget(cfg config) *target {
	return newTarget(httpClient(cfg.apiURL, cfg.token, cfg.clients), cfg.tenant, cfg.pool, cfg.dbURL, 8)
}

// httpClient is an API client whose transport keeps a connection per
// concurrent caller (http.DefaultClient keeps 2, and the rest would reconnect
// on every call, measuring TCP setup instead of the API).
func httpClient(url, token string, conns int) *api.Client {
	c := api.NewClient(url, token)
	conns = max(conns, 8)
	c.HTTP = &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{
		MaxIdleConns: conns, MaxIdleConnsPerHost: conns, IdleConnTimeout: time.Minute,
	}}
	return c
}

// Sample inventory and the copy numbers the bench's nodes take: far from
// the demo fleet's 1 and 2, so every node has a hardware key of its own.
const (
	benchInventory      = "h100-8x-sxm.json"
	firstBenchNode      = 1001
	firstActivateNode   = 5001
	firstContentionNode = 9001
)

// startEmbedded starts a dev stack in a temporary directory on fresh ports,
// adds cfg.nodes simulated nodes to the demo pool and raises the demo
// tenant's quota to the pool's GPUs. cleanup stops it and removes the
// directory.
func startEmbedded(ctx context.Context, cfg config, logger *slog.Logger, progress func(string, ...any)) (*target, func(), error) {
	dir, err := os.MkdirTemp("", "bc-bench-")
	if err != nil {
		return nil, nil, err
	}
	var stack *devstack.Stack
	var st *store.Store
	cleanup := func() {
		if st != nil {
			st.Close()
		}
		if stack != nil {
			stack.Stop(context.Background())
		}
		_ = os.RemoveAll(dir)
	}
	fail := func(err error) (*target, func(), error) {
		cleanup()
		return nil, nil, err
	}
	// The PostgreSQL server may run as the postgres OS user, which must reach in.
	if err := os.Chmod(dir, 0o755); err != nil {
		return fail(err)
	}
	pgPort, err := freeport.Pick("127.0.0.1")
	if err != nil {
		return fail(err)
	}
	stack, err = devstack.Start(ctx, devstack.Options{
		Dir: dir, APIAddr: "127.0.0.1:0", AgentAddr: "127.0.0.1:0", Agents: -1, PostgresPort: pgPort, TemporalAddr: "127.0.0.1:0", UIAddr: "-", Logger: logger,
	})
	if err != nil {
		return fail(fmt.Errorf("devstack: %w", err))
	}
	adminToken, err := stack.AdminToken()
	if err != nil {
		return fail(err)
	}
	userToken, err := stack.DemoToken()
	if err != nil {
		return fail(err)
	}
	conns := max(cfg.clients, cfg.contentionCalls)
	admin := httpClient(stack.APIURL(), adminToken, 4)
	user := httpClient(stack.APIURL(), userToken, conns)
	adminWho, err := api.SystemWhoami.Call(ctx, admin, rpc.NoInput{})
	if err != nil {
		return fail(fmt.Errorf("whoami (admin): %w", err))
	}
	userWho, err := api.SystemWhoami.Call(ctx, user, rpc.NoInput{})
	if err != nil {
		return fail(fmt.Errorf("whoami (user): %w", err))
	}
	root, tenant := adminWho.Caller.TenantID, userWho.Caller.TenantID
	demo := stack.Demo()

	// Nodes are made by the nodes domain itself (store/nodes), on the
	// stack's database, as a join makes them; the stack's authorization
	// projection tails the rows they add.
	if st, err = store.Open(ctx, stack.DatabaseURL()); err != nil {
		return fail(err)
	}
	catalog, err := core.DefaultCatalog()
	if err != nil {
		return fail(err)
	}
	types := nodesdomain.TypesOf(catalog)
	progress("adding %d simulated 8×H100 nodes to the demo pool %s", cfg.nodes, demo.PoolID)
	if err := addNodes(ctx, st, types, demo.PoolID, "bench-h100", firstBenchNode, cfg.nodes, nodestate.AdapterBCD); err != nil {
		return fail(fmt.Errorf("nodes: %w", err))
	}
	gpus, err := poolGPUs(ctx, admin, root, demo.PoolID)
	if err != nil {
		return fail(err)
	}
	// The demo offer's quota (16 GPUs) would refuse the create scenario
	// after two windows' worth; the offer is an upsert.
	if _, err := pools.Offer.Call(ctx, admin, pools.OfferInput{TenantID: root, PoolID: demo.PoolID, ToTenantID: tenant,
		Quota: map[string]int64{placement.ClassGPU: int64(gpus)}}); err != nil {
		return fail(fmt.Errorf("raise the demo quota: %w", err))
	}
	progress("demo pool: %d GPUs, tenant %s's quota raised to match", gpus, tenant)

	t := newTarget(user, tenant, demo.PoolID, stack.DatabaseURL(), gpus)
	t.embedded = true
	t.analyze = func(ctx context.Context, tables ...string) error { return analyze(ctx, st, tables...) }
	t.owedStarts = func(ctx context.Context) (int, error) {
		var n int
		err := st.Pool.QueryRow(ctx, `SELECT count(*) FROM reservations WHERE workflow_started_at IS NULL
			AND state IN ('placed', 'binding', 'active', 'expired', 'releasing')`).Scan(&n)
		return n, err
	}
	op := offeredPools{admin: admin, user: user, st: st, types: types, root: root, tenant: tenant,
		userID: userWho.Caller.IdentityID, siteID: demo.SiteID, runID: t.runID}
	t.contention = func(ctx context.Context) (string, int64, error) {
		// 48 hours ahead: apart from every other scenario's windows.
		start := time.Now().Add(48 * time.Hour).Truncate(time.Hour).UnixMilli()
		id, err := op.make(ctx, "bench-contention", firstContentionNode, 1, nodestate.AdapterBCD, &start)
		return id, start, err
	}
	t.activation = func(ctx context.Context, nodes int) (string, error) {
		// Nodes driven by a provider API get no cdi.expose commands:
		// binding a hold on them is the workflow's own work, with no
		// agent (the embedded stack runs none) to wait for.
		return op.make(ctx, "bench-activate", firstActivateNode, nodes, nodestate.AdapterProviderAPI, nil)
	}
	t.capacity = func(ctx context.Context, n int) (capacityTarget, error) {
		return capacityPool(ctx, admin, st, root, demo.SiteID, t.runID, n)
	}
	return t, cleanup, nil
}

// addNodes adds count schedulable copies of the sample 8×H100 machine to
// pool, each in its own transaction, as devstack's seedDemoNodes does.
func addNodes(ctx context.Context, st *store.Store, types nodesdomain.Types, poolID, prefix string, first, count int, adapter nodestate.Adapter) error {
	sample, err := inventory.Sample(benchInventory)
	if err != nil {
		return err
	}
	for n := first; n < first+count; n++ {
		doc, err := json.Marshal(sample.Copy(n))
		if err != nil {
			return err
		}
		err = st.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
			node, err := nodesdomain.Create(ctx, tx, types, nodesdomain.NewNode{PoolID: poolID, Name: fmt.Sprintf("%s-%d", prefix, n),
				ProvisionState: nodestate.Deployed, Role: nodestate.RoleHost, Trust: nodestate.TrustPlatform, Adapter: adapter,
				Power: nodestate.PowerOn, Connectivity: nodestate.Connected, ObservedGeneration: 1})
			if err != nil {
				return err
			}
			_, err = nodesdomain.Ingest(ctx, tx, types, node.ID, doc)
			return err
		})
		if err != nil {
			return fmt.Errorf("node %s-%d: %w", prefix, n, err)
		}
	}
	return analyze(ctx, st, "nodes", "devices", "device_bookings")
}

// settleLimit bounds how long a scenario's workflow starts may take to
// finish after its last call.
const settleLimit = 5 * time.Minute

// settle waits until owed says no workflow start is owed, and answers how
// long that took (0: none was owed).
func settle(ctx context.Context, owed func(context.Context) (int, error)) (time.Duration, error) {
	start := time.Now()
	for {
		n, err := owed(ctx)
		switch {
		case err != nil:
			return 0, fmt.Errorf("owed workflow starts: %w", err)
		case n == 0:
			if time.Since(start) < 100*time.Millisecond {
				return 0, nil
			}
			return time.Since(start), nil
		case time.Since(start) > settleLimit:
			return 0, fmt.Errorf("%d workflow starts still owed after %s", n, settleLimit)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// analyze refreshes the planner's statistics of tables the setup has just
// filled, as autovacuum would within a minute in a deployment: planned as
// the empty tables they were, placement's free-atom read took 80 ms
// instead of 3.7 ms on 64 nodes, and the 500-item list read 16.5 ms
// instead of 3.1 ms.
func analyze(ctx context.Context, st *store.Store, tables ...string) error {
	if _, err := st.Pool.Exec(ctx, "ANALYZE "+strings.Join(tables, ", ")); err != nil {
		return fmt.Errorf("analyze: %w", err)
	}
	return nil
}

// poolGPUs sums the GPUs of the pool's nodes, as its owner sees them.
func poolGPUs(ctx context.Context, admin *api.Client, tenant, poolID string) (int, error) {
	gpus := 0
	for cursor := ""; ; {
		list, err := nodes.List.Call(ctx, admin, nodes.ListInput{TenantID: tenant, PoolID: poolID,
			ListInput: rpc.ListInput{Limit: store.MaxPageLimit, Cursor: cursor}})
		if err != nil {
			return 0, fmt.Errorf("nodes of pool %s: %w", poolID, err)
		}
		for _, n := range list.Items {
			gpus += n.GPUCount
		}
		if cursor = list.NextCursor; cursor == "" {
			break
		}
	}
	if gpus == 0 {
		return 0, fmt.Errorf("pool %s has no GPUs", poolID)
	}
	return gpus, nil
}

// offeredPools makes pools of the root tenant in the demo site offered to
// the demo tenant, apart from the demo pool create, get and list use.
type offeredPools struct {
	admin, user                         *api.Client
	st                                  *store.Store
	types                               nodesdomain.Types
	root, tenant, userID, siteID, runID string
}

// make makes a pool named name with count 8-GPU nodes (copies from
// first on), offers it to the tenant (a quota far above its GPUs, so
// refusals are for capacity, not quota), gives the user the "user"
// relation on it as the demo fleet does, and waits until the tenant sees
// a node's 8 GPUs free for an hour from start (nil: now).
func (o offeredPools) make(ctx context.Context, name string, first, count int, adapter nodestate.Adapter, start *int64) (string, error) {
	p, err := pools.Create.Call(ctx, o.admin, pools.CreateInput{TenantID: o.root, SiteID: o.siteID, Name: name + "-" + o.runID,
		Class: "metal-host", GPUModel: "H100", GPUMemoryGb: 80})
	if err != nil {
		return "", fmt.Errorf("pool: %w", err)
	}
	if _, err := pools.Offer.Call(ctx, o.admin, pools.OfferInput{TenantID: o.root, PoolID: p.ID, ToTenantID: o.tenant,
		Quota: map[string]int64{placement.ClassGPU: 100000}}); err != nil {
		return "", fmt.Errorf("offer: %w", err)
	}
	if err := addNodes(ctx, o.st, o.types, p.ID, name, first, count, adapter); err != nil {
		return "", err
	}
	catalog, err := core.DefaultCatalog()
	if err != nil {
		return "", err
	}
	rel := map[string]string{"tenantId": o.tenant, "subjectId": o.userID, "relation": "user",
		"resourceType": catalog.FullName("pool"), "resourceId": p.ID}
	if err := iamAdminCall(ctx, o.admin, "addRelation", rel); err != nil {
		return "", fmt.Errorf("relation: %w", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		pv, err := capacity.Preview.Call(ctx, o.user, capacity.PreviewInput{TenantID: o.tenant, PoolID: p.ID,
			Devices: placement.Request{Class: placement.ClassGPU, Count: 8}, Start: start, Duration: 3600})
		if err == nil && pv.Fits {
			return p.ID, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("pool %s never showed 8 free GPUs to %s: %+v, %v", p.ID, o.tenant, pv, err)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// iamAdminCall posts to the IAM admin surface (/api/iam/<method>), which the
// typed client does not cover.
func iamAdminCall(ctx context.Context, admin *api.Client, method string, in any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(admin.BaseURL, "/")+"/api/iam/"+method, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+admin.Token)
	resp, err := admin.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	var e struct {
		Error *core.Error `json:"error"`
	}
	if json.Unmarshal(raw, &e) == nil && e.Error != nil {
		if errors.Is(e.Error, core.ErrConflict) {
			return nil // it exists
		}
		return e.Error
	}
	return fmt.Errorf("iam %s: HTTP %d", method, resp.StatusCode)
}
