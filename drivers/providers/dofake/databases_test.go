package dofake_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/godo"

	"github.com/better-compute/better-compute/drivers/providers/dofake"
)

const dbDelay = 4 * time.Minute

func pgCreate(name string, tags ...string) *godo.DatabaseCreateRequest {
	return &godo.DatabaseCreateRequest{
		Name: name, EngineSlug: "pg", Version: "16", SizeSlug: "db-s-1vcpu-2gb", Region: "nyc3", NumNodes: 2, Tags: tags,
	}
}

func (e *env) createCluster(t *testing.T, req *godo.DatabaseCreateRequest) *godo.Database {
	t.Helper()
	db, resp, err := e.do.Databases.Create(context.Background(), req)
	if err != nil {
		t.Fatalf("create cluster %s: %v", req.Name, err)
	}
	if resp.StatusCode != http.StatusCreated || resp.Rate.Limit != e.fake.Settings().PerHour {
		t.Fatalf("create cluster %s: status %d, rate limit %d; want 201 and the hourly limit", req.Name, resp.StatusCode, resp.Rate.Limit)
	}
	return db
}

// onlineCluster creates a cluster and lets it come online.
func (e *env) onlineCluster(t *testing.T, name string) *godo.Database {
	t.Helper()
	db := e.createCluster(t, pgCreate(name))
	e.clock.Advance(e.fake.Settings().DatabaseDelay)
	return db
}

// taggedClusters lists clusters by tag: godo's List has no tag option, so
// the request is built by hand on godo's client.
func (e *env) taggedClusters(t *testing.T, tag string) []godo.Database {
	t.Helper()
	ctx := context.Background()
	req, err := e.do.NewRequest(ctx, http.MethodGet, "/v2/databases?tag_name="+tag, nil)
	if err != nil {
		t.Fatal(err)
	}
	var root struct {
		Databases []godo.Database `json:"databases"`
	}
	if _, err := e.do.Do(ctx, req, &root); err != nil {
		t.Fatalf("list by tag %s: %v", tag, err)
	}
	return root.Databases
}

func TestDatabaseClusterLifecycle(t *testing.T) {
	e := newEnv(t, dofake.Settings{DatabaseDelay: dbDelay})
	ctx := context.Background()
	db := e.createCluster(t, pgCreate("bc-r-orders", "better-compute-managed"))
	conn := db.Connection
	if db.Status != "creating" || db.EngineSlug != "pg" || db.VersionSlug != "16" || db.NumNodes != 2 || db.SizeSlug != "db-s-1vcpu-2gb" ||
		db.RegionSlug != "nyc3" || db.StorageSizeMib != 25*1024 || db.PrivateNetworkUUID == "" || db.ProjectID == "" || !db.CreatedAt.Equal(epoch) {
		t.Fatalf("created cluster = %+v", db)
	}
	if conn == nil || conn.Password == "" || conn.User != "doadmin" || conn.Port != 25060 || conn.Database != "defaultdb" || !conn.SSL ||
		!strings.Contains(conn.URI, ":"+conn.Password+"@") || !strings.HasSuffix(conn.Host, ".invalid") {
		t.Fatalf("the create's connection = %+v", conn)
	}
	if len(db.Users) != 1 || db.Users[0].Name != "doadmin" || db.Users[0].Password != conn.Password || !slices.Equal(db.DBNames, []string{"defaultdb"}) {
		t.Fatalf("the create's users %+v, dbs %v", db.Users, db.DBNames)
	}

	for _, step := range []struct {
		advance time.Duration
		status  string
	}{{dbDelay - time.Second, "creating"}, {time.Second, "online"}} {
		e.clock.Advance(step.advance)
		got, _, err := e.do.Databases.Get(ctx, db.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != step.status {
			t.Fatalf("after %v: %s, want %s", step.advance, got.Status, step.status)
		}
		if got.Connection.Password != "" || strings.Contains(got.Connection.URI, conn.Password) || got.Users[0].Password != "" ||
			got.Connection.Host != conn.Host {
			t.Fatalf("a later GET shows the password: %+v, users %+v", got.Connection, got.Users)
		}
	}

	if _, err := e.do.Databases.Resize(ctx, db.ID, &godo.DatabaseResizeRequest{SizeSlug: "db-s-1vcpu-1gb", NumNodes: 3}); statusOf(err) != 422 {
		t.Fatalf("resize past the size's node limit: %v, want 422", err)
	}
	resp, err := e.do.Databases.Resize(ctx, db.ID, &godo.DatabaseResizeRequest{SizeSlug: "db-s-2vcpu-4gb", NumNodes: 3})
	if err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("resize: %v", err)
	}
	if _, err := e.do.Databases.Resize(ctx, db.ID, &godo.DatabaseResizeRequest{SizeSlug: "db-s-4vcpu-8gb"}); statusOf(err) != 422 {
		t.Fatalf("resize while resizing: %v, want 422", err)
	}
	got, _, _ := e.do.Databases.Get(ctx, db.ID)
	if got.Status != "resizing" || got.SizeSlug != "db-s-1vcpu-2gb" {
		t.Fatalf("resizing: %s %s", got.Status, got.SizeSlug)
	}
	e.clock.Advance(dbDelay)
	got, _, _ = e.do.Databases.Get(ctx, db.ID)
	if got.Status != "online" || got.SizeSlug != "db-s-2vcpu-4gb" || got.NumNodes != 3 || got.StorageSizeMib != 38*1024 {
		t.Fatalf("resized: %+v", got)
	}

	all, _, err := e.do.Databases.List(ctx, nil)
	if err != nil || len(all) != 1 || all[0].ID != db.ID || all[0].Connection.Password != "" {
		t.Fatalf("list = %+v, %v", all, err)
	}
	if n := len(e.taggedClusters(t, "better-compute-managed")); n != 1 {
		t.Fatalf("%d clusters by their tag", n)
	}
	if n := len(e.taggedClusters(t, "other")); n != 0 {
		t.Fatalf("%d clusters by another tag", n)
	}
	if resp, err := e.do.Databases.Delete(ctx, db.ID); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("delete: %v", err)
	}
	for _, call := range []func() error{
		func() error { _, _, err := e.do.Databases.Get(ctx, db.ID); return err },
		func() error { _, err := e.do.Databases.Delete(ctx, db.ID); return err },
		func() error { _, _, err := e.do.Databases.ListUsers(ctx, db.ID, nil); return err },
	} {
		if err := call(); statusOf(err) != 404 {
			t.Fatalf("after the delete: %v, want 404", err)
		}
	}
	s := e.fake.Stats()
	if s.Created[dofake.KindDatabases] != 1 || s.Live[dofake.KindDatabases] != 0 || s.Created[dofake.KindDroplets] != 0 {
		t.Fatalf("stats created %v live %v", s.Created, s.Live)
	}
}

func TestDatabaseCreateValidation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*godo.DatabaseCreateRequest)
	}{
		{"no name", func(r *godo.DatabaseCreateRequest) { r.Name = "" }},
		{"uppercase name", func(r *godo.DatabaseCreateRequest) { r.Name = "Orders" }},
		{"unknown engine", func(r *godo.DatabaseCreateRequest) { r.EngineSlug = "oracle" }},
		{"unknown version", func(r *godo.DatabaseCreateRequest) { r.Version = "9" }},
		{"unknown size", func(r *godo.DatabaseCreateRequest) { r.SizeSlug = "db-s-64vcpu" }},
		{"unknown region", func(r *godo.DatabaseCreateRequest) { r.Region = "mars1" }},
		{"closed region", func(r *godo.DatabaseCreateRequest) { r.Region = "sfo1" }},
		{"no nodes", func(r *godo.DatabaseCreateRequest) { r.NumNodes = 0 }},
		{"too many nodes for the size", func(r *godo.DatabaseCreateRequest) { r.SizeSlug, r.NumNodes = "db-s-1vcpu-1gb", 2 }},
		{"storage below the size's", func(r *godo.DatabaseCreateRequest) { r.StorageSizeMib = 1024 }},
		{"bad tag", func(r *godo.DatabaseCreateRequest) { r.Tags = []string{"a b"} }},
		{"bad firewall rule", func(r *godo.DatabaseCreateRequest) {
			r.Rules = []*godo.DatabaseCreateFirewallRule{{Type: "everyone", Value: "*"}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, dofake.Settings{})
			req := pgCreate("orders")
			tc.mutate(req)
			if _, _, err := e.do.Databases.Create(context.Background(), req); statusOf(err) != 422 {
				t.Fatalf("create: %v, want 422", err)
			}
			if n := e.fake.Created(dofake.KindDatabases); n != 0 {
				t.Fatalf("%d clusters created by a refused request", n)
			}
		})
	}
	t.Run("a name in use", func(t *testing.T) {
		e := newEnv(t, dofake.Settings{})
		e.createCluster(t, pgCreate("orders"))
		if _, _, err := e.do.Databases.Create(context.Background(), pgCreate("orders")); statusOf(err) != 422 {
			t.Fatalf("a second cluster of the same name: %v, want 422", err)
		}
		if n := e.fake.Created(dofake.KindDatabases); n != 1 {
			t.Fatalf("%d clusters", n)
		}
	})
}

func TestDatabaseUsersPasswordOnce(t *testing.T) {
	e := newEnv(t, dofake.Settings{DatabaseDelay: dbDelay})
	ctx := context.Background()
	db := e.createCluster(t, pgCreate("orders"))
	if _, _, err := e.do.Databases.CreateUser(ctx, db.ID, &godo.DatabaseCreateUserRequest{Name: "app"}); statusOf(err) != 422 {
		t.Fatalf("a user while the cluster is created: %v, want 422", err)
	}
	e.clock.Advance(dbDelay)
	u, resp, err := e.do.Databases.CreateUser(ctx, db.ID, &godo.DatabaseCreateUserRequest{Name: "app"})
	if err != nil || resp.StatusCode != http.StatusCreated || u.Name != "app" || u.Role != "normal" || u.Password == "" {
		t.Fatalf("create user: %+v, %v", u, err)
	}
	if _, _, err := e.do.Databases.CreateUser(ctx, db.ID, &godo.DatabaseCreateUserRequest{Name: "app"}); statusOf(err) != 422 {
		t.Fatalf("the same user again: %v, want 422", err)
	}
	got, _, err := e.do.Databases.GetUser(ctx, db.ID, "app")
	if err != nil || got.Name != "app" || got.Password != "" {
		t.Fatalf("get user: %+v, %v", got, err)
	}
	users, _, err := e.do.Databases.ListUsers(ctx, db.ID, nil)
	if err != nil || len(users) != 2 {
		t.Fatalf("users = %+v, %v", users, err)
	}
	for _, u := range users {
		if u.Password != "" {
			t.Fatalf("listed user %s with a password", u.Name)
		}
	}
	cluster, _, _ := e.do.Databases.Get(ctx, db.ID)
	if len(cluster.Users) != 2 || cluster.Users[1].Password != "" {
		t.Fatalf("the cluster's users = %+v", cluster.Users)
	}
	if _, err := e.do.Databases.DeleteUser(ctx, db.ID, "doadmin"); statusOf(err) != 422 {
		t.Fatalf("delete the admin: %v, want 422", err)
	}
	if _, err := e.do.Databases.DeleteUser(ctx, db.ID, "app"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.do.Databases.GetUser(ctx, db.ID, "app"); statusOf(err) != 404 {
		t.Fatalf("a deleted user: %v", err)
	}
	if s := e.fake.Stats(); s.Created[dofake.KindDatabaseUsers] != 1 || s.Live[dofake.KindDatabaseUsers] != 1 {
		t.Fatalf("users created %d live %d (the admin is live, not created)", s.Created[dofake.KindDatabaseUsers], s.Live[dofake.KindDatabaseUsers])
	}
}

func TestDatabaseChildren(t *testing.T) {
	e := newEnv(t, dofake.Settings{DatabaseDelay: dbDelay})
	ctx := context.Background()
	db := e.onlineCluster(t, "orders")
	dbs := e.do.Databases

	t.Run("databases", func(t *testing.T) {
		d, resp, err := dbs.CreateDB(ctx, db.ID, &godo.DatabaseCreateDBRequest{Name: "shop"})
		if err != nil || resp.StatusCode != 201 || d.Name != "shop" {
			t.Fatalf("create db: %+v, %v", d, err)
		}
		if _, _, err := dbs.CreateDB(ctx, db.ID, &godo.DatabaseCreateDBRequest{Name: "shop"}); statusOf(err) != 422 {
			t.Fatalf("the same db again: %v", err)
		}
		if got, _, err := dbs.GetDB(ctx, db.ID, "shop"); err != nil || got.Name != "shop" {
			t.Fatalf("get db: %+v, %v", got, err)
		}
		list, _, err := dbs.ListDBs(ctx, db.ID, nil)
		if err != nil || len(list) != 2 || list[1].Name != "shop" {
			t.Fatalf("dbs = %+v, %v", list, err)
		}
	})
	t.Run("pools", func(t *testing.T) {
		if _, _, err := dbs.CreateUser(ctx, db.ID, &godo.DatabaseCreateUserRequest{Name: "app"}); err != nil {
			t.Fatal(err)
		}
		for _, bad := range []*godo.DatabaseCreatePoolRequest{
			{Name: "p", User: "app", Database: "nope", Mode: "transaction", Size: 5},
			{Name: "p", User: "nobody", Database: "shop", Mode: "transaction", Size: 5},
			{Name: "p", User: "app", Database: "shop", Mode: "always", Size: 5},
			{Name: "p", User: "app", Database: "shop", Mode: "transaction", Size: 0},
		} {
			if _, _, err := dbs.CreatePool(ctx, db.ID, bad); statusOf(err) != 422 {
				t.Fatalf("pool %+v: %v, want 422", bad, err)
			}
		}
		p, resp, err := dbs.CreatePool(ctx, db.ID, &godo.DatabaseCreatePoolRequest{Name: "shop-pool", User: "app", Database: "shop", Mode: "transaction", Size: 5})
		if err != nil || resp.StatusCode != 201 || p.Connection == nil || p.Connection.Port != 25061 || p.Connection.Database != "shop-pool" ||
			p.Connection.User != "app" || p.Connection.Password != "" {
			t.Fatalf("create pool: %+v (%+v), %v", p, p.Connection, err)
		}
		if _, err := dbs.UpdatePool(ctx, db.ID, "shop-pool", &godo.DatabaseUpdatePoolRequest{User: "app", Database: "shop", Mode: "session", Size: 10}); err != nil {
			t.Fatal(err)
		}
		got, _, err := dbs.GetPool(ctx, db.ID, "shop-pool")
		if err != nil || got.Mode != "session" || got.Size != 10 {
			t.Fatalf("updated pool: %+v, %v", got, err)
		}
		if list, _, err := dbs.ListPools(ctx, db.ID, nil); err != nil || len(list) != 1 {
			t.Fatalf("pools = %+v, %v", list, err)
		}
		if _, err := dbs.DeletePool(ctx, db.ID, "shop-pool"); err != nil {
			t.Fatal(err)
		}
		if _, _, err := dbs.GetPool(ctx, db.ID, "shop-pool"); statusOf(err) != 404 {
			t.Fatalf("a deleted pool: %v", err)
		}
	})
	t.Run("firewall", func(t *testing.T) {
		if rules, _, err := dbs.GetFirewallRules(ctx, db.ID); err != nil || len(rules) != 0 {
			t.Fatalf("rules = %+v, %v", rules, err)
		}
		if _, err := dbs.UpdateFirewallRules(ctx, db.ID, &godo.DatabaseUpdateFirewallRulesRequest{Rules: []*godo.DatabaseFirewallRule{{Type: "planet", Value: "earth"}}}); statusOf(err) != 422 {
			t.Fatalf("a bad rule: %v", err)
		}
		if _, err := dbs.UpdateFirewallRules(ctx, db.ID, &godo.DatabaseUpdateFirewallRulesRequest{Rules: []*godo.DatabaseFirewallRule{
			{Type: "ip_addr", Value: "192.0.2.0/24"}, {Type: "tag", Value: "web"},
		}}); err != nil {
			t.Fatal(err)
		}
		rules, _, err := dbs.GetFirewallRules(ctx, db.ID)
		if err != nil || len(rules) != 2 || rules[0].UUID == "" || rules[0].ClusterUUID != db.ID || rules[1].Type != "tag" {
			t.Fatalf("rules = %+v, %v", rules, err)
		}
		e.clock.Advance(time.Minute)
		// Keep the first (by uuid), drop the second.
		if _, err := dbs.UpdateFirewallRules(ctx, db.ID, &godo.DatabaseUpdateFirewallRulesRequest{Rules: []*godo.DatabaseFirewallRule{&rules[0]}}); err != nil {
			t.Fatal(err)
		}
		kept, _, _ := dbs.GetFirewallRules(ctx, db.ID)
		if len(kept) != 1 || kept[0].UUID != rules[0].UUID || !kept[0].CreatedAt.Equal(rules[0].CreatedAt) {
			t.Fatalf("kept rules = %+v", kept)
		}
	})
	t.Run("replicas", func(t *testing.T) {
		rep, resp, err := dbs.CreateReplica(ctx, db.ID, &godo.DatabaseCreateReplicaRequest{Name: "orders-replica", Region: "ams3", Size: "db-s-1vcpu-2gb"})
		if err != nil || resp.StatusCode != 201 || rep.Status != "creating" || rep.Region != "ams3" || rep.Connection == nil || rep.Connection.Password != "" {
			t.Fatalf("create replica: %+v, %v", rep, err)
		}
		if _, _, err := dbs.CreateReplica(ctx, db.ID, &godo.DatabaseCreateReplicaRequest{Name: "orders"}); statusOf(err) != 422 {
			t.Fatalf("a replica named as a cluster: %v", err)
		}
		e.clock.Advance(dbDelay)
		got, _, err := dbs.GetReplica(ctx, db.ID, "orders-replica")
		if err != nil || got.Status != "online" || got.ID != rep.ID {
			t.Fatalf("replica = %+v, %v", got, err)
		}
		if list, _, err := dbs.ListReplicas(ctx, db.ID, nil); err != nil || len(list) != 1 {
			t.Fatalf("replicas = %+v, %v", list, err)
		}
		if _, err := dbs.DeleteReplica(ctx, db.ID, "orders-replica"); err != nil {
			t.Fatal(err)
		}
		if _, _, err := dbs.GetReplica(ctx, db.ID, "orders-replica"); statusOf(err) != 404 {
			t.Fatalf("a deleted replica: %v", err)
		}
	})
	t.Run("delete", func(t *testing.T) {
		if _, err := dbs.DeleteDB(ctx, db.ID, "shop"); err != nil {
			t.Fatal(err)
		}
		if _, _, err := dbs.GetDB(ctx, db.ID, "shop"); statusOf(err) != 404 {
			t.Fatalf("a deleted db: %v", err)
		}
		s := e.fake.Stats()
		for kind, want := range map[string][2]int{
			dofake.KindDatabaseDBs: {1, 1}, dofake.KindDatabasePools: {1, 0}, dofake.KindDatabaseReplicas: {1, 0}, dofake.KindDatabaseUsers: {1, 2},
		} {
			if got := [2]int{s.Created[kind], s.Live[kind]}; got != want {
				t.Errorf("%s created, live = %v; want %v", kind, got, want)
			}
		}
	})
}

func TestDatabaseListLag(t *testing.T) {
	e := newEnv(t, dofake.Settings{ListLag: 10 * time.Second})
	ctx := context.Background()
	db := e.createCluster(t, pgCreate("orders", "owner"))
	e.clock.Advance(time.Second) // online: DatabaseDelay is zero
	if _, _, err := e.do.Databases.CreateUser(ctx, db.ID, &godo.DatabaseCreateUserRequest{Name: "app"}); err != nil {
		t.Fatal(err)
	}
	listed := func() (clusters, tagged, users int) {
		all, _, err := e.do.Databases.List(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		us, _, err := e.do.Databases.ListUsers(ctx, db.ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		return len(all), len(e.taggedClusters(t, "owner")), len(us)
	}
	if c, tg, u := listed(); c != 0 || tg != 0 || u != 1 {
		t.Fatalf("during the lag: %d clusters, %d tagged, %d users; want 0, 0 and the admin", c, tg, u)
	}
	if got, _, err := e.do.Databases.Get(ctx, db.ID); err != nil || got.ID != db.ID {
		t.Fatalf("get by id during the lag: %v", err)
	}
	if _, _, err := e.do.Databases.GetUser(ctx, db.ID, "app"); err != nil {
		t.Fatalf("get user during the lag: %v", err)
	}
	e.clock.Advance(10 * time.Second)
	if c, tg, u := listed(); c != 1 || tg != 1 || u != 2 {
		t.Fatalf("after the lag: %d clusters, %d tagged, %d users", c, tg, u)
	}
}

// TestLostDatabaseCreate is the reconciler's hard case: a create refused
// with a 429, then one that took effect but whose answer was lost, while
// the listing lags. A caller that looks the cluster up by its name (GET
// by id is impossible: it never learnt the id) before creating again ends
// with exactly one cluster.
func TestLostDatabaseCreate(t *testing.T) {
	e := newEnv(t, dofake.Settings{ListLag: 5 * time.Second})
	ctx := context.Background()
	for _, ft := range []dofake.Fault{
		{Method: "POST", Path: "/v2/databases", Kind: dofake.FaultStatus, Status: 429, RetryAfter: 3 * time.Second},
		{Method: "POST", Path: "/v2/databases", Kind: dofake.FaultApplyThenDrop},
	} {
		if err := e.fake.Inject(ft); err != nil {
			t.Fatal(err)
		}
	}
	req := pgCreate("bc-r-0123456789abcdefghijklmn", "better-compute-managed")
	_, resp, err := e.do.Databases.Create(ctx, req)
	if statusOf(err) != 429 || resp.Header.Get("Retry-After") != "3" || e.fake.Created(dofake.KindDatabases) != 0 {
		t.Fatalf("the first create: %v, want an injected 429 that created nothing", err)
	}
	e.clock.Advance(3 * time.Second)
	if _, _, err := e.do.Databases.Create(ctx, req); err == nil || statusOf(err) != 0 {
		t.Fatalf("the second create: %v, want a transport error", err)
	}
	if n := e.fake.Created(dofake.KindDatabases); n != 1 {
		t.Fatalf("%d clusters after the lost create", n)
	}

	// Look up before creating again: the listing does not show it yet, and
	// a blind create is refused for the name, so the caller waits out the
	// lag and finds it.
	find := func() *godo.Database {
		for _, db := range e.taggedClusters(t, "better-compute-managed") {
			if db.Name == req.Name {
				return &db
			}
		}
		return nil
	}
	if find() != nil {
		t.Fatal("the listing shows the cluster before its lag")
	}
	if _, _, err := e.do.Databases.Create(ctx, req); statusOf(err) != 422 {
		t.Fatalf("a blind create again: %v, want 422 (the name is in use)", err)
	}
	e.clock.Advance(5 * time.Second)
	found := find()
	if found == nil || found.Connection.Password != "" {
		t.Fatalf("after the lag the cluster is %+v", found)
	}
	s := e.fake.Stats()
	if s.Created[dofake.KindDatabases] != 1 || s.Live[dofake.KindDatabases] != 1 || s.Requests["POST /v2/databases"] != 3 {
		t.Fatalf("stats: created %v live %v requests %v", s.Created, s.Live, s.Requests)
	}
}

// TestCloudResourcesShareTheRateLimit: the new routes count against the
// token's windows with the droplets', and a refused create creates nothing.
func TestCloudResourcesShareTheRateLimit(t *testing.T) {
	e := newEnv(t, dofake.Settings{PerMinute: 2})
	ctx := context.Background()
	if _, _, err := e.do.Droplets.List(ctx, nil); err != nil {
		t.Fatal(err)
	}
	e.createCluster(t, pgCreate("orders"))
	_, resp, err := e.do.Apps.Create(ctx, &godo.AppCreateRequest{Spec: appSpec("shop", 1)})
	if statusOf(err) != 429 || resp.Header.Get("Retry-After") != "60" || e.fake.Created(dofake.KindApps) != 0 {
		t.Fatalf("the third request of the minute: %v, want a 429 that created nothing", err)
	}
	e.clock.Advance(time.Minute)
	if _, _, err := e.do.Apps.Create(ctx, &godo.AppCreateRequest{Spec: appSpec("shop", 1)}); err != nil {
		t.Fatalf("once the minute passed: %v", err)
	}
}
