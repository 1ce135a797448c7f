package digitalocean_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/digitalocean/godo"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/drivers/cloudresources"
	"github.com/better-compute/better-compute/drivers/cloudresources/digitalocean"
	"github.com/better-compute/better-compute/drivers/providers"
	doprovider "github.com/better-compute/better-compute/drivers/providers/digitalocean"
	"github.com/better-compute/better-compute/drivers/providers/dofake"
)

const (
	token   = "dop_v1_cloud-resources-test"
	dbDelay = 4 * time.Minute
)

var owner = cloudresources.Owner{ResourceID: "cres_01jabcdefghjkmnpqrstvwxyz0", TenantID: "ten_acme"}

// env is the real godo, through our factory's transport, against a fake
// DigitalOcean over HTTP.
type env struct {
	fake  *dofake.Fake
	clock *dofake.ManualClock
	res   *digitalocean.Resources
	// do is a plain godo client of the same account, for what a test sets
	// up outside the implementation (a foreign cluster).
	do *godo.Client
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvWith(t, dofake.Settings{DatabaseDelay: dbDelay})
}

func newEnvWith(t *testing.T, settings dofake.Settings) *env {
	t.Helper()
	clock := dofake.NewManualClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	fake := dofake.New(dofake.Config{Settings: settings, Tokens: []string{token}, Now: clock.Now})
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	cred := providers.Credential{Kind: doprovider.Kind, Token: token, BaseURL: srv.URL}
	factory := doprovider.NewFactory(providers.NewMemoryLimiter(), nil)
	res, err := digitalocean.Open(context.Background(), factory, cred)
	require.NoError(t, err)
	client, err := factory.Client(context.Background(), cred)
	require.NoError(t, err)
	return &env{fake: fake, clock: clock, res: res, do: client}
}

func clusterSpec(size string) json.RawMessage {
	return json.RawMessage(`{"region":"nyc3","size":"` + size + `","num_nodes":1,"version":"16"}`)
}

// onlineCluster creates a cluster of ours and lets it come online.
func (e *env) onlineCluster(t *testing.T) cloudresources.Observed {
	t.Helper()
	o, err := e.res.Create(context.Background(), cloudresources.CreateRequest{
		Kind: digitalocean.KindCluster, Name: cloudresources.ResourceName(owner.ResourceID), Owner: owner, Spec: clusterSpec("db-s-1vcpu-2gb"),
	})
	require.NoError(t, err)
	e.clock.Advance(dbDelay)
	return o
}

func TestClusterLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	name := cloudresources.ResourceName(owner.ResourceID)

	created, err := e.res.Create(ctx, cloudresources.CreateRequest{
		Kind: digitalocean.KindCluster, Name: name, Owner: owner, Spec: clusterSpec("db-s-1vcpu-2gb"),
	})
	require.NoError(t, err)
	require.NotEmpty(t, created.ProviderID)
	require.Equal(t, name, created.Name)
	require.Equal(t, "creating", created.Status)
	require.False(t, created.Ready)
	require.ElementsMatch(t, owner.Tags(), created.Labels)
	require.Equal(t, "25060", created.Outputs["port"])
	require.Equal(t, "defaultdb", created.Outputs["database"])
	require.Equal(t, "doadmin", created.Outputs["user"])
	require.NotEmpty(t, created.Outputs["host"])
	require.NotEmpty(t, created.Outputs["privateHost"])
	require.NotContains(t, created.Outputs, "password")
	require.ElementsMatch(t, []string{"password", "uri", "privateUri"}, keys(created.Secrets))
	require.Contains(t, created.Secrets["uri"], created.Secrets["password"])

	// A read carries no secret.
	got, err := e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: created.Ref})
	require.NoError(t, err)
	require.False(t, got.Ready)
	require.Nil(t, got.Secrets)

	e.clock.Advance(dbDelay)
	got, err = e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: created.Ref})
	require.NoError(t, err)
	require.Equal(t, "online", got.Status)
	require.True(t, got.Ready)
	require.JSONEq(t, `{"name":"`+name+`","engine":"pg","version":"16","region":"nyc3","size":"db-s-1vcpu-2gb","num_nodes":1,
		"storage_size_mib":25600,"private_network_uuid":"`+specField(t, got.Spec, "private_network_uuid")+`",
		"project_id":"`+specField(t, got.Spec, "project_id")+`","maintenance_window":{"day":"tuesday","hour":"04:00:00"}}`, string(got.Spec))

	// A resize in place.
	resized, err := e.res.Update(ctx, cloudresources.UpdateRequest{
		Ref: created.Ref, Owner: owner, Old: clusterSpec("db-s-1vcpu-2gb"), New: clusterSpec("db-s-2vcpu-4gb"),
	})
	require.NoError(t, err)
	require.Equal(t, "resizing", resized.Status)
	e.clock.Advance(dbDelay)
	got, err = e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: created.Ref})
	require.NoError(t, err)
	require.Equal(t, "db-s-2vcpu-4gb", specField(t, got.Spec, "size"))

	// What godo cannot change simply is refused, and nothing is sent.
	_, err = e.res.Update(ctx, cloudresources.UpdateRequest{
		Ref: created.Ref, Owner: owner, Old: clusterSpec("db-s-2vcpu-4gb"),
		New: json.RawMessage(`{"region":"nyc3","size":"db-s-2vcpu-4gb","num_nodes":1,"version":"17"}`),
	})
	require.ErrorIs(t, err, providers.ErrRefused)
	require.Equal(t, 1, e.fake.Requests("PUT /v2/databases/{id}/resize"), "the refused update sent nothing")

	require.NoError(t, e.res.Delete(ctx, created.Ref))
	_, err = e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: created.Ref})
	require.ErrorIs(t, err, providers.ErrNotFound)
	_, err = e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: cloudresources.Ref{Kind: digitalocean.KindCluster}, Name: name, Owner: owner})
	require.ErrorIs(t, err, providers.ErrNotFound)
	require.NoError(t, e.res.Delete(ctx, created.Ref), "a cluster already gone")
}

func TestChildrenLifecycle(t *testing.T) {
	tests := []struct {
		kind, name string
		spec       string
		// secrets are the secret outputs of the create's answer.
		secrets []string
		// update is a new spec changed in place ("" : the kind has none).
		update string
		// check reads the observed spec after the update.
		check func(t *testing.T, o cloudresources.Observed)
	}{
		{kind: digitalocean.KindUser, name: "app", spec: `{"name":"app"}`, secrets: []string{"password", "uri"}},
		{kind: digitalocean.KindDatabase, name: "appdb", spec: `{"name":"appdb"}`},
		{
			kind: digitalocean.KindPool, name: "apppool", spec: `{"name":"apppool","db":"defaultdb","size":5,"mode":"transaction"}`,
			update: `{"name":"apppool","db":"defaultdb","size":8,"mode":"session"}`,
			check: func(t *testing.T, o cloudresources.Observed) {
				require.JSONEq(t, `{"name":"apppool","db":"defaultdb","size":8,"mode":"session"}`, string(o.Spec))
			},
		},
		{
			kind: digitalocean.KindFirewall, spec: `{"rules":[{"type":"ip_addr","value":"192.0.2.10"}]}`,
			update: `{"rules":[{"type":"ip_addr","value":"192.0.2.11"},{"type":"tag","value":"web"}]}`,
			check: func(t *testing.T, o cloudresources.Observed) {
				require.JSONEq(t, `{"rules":[{"type":"ip_addr","value":"192.0.2.11"},{"type":"tag","value":"web"}]}`, string(o.Spec))
			},
		},
		{kind: digitalocean.KindReplica, name: "bc-r-replica0", spec: `{"region":"nyc3","size":"db-s-1vcpu-2gb"}`},
	}
	for _, tt := range tests {
		t.Run(tt.kind, func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			parent := e.onlineCluster(t).ProviderID

			created, err := e.res.Create(ctx, cloudresources.CreateRequest{
				Kind: tt.kind, ParentProviderID: parent, Name: tt.name, Owner: owner, Spec: json.RawMessage(tt.spec),
			})
			require.NoError(t, err)
			require.Equal(t, tt.kind, created.Kind)
			require.Equal(t, parent, created.ParentProviderID)
			require.NotEmpty(t, created.ProviderID)
			require.ElementsMatch(t, tt.secrets, keys(created.Secrets), "secret outputs of the create")
			for _, v := range created.Secrets {
				require.NotEmpty(t, v)
			}

			// Found again by its id and by its name inside the parent; a read
			// carries no secret.
			byID, err := e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: created.Ref})
			require.NoError(t, err)
			require.Nil(t, byID.Secrets)
			byName, err := e.res.Observe(ctx, cloudresources.ObserveRequest{
				Ref: cloudresources.Ref{Kind: tt.kind, ParentProviderID: parent}, Name: tt.name, Owner: owner,
			})
			require.NoError(t, err)
			require.Equal(t, created.ProviderID, byName.ProviderID)
			require.Nil(t, byName.Secrets)
			requireValidSpec(t, byName)

			if tt.update != "" {
				updated, err := e.res.Update(ctx, cloudresources.UpdateRequest{
					Ref: created.Ref, Owner: owner, Old: json.RawMessage(tt.spec), New: json.RawMessage(tt.update),
				})
				require.NoError(t, err)
				tt.check(t, updated)
			}

			require.NoError(t, e.res.Delete(ctx, created.Ref))
			_, err = e.res.Observe(ctx, cloudresources.ObserveRequest{
				Ref: cloudresources.Ref{Kind: tt.kind, ParentProviderID: parent}, Name: tt.name, Owner: owner,
			})
			require.ErrorIs(t, err, providers.ErrNotFound)
			require.NoError(t, e.res.Delete(ctx, created.Ref), "one already gone")
		})
	}
}

func TestUserPasswordOnlyInTheCreate(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	parent := e.onlineCluster(t)
	created, err := e.res.Create(ctx, cloudresources.CreateRequest{
		Kind: digitalocean.KindUser, ParentProviderID: parent.ProviderID, Name: "app", Owner: owner, Spec: json.RawMessage(`{"name":"app"}`),
	})
	require.NoError(t, err)
	password := created.Secrets["password"]
	require.NotEmpty(t, password)
	require.Contains(t, created.Secrets["uri"], "app:"+password+"@"+parent.Outputs["host"]+":25060/defaultdb")
	require.Equal(t, map[string]string{"name": "app", "role": "normal"}, created.Outputs)

	got, err := e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: created.Ref})
	require.NoError(t, err)
	require.Nil(t, got.Secrets)
	raw, err := json.Marshal(got)
	require.NoError(t, err)
	require.NotContains(t, string(raw), password)
}

func TestLostCreateIsFoundByName(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	name := cloudresources.ResourceName(owner.ResourceID)
	require.NoError(t, e.fake.Inject(dofake.Fault{Method: http.MethodPost, Path: "/v2/databases", Kind: dofake.FaultApplyThenDrop}))

	_, err := e.res.Create(ctx, cloudresources.CreateRequest{Kind: digitalocean.KindCluster, Name: name, Owner: owner, Spec: clusterSpec("db-s-1vcpu-2gb")})
	require.ErrorIs(t, err, providers.ErrUnavailable)
	require.NotErrorIs(t, err, providers.ErrNotSent, "the outcome is unknown")

	found, err := e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: cloudresources.Ref{Kind: digitalocean.KindCluster}, Name: name, Owner: owner})
	require.NoError(t, err)
	require.Equal(t, name, found.Name)
	require.Nil(t, found.Secrets, "the lost answer's password is not recovered by a read")

	all, _, err := e.do.Databases.List(ctx, &godo.ListOptions{PerPage: 200})
	require.NoError(t, err)
	var named []string
	for _, db := range all {
		if db.Name == name {
			named = append(named, db.ID)
		}
	}
	require.Equal(t, []string{found.ProviderID}, named, "exactly one cluster of the name")
}

func TestSameNamedForeignIsRefused(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	name := cloudresources.ResourceName(owner.ResourceID)
	other := cloudresources.Owner{ResourceID: "cres_01jzzzzzzzzzzzzzzzzzzzzzz0", TenantID: "ten_other"}
	tests := []struct {
		what string
		tags []string
	}{
		{what: "no tags", tags: nil},
		{what: "another owner's", tags: other.Tags()},
	}
	for i, tt := range tests {
		t.Run(tt.what, func(t *testing.T) {
			clusterName := name + string(rune('a'+i))
			_, _, err := e.do.Databases.Create(ctx, &godo.DatabaseCreateRequest{
				Name: clusterName, EngineSlug: "pg", SizeSlug: "db-s-1vcpu-2gb", Region: "nyc3", NumNodes: 1, Tags: tt.tags,
			})
			require.NoError(t, err)
			_, err = e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: cloudresources.Ref{Kind: digitalocean.KindCluster}, Name: clusterName, Owner: owner})
			require.ErrorIs(t, err, providers.ErrRefused)
		})
	}

	t.Run("a replica", func(t *testing.T) {
		parent := e.onlineCluster(t).ProviderID
		_, _, err := e.do.Databases.CreateReplica(ctx, parent, &godo.DatabaseCreateReplicaRequest{Name: "bc-r-foreign", Region: "nyc3", Size: "db-s-1vcpu-2gb"})
		require.NoError(t, err)
		_, err = e.res.Observe(ctx, cloudresources.ObserveRequest{
			Ref: cloudresources.Ref{Kind: digitalocean.KindReplica, ParentProviderID: parent}, Name: "bc-r-foreign", Owner: owner,
		})
		require.ErrorIs(t, err, providers.ErrRefused)
	})
}

func TestErrorsMapLikeTheProvider(t *testing.T) {
	tests := []struct {
		name  string
		fault *dofake.Fault
		call  func(e *env) error
		check func(t *testing.T, err error)
	}{
		{
			name:  "404",
			call:  func(e *env) error { return observe(e, "0b0b0b0b-0000-4000-8000-000000000000") },
			check: func(t *testing.T, err error) { require.ErrorIs(t, err, providers.ErrNotFound) },
		},
		{
			name:  "429",
			fault: &dofake.Fault{Method: http.MethodGet, Path: "/v2/databases/*", Kind: dofake.FaultStatus, Status: http.StatusTooManyRequests},
			call:  func(e *env) error { return observe(e, "0b0b0b0b-0000-4000-8000-000000000000") },
			check: func(t *testing.T, err error) {
				limited, ok := providers.AsRateLimited(err)
				require.True(t, ok, "%v", err)
				require.False(t, limited.RetryAt.IsZero())
			},
		},
		{
			name:  "5xx",
			fault: &dofake.Fault{Method: http.MethodGet, Path: "/v2/databases/*", Kind: dofake.FaultStatus, Status: http.StatusServiceUnavailable},
			call:  func(e *env) error { return observe(e, "0b0b0b0b-0000-4000-8000-000000000000") },
			check: func(t *testing.T, err error) { require.ErrorIs(t, err, providers.ErrUnavailable) },
		},
		{
			name:  "a dropped connection",
			fault: &dofake.Fault{Method: http.MethodGet, Path: "/v2/databases", Kind: dofake.FaultDrop},
			call: func(e *env) error {
				_, err := e.res.Observe(context.Background(), cloudresources.ObserveRequest{Ref: cloudresources.Ref{Kind: digitalocean.KindCluster}, Name: "bc-r-x", Owner: owner})
				return err
			},
			check: func(t *testing.T, err error) { require.ErrorIs(t, err, providers.ErrUnavailable) },
		},
		{
			name: "other 4xx",
			call: func(e *env) error {
				_, err := e.res.Create(context.Background(), cloudresources.CreateRequest{
					Kind: digitalocean.KindCluster, Name: "bc-r-x", Owner: owner, Spec: clusterSpec("db-s-unknown"),
				})
				return err
			},
			check: func(t *testing.T, err error) { require.ErrorIs(t, err, providers.ErrRefused) },
		},
		{
			name: "a kind not served",
			call: func(e *env) error {
				_, err := e.res.Observe(context.Background(), cloudresources.ObserveRequest{Ref: cloudresources.Ref{Kind: "do.spaces.bucket", ProviderID: "x"}})
				return err
			},
			check: func(t *testing.T, err error) { require.ErrorIs(t, err, providers.ErrRefused) },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			if tt.fault != nil {
				require.NoError(t, e.fake.Inject(*tt.fault))
			}
			tt.check(t, tt.call(e))
		})
	}
}

func observe(e *env, id string) error {
	_, err := e.res.Observe(context.Background(), cloudresources.ObserveRequest{Ref: cloudresources.Ref{Kind: digitalocean.KindCluster, ProviderID: id}})
	return err
}

func keys(s cloudresources.SecretValues) []string {
	out := []string{}
	for k := range s {
		out = append(out, k)
	}
	return out
}

func specField(t *testing.T, spec json.RawMessage, field string) string {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(spec, &m))
	v, _ := m[field].(string)
	return v
}

// requireValidSpec checks an observed spec is one of its kind's, as
// discover and adopt record it.
func requireValidSpec(t *testing.T, o cloudresources.Observed) {
	t.Helper()
	m, ok := digitalocean.Kinds().Lookup(o.Kind)
	require.True(t, ok, o.Kind)
	require.NoError(t, m.Validate(o.Spec), "%s: %s", o.Kind, o.Spec)
}
