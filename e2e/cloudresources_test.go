package e2e

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/godo"
	"github.com/jackc/pgx/v5"

	activities "github.com/better-compute/better-compute/activities/cloudresources"
	"github.com/better-compute/better-compute/api"
	crs "github.com/better-compute/better-compute/api/cloudresources"
	"github.com/better-compute/better-compute/api/events"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	rules "github.com/better-compute/better-compute/core/cloudresources"
	"github.com/better-compute/better-compute/deploy/devstack"
	"github.com/better-compute/better-compute/drivers/providers/dofake"
	"github.com/better-compute/better-compute/internal/freeport"
	"github.com/better-compute/better-compute/internal/testutil"
	"github.com/better-compute/better-compute/workers"
)

// resourceWait bounds one wait for a cloud resource's state.
const resourceWait = time.Minute

// cloudStack is the dev stack with the reconciler's waits shortened, its
// log kept (the secrets check greps it), the fake DigitalOcean behind the
// platform's provider pool, and the demo user's and the admin's clients.
type cloudStack struct {
	s           *devstack.Stack
	demo, admin *api.Client
	fake        *dofake.Fake
	pool        string
	log         *lockedBuffer
}

func startCloudStack(tb testing.TB, quotas ...rules.Quotas) *cloudStack {
	tb.Helper()
	if testing.Short() {
		tb.Skip("starts PostgreSQL and Temporal")
	}
	dir, err := os.MkdirTemp("", "bc-e2e-crs-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	ports, err := freeport.PickN("127.0.0.1", 2)
	if err != nil {
		tb.Fatal(err)
	}
	log := &lockedBuffer{}
	opts := devstack.Options{Dir: dir, APIAddr: "127.0.0.1:0", AgentAddr: "127.0.0.1:0",
		PostgresPort: ports[0], TemporalAddr: "127.0.0.1:0", UIAddr: "-", Agents: -1,
		ProviderAddr: "127.0.0.1:" + strconv.Itoa(ports[1]), DemoImage: dir + "/none",
		CloudResources: workers.CloudResourcesTuning{ConvergingEvery: 300 * time.Millisecond, SettledEvery: 2 * time.Second,
			Tuning: activities.Tuning{LostCreateWait: 3 * time.Second, DriftLimit: 2}},
		Logger: slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	if len(quotas) > 0 {
		opts.CloudResourceQuotas = quotas[0]
	}
	s, err := devstack.Start(context.Background(), opts)
	if err != nil {
		tb.Fatalf("devstack: %v", err)
	}
	tb.Cleanup(func() { s.Stop(context.Background()) })
	c := &cloudStack{s: s, fake: s.Provider(), pool: s.VPS().ProviderPoolID, log: log}
	adminToken, err := s.AdminToken()
	if err != nil {
		tb.Fatal(err)
	}
	demoToken, err := s.DemoToken()
	if err != nil {
		tb.Fatal(err)
	}
	c.admin, c.demo = api.NewClient(s.APIURL(), adminToken), api.NewClient(s.APIURL(), demoToken)
	return c
}

func (c *cloudStack) create(tb testing.TB, in crs.CreateInput) crs.Resource {
	tb.Helper()
	if in.TenantID == "" {
		in.TenantID = demoTenant
	}
	if in.PoolID == "" {
		in.PoolID = c.pool
	}
	if in.IdempotencyKey == "" {
		in.IdempotencyKey = "key-" + in.Name + "-" + in.Kind
	}
	r, err := crs.Create.Call(context.Background(), c.client(in.TenantID), in)
	if err != nil {
		tb.Fatalf("create %s %s: %v", in.Kind, in.Name, err)
	}
	return r
}

func (c *cloudStack) client(tenant string) *api.Client {
	if tenant == rootTenant {
		return c.admin
	}
	return c.demo
}

func (c *cloudStack) get(tb testing.TB, tenant, id string) crs.Resource {
	tb.Helper()
	r, err := crs.Get.Call(context.Background(), c.client(tenant), crs.ResourceInput{TenantID: tenant, ResourceID: id})
	if err != nil {
		tb.Fatalf("get %s: %v", id, err)
	}
	return r
}

// await waits until the resource is in state ("gone": no longer
// answered), and answers it.
func (c *cloudStack) await(tb testing.TB, tenant, id, state string) crs.Resource {
	tb.Helper()
	deadline := time.Now().Add(resourceWait)
	for {
		r, err := crs.Get.Call(context.Background(), c.client(tenant), crs.ResourceInput{TenantID: tenant, ResourceID: id})
		switch {
		case core.AsError(err).Code == core.CodeNotFound && state == "gone":
			return r
		case err != nil:
			tb.Fatalf("get %s: %v", id, err)
		case r.State == state:
			return r
		case time.Now().After(deadline):
			tb.Fatalf("%s is still %s (desired %s, reason %q: %s; spec %s), not %s", id, r.State, r.Desired, r.Reason, r.Message, r.Spec, state)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func mustCode(tb testing.TB, what string, err error, code core.Code, reason string) *core.Error {
	tb.Helper()
	ce := core.AsError(err)
	if err == nil || ce.Code != code || (reason != "" && ce.Details["reason"] != reason) {
		tb.Fatalf("%s: got %v (details %v), want %s %s", what, err, ce.Details, code, reason)
	}
	return ce
}

// fakeClient is a godo client of the fake's own (for what a user does at
// the provider behind better-compute's back).
func (c *cloudStack) fakeClient(tb testing.TB) *godo.Client {
	tb.Helper()
	c.fake.AddToken("e2e-console")
	cl := godo.NewFromToken("e2e-console")
	base, err := url.Parse(c.s.VPS().ProviderURL + "/")
	if err != nil {
		tb.Fatal(err)
	}
	cl.BaseURL = base
	return cl
}

func pgSpec(size string) json.RawMessage {
	return json.RawMessage(`{"region":"nyc3","size":"` + size + `","num_nodes":1,"version":"16"}`)
}

// TestCloudResourcesOnTheDevStack drives the cloud-resources API against
// the real stack (PostgreSQL, Temporal, the worker) and the fake
// DigitalOcean: a PostgreSQL cluster with a user and a database, updated
// in place, refused past updatable, deleted children first; a lost create
// that ends with one cluster; a drift loop stopped; a 429 storm that
// slows the reconciler and loses nothing; discover, adopt (observed, then
// managed) and release on the platform's own account; and at the end no
// secret value anywhere: rows, events, Temporal's history, the log.
func TestCloudResourcesOnTheDevStack(t *testing.T) {
	c := startCloudStack(t)
	ctx := context.Background()

	// A cluster, its user and a database.
	cluster := c.create(t, crs.CreateInput{Kind: "do.database.pg", Name: "orders", Spec: pgSpec("db-s-1vcpu-1gb")})
	if cluster.State != "pending" || !strings.HasPrefix(cluster.ID, "crs_") {
		t.Fatalf("create answered %+v", cluster)
	}
	again := c.create(t, crs.CreateInput{Kind: "do.database.pg", Name: "orders", Spec: pgSpec("db-s-1vcpu-1gb")})
	if again.ID != cluster.ID {
		t.Fatalf("a retry with the same key made %s, not %s", again.ID, cluster.ID)
	}
	_, err := crs.Create.Call(ctx, c.demo, crs.CreateInput{TenantID: demoTenant, PoolID: c.pool, Kind: "do.database.pg", Name: "orders",
		Spec: pgSpec("db-s-2vcpu-4gb"), IdempotencyKey: "key-orders-do.database.pg"})
	mustCode(t, "the same key with another body", err, core.CodeConflict, "")
	user := c.create(t, crs.CreateInput{Kind: "do.database.pg.user", Name: "orders-app", ParentID: cluster.ID, Spec: json.RawMessage(`{"name":"app"}`)})
	db := c.create(t, crs.CreateInput{Kind: "do.database.pg.database", Name: "orders-db", ParentID: cluster.ID, Spec: json.RawMessage(`{"name":"orders"}`)})
	cluster = c.await(t, demoTenant, cluster.ID, "ready")
	if cluster.ProviderID == "" || cluster.Outputs["host"] == "" || cluster.SecretOutputs["password"] != "secret://acme/"+activities.SecretName(cluster.ID, "password") {
		t.Fatalf("a ready cluster = %+v", cluster)
	}
	user = c.await(t, demoTenant, user.ID, "ready")
	if !strings.HasPrefix(user.SecretOutputs["password"], "secret://acme/") {
		t.Fatalf("a ready user = %+v", user)
	}
	c.await(t, demoTenant, db.ID, "ready")
	_, err = crs.Create.Call(ctx, c.demo, crs.CreateInput{TenantID: demoTenant, PoolID: c.pool, Kind: "do.database.pg.user", Name: "orders-app2",
		ParentID: cluster.ID, Spec: json.RawMessage(`{"name":"app"}`), IdempotencyKey: "second-app"})
	if ce := mustCode(t, "a second user named app", err, core.CodeConflict, "identity"); ce.Details["resourceId"] != user.ID {
		t.Fatalf("identity conflict names %v, want %s", ce.Details["resourceId"], user.ID)
	}

	// Steady state: each settled resource's refresh is one provider read.
	steady := func() int {
		n := 0
		for route, count := range c.fake.Stats().Requests {
			if strings.HasPrefix(route, "GET ") {
				n += count
			}
		}
		return n
	}
	time.Sleep(2 * time.Second) // the last rounds' reads land
	reads, window := steady(), 10*time.Second
	time.Sleep(window)
	rounds := 3 * float64(window) / float64(2*time.Second) // three resources, refreshed every 2 s here
	t.Logf("steady state: %d provider reads in %s for 3 settled resources: %.2f per refresh", steady()-reads, window,
		float64(steady()-reads)/rounds)

	// In place: the size; past updatable: the name.
	up, err := crs.Update.Call(ctx, c.demo, crs.UpdateInput{TenantID: demoTenant, ResourceID: cluster.ID, Spec: json.RawMessage(`{"size":"db-s-1vcpu-2gb"}`)})
	if err != nil || up.State != "updating" || up.Version != cluster.Version+1 {
		t.Fatalf("update size = %+v, %v", up, err)
	}
	c.await(t, demoTenant, cluster.ID, "ready")
	dbs, _, err := c.fakeClient(t).Databases.Get(ctx, cluster.ProviderID)
	if err != nil || dbs.SizeSlug != "db-s-1vcpu-2gb" {
		t.Fatalf("the provider's cluster after the update: %+v, %v", dbs, err)
	}
	_, err = crs.Update.Call(ctx, c.demo, crs.UpdateInput{TenantID: demoTenant, ResourceID: cluster.ID, Spec: json.RawMessage(`{"name":"another-name"}`)})
	if ce := mustCode(t, "a name change", err, core.CodeInvalidState, "replaceRequired"); fmt.Sprint(ce.Details["fields"]) != "[spec.name]" && fmt.Sprint(ce.Details["fields"]) != "[name]" {
		t.Fatalf("replaceRequired fields = %v", ce.Details["fields"])
	}

	// Delete: children first, then the cluster; nothing left at the provider.
	del, err := crs.Delete.Call(ctx, c.demo, crs.ResourceInput{TenantID: demoTenant, ResourceID: cluster.ID})
	if err != nil || del.State != "deleting" {
		t.Fatalf("delete = %+v, %v", del, err)
	}
	for _, id := range []string{user.ID, db.ID, cluster.ID} {
		c.await(t, demoTenant, id, "gone")
	}
	if _, live := c.fake.Stats().Live[dofake.KindDatabases]; live {
		if n := c.fake.Stats().Live[dofake.KindDatabases]; n != 0 {
			t.Fatalf("%d clusters live at the provider after the delete", n)
		}
	}
	order := deletedOrder(t, c, []string{user.ID, db.ID, cluster.ID})
	if order[cluster.ID] < order[user.ID] || order[cluster.ID] < order[db.ID] {
		t.Fatalf("the cluster was deleted before its children: %v", order)
	}

	// The cluster billed cloud.resource.hours from its acceptance to its
	// deletion; its user and database, living in it, billed nothing.
	db0, err := pgx.Connect(ctx, c.s.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer db0.Close(ctx)
	var billed, open, childBilled int
	if err := db0.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE ended_at IS NULL),
			(SELECT count(*) FROM usage_intervals WHERE reservation_id = ANY($2))
		FROM usage_intervals WHERE reservation_id = $1 AND class = 'cloud.resource' AND units = 1`,
		cluster.ID, []string{user.ID, db.ID}).Scan(&billed, &open, &childBilled); err != nil {
		t.Fatal(err)
	}
	if billed != 1 || open != 0 || childBilled != 0 {
		t.Fatalf("billing: %d intervals of the cluster (%d open), %d of its children", billed, open, childBilled)
	}
	seen := map[string]bool{}
	page, err := events.List.Call(ctx, c.demo, events.ListInput{TenantID: demoTenant, ResourceID: cluster.ID, ListInput: rpc.ListInput{Limit: 500}})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range page.Items {
		seen[e.Type] = true
	}
	for _, want := range []string{"created", "ready", "updating", "updated", "deleting", "deleted"} {
		if !seen["cloud.resource."+want] {
			t.Errorf("the cluster published no cloud.resource.%s: %v", want, seen)
		}
	}

	// A lost create: the fake makes the cluster and drops the answer.
	before := c.fake.Created(dofake.KindDatabases)
	if err := c.fake.Inject(dofake.Fault{Method: "POST", Path: "/v2/databases", Kind: dofake.FaultApplyThenDrop}); err != nil {
		t.Fatal(err)
	}
	lost := c.create(t, crs.CreateInput{Kind: "do.database.pg", Name: "lost", Spec: pgSpec("db-s-1vcpu-1gb")})
	lost = c.await(t, demoTenant, lost.ID, "ready")
	if n := c.fake.Created(dofake.KindDatabases) - before; n != 1 {
		t.Fatalf("a lost create made %d clusters, want 1", n)
	}
	// Its password was lost with the answer: the reconciler has a new one
	// issued (reset_auth) and sealed. The same for a user.
	if err := c.fake.Inject(dofake.Fault{Method: "POST", Path: "/v2/databases/*/users", Kind: dofake.FaultApplyThenDrop}); err != nil {
		t.Fatal(err)
	}
	lostUser := c.create(t, crs.CreateInput{Kind: "do.database.pg.user", Name: "lost-app", ParentID: lost.ID, Spec: json.RawMessage(`{"name":"app"}`)})
	for _, id := range []string{lost.ID, lostUser.ID} {
		testutil.Eventually(t, resourceWait, id+"'s secret outputs issued again", func() bool {
			r := c.get(t, demoTenant, id)
			return r.State == "ready" && r.SecretOutputs["password"] != "" && r.SecretOutputs["uri"] != ""
		})
	}

	// A drift loop: the provider rewrites the size after every fix.
	if err := c.fake.Drift(dofake.DriftRule{Kind: dofake.KindDatabases, ID: lost.ProviderID, Field: "size", Value: "db-s-2vcpu-4gb"}); err != nil {
		t.Fatal(err)
	}
	drifted := c.await(t, demoTenant, lost.ID, "error")
	if drifted.Reason != "driftLoop" || !strings.Contains(drifted.Message, "spec.size") {
		t.Fatalf("the drift loop ended %+v", drifted)
	}
	c.fake.ClearDrift()

	// A 429 storm on the creates and reads of a database: the reconciler
	// slows down, and nothing is lost or made twice.
	dbsBefore := c.fake.Created(dofake.KindDatabaseDBs)
	for _, f := range []dofake.Fault{
		{Method: "POST", Path: "/v2/databases/*/dbs", Kind: dofake.FaultStatus, Status: 429, Count: 3},
		{Method: "GET", Path: "/v2/databases/*/dbs/*", Kind: dofake.FaultStatus, Status: 429, Count: 3},
	} {
		if err := c.fake.Inject(f); err != nil {
			t.Fatal(err)
		}
	}
	stormy := c.create(t, crs.CreateInput{Kind: "do.database.pg.database", Name: "stormy", ParentID: lost.ID, Spec: json.RawMessage(`{"name":"stormy"}`)})
	c.await(t, demoTenant, stormy.ID, "ready")
	if left := c.fake.Faults(); len(left) != 0 {
		t.Fatalf("the storm was not spent: %+v", left)
	}
	if n := c.fake.Created(dofake.KindDatabaseDBs) - dbsBefore; n != 1 {
		t.Fatalf("the storm made %d databases, want 1", n)
	}

	// Discover, adopt, manage and release on the platform's own account.
	console := c.fakeClient(t)
	made, _, err := console.Databases.Create(ctx, &godo.DatabaseCreateRequest{Name: "legacy", EngineSlug: "pg", Version: "16",
		SizeSlug: "db-s-1vcpu-1gb", Region: "nyc3", NumNodes: 1})
	if err != nil {
		t.Fatal(err)
	}
	_, err = crs.Discover.Call(ctx, c.demo, crs.DiscoverInput{TenantID: demoTenant, PoolID: c.pool, Kind: "do.database.pg"})
	mustCode(t, "discover on a platform pool", err, core.CodeAccessDenied, "notAccountOwner")
	var found crs.DiscoverAnswer
	testutil.Eventually(t, resourceWait, "discover lists the console's cluster", func() bool {
		found, err = crs.Discover.Call(ctx, c.admin, crs.DiscoverInput{TenantID: rootTenant, PoolID: c.pool, Kind: "do.database.pg"})
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(found.Resources, func(d crs.Discovered) bool { return d.ProviderID == made.ID })
	})
	for _, d := range found.Resources {
		switch d.ProviderID {
		case made.ID:
			if d.ManagedBy != "" || d.ResourceID != "" {
				t.Fatalf("the console's cluster = %+v", d)
			}
		case lost.ProviderID:
			if d.ManagedBy != "this" || d.ResourceID != lost.ID {
				t.Fatalf("acme's cluster = %+v", d)
			}
		}
	}
	adopted, err := crs.Adopt.Call(ctx, c.admin, crs.AdoptInput{TenantID: rootTenant, PoolID: c.pool, Kind: "do.database.pg",
		ProviderID: made.ID, Name: "legacy", IdempotencyKey: "adopt-legacy"})
	if err != nil || !adopted.Adopted || adopted.State != "pending" || string(adopted.Spec) != "{}" {
		t.Fatalf("adopt = %+v, %v", adopted, err)
	}
	_, err = crs.Adopt.Call(ctx, c.admin, crs.AdoptInput{TenantID: rootTenant, PoolID: c.pool, Kind: "do.database.pg",
		ProviderID: lost.ProviderID, Name: "taken", IdempotencyKey: "adopt-taken"})
	mustCode(t, "adopting a managed cluster", err, core.CodeConflict, "")
	adopted = c.await(t, rootTenant, adopted.ID, "ready")
	if !adopted.ObserveOnly || !strings.Contains(string(adopted.Spec), `"db-s-1vcpu-1gb"`) {
		t.Fatalf("an adopted cluster once observed = %+v (%s)", adopted, adopted.Spec)
	}
	if _, err := crs.Update.Call(ctx, c.admin, crs.UpdateInput{TenantID: rootTenant, ResourceID: adopted.ID,
		Spec: json.RawMessage(`{"size":"db-s-1vcpu-2gb"}`)}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, resourceWait, "the adopted cluster resized", func() bool {
		got, _, err := console.Databases.Get(ctx, made.ID)
		return err == nil && got.SizeSlug == "db-s-1vcpu-2gb"
	})
	rel, err := crs.Release.Call(ctx, c.admin, crs.ResourceInput{TenantID: rootTenant, ResourceID: adopted.ID})
	if err != nil || rel.Desired != "released" {
		t.Fatalf("release = %+v, %v", rel, err)
	}
	c.await(t, rootTenant, adopted.ID, "gone")
	kept, _, err := console.Databases.Get(ctx, made.ID)
	if err != nil {
		t.Fatalf("the released cluster is gone at the provider: %v", err)
	}
	for _, tag := range kept.Tags {
		if strings.HasPrefix(tag, "better-compute") {
			t.Fatalf("the released cluster still carries %q", tag)
		}
	}

	noSecretValues(t, c)
}

// deletedOrder answers the position of each resource's
// cloud.resource.deleted event in the tenant's events.
func deletedOrder(tb testing.TB, c *cloudStack, ids []string) map[string]int {
	tb.Helper()
	page, err := events.List.Call(context.Background(), c.demo, events.ListInput{TenantID: demoTenant, ListInput: rpc.ListInput{Limit: 500}})
	if err != nil {
		tb.Fatal(err)
	}
	order := map[string]int{}
	for i, e := range page.Items {
		if e.Type == "cloud.resource.deleted" && slices.Contains(ids, e.ResourceID) {
			order[e.ResourceID] = i
		}
	}
	if len(order) != len(ids) {
		tb.Fatalf("deleted events of %v: %v", ids, order)
	}
	return order
}

// noSecretValues greps every table of every database of the stack's
// cluster (the control plane's, Temporal's history and visibility) and
// the whole log for the fake's passwords (they start with AVNS_), as
// text and as the hex of a bytea.
func noSecretValues(tb testing.TB, c *cloudStack) {
	tb.Helper()
	ctx := context.Background()
	needles := []string{"AVNS_", hex.EncodeToString([]byte("AVNS_"))}
	if i := strings.Index(c.log.String(), "AVNS_"); i >= 0 {
		tb.Fatalf("a secret value in the log: %q", c.log.String()[max(0, i-200):i+40])
	}
	conn, err := pgx.Connect(ctx, c.s.DatabaseURL())
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close(ctx)
	dbs, err := pgx.CollectRows(must(conn.Query(ctx, `SELECT datname FROM pg_database WHERE NOT datistemplate`)), pgx.RowTo[string])
	if err != nil {
		tb.Fatal(err)
	}
	checked := 0
	for _, name := range dbs {
		cfg := conn.Config().Copy()
		cfg.Database = name
		dc, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			tb.Fatalf("database %s: %v", name, err)
		}
		tables, err := pgx.CollectRows(must(dc.Query(ctx, `SELECT quote_ident(table_schema) || '.' || quote_ident(table_name)
			FROM information_schema.tables WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema')`)),
			pgx.RowTo[string])
		if err != nil {
			tb.Fatal(err)
		}
		for _, table := range tables {
			var hits int
			if err := dc.QueryRow(ctx, `SELECT count(*) FROM `+table+` t WHERE t::text LIKE '%'||$1||'%' OR t::text LIKE '%'||$2||'%'`,
				needles[0], needles[1]).Scan(&hits); err != nil {
				tb.Fatalf("%s.%s: %v", name, table, err)
			}
			if hits > 0 {
				tb.Errorf("%d rows of %s.%s hold a secret value", hits, name, table)
			}
			checked++
		}
		dc.Close(ctx)
	}
	if checked < 20 {
		tb.Fatalf("only %d tables were checked", checked)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
