package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/internal/testenv"

	metalact "github.com/better-compute/better-compute/activities/metal"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/agentgateway"
	"github.com/better-compute/better-compute/api/metal"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/api/sites"
	"github.com/better-compute/better-compute/core"
	coremetal "github.com/better-compute/better-compute/core/metal"
	nodestate "github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/store"
	metaldomain "github.com/better-compute/better-compute/store/metal"
	nodesdomain "github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/secrets"
)

// metalEnv is an env whose API serves the metal methods with a secret
// vault, and the agent gateway's metal endpoints beside them.
type metalEnv struct {
	*env
	vault *secrets.Vault
	site  sites.Site
	pool  string
	token string // the site's token
}

const bmcPassword = "Zq8-unforgettable-BMC-password"

func newMetalEnv(t *testing.T) *metalEnv {
	t.Helper()
	e := newEnv(t)
	kek, err := secrets.GenerateKEK()
	if err != nil {
		t.Fatal(err)
	}
	keys, err := secrets.ParseKeyring(kek)
	if err != nil {
		t.Fatal(err)
	}
	m := &metalEnv{env: e, vault: secrets.NewVault(keys, api.DefaultRootTenant)}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	gw, err := agentgateway.New(agentgateway.Deps{Store: e.store, Catalog: e.catalog, Logger: quiet, Secrets: m.vault,
		TemporalAddress: "127.0.0.1:7233", TemporalNamespace: "better-compute", SiteLease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Deps{Store: e.store, IAM: e.outer, Catalog: e.catalog, Routes: gw, Logger: quiet, Secrets: m.vault})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	e.server, e.url = srv, hs.URL
	m.site = e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	m.pool = e.pool(e.boot.UserToken, "acme", m.site.ID, "metal").ID
	tok, err := sites.CreateToken.Call(context.Background(), e.client(e.boot.UserToken),
		sites.CreateTokenInput{TenantID: "acme", SiteID: m.site.ID, Name: "agent"})
	if err != nil {
		t.Fatal(err)
	}
	m.token = tok.Token
	m.putSecret("acme", "bmc", bmcPassword)
	return m
}

func (m *metalEnv) putSecret(tenant, name, value string) {
	m.t.Helper()
	scope := "tenant"
	if tenant == api.DefaultRootTenant {
		scope = "fleet"
	}
	if err := m.store.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) error {
		_, err := m.vault.Put(context.Background(), tx, secrets.PutRequest{TenantID: tenant, Name: name, Scope: scope, Value: value, By: "idn_x"})
		return err
	}); err != nil {
		m.t.Fatal(err)
	}
}

func (m *metalEnv) enrollInput(name, address string) metal.EnrollInput {
	return metal.EnrollInput{TenantID: "acme", PoolID: m.pool, Name: name, BMC: metal.BMCInput{
		Redfish: &metal.RedfishInput{Address: address, Username: "admin", PasswordSecret: "secret://acme/bmc"}}}
}

func (m *metalEnv) enroll(name, address string) metal.MetalNode {
	m.t.Helper()
	n, err := metal.Enroll.Call(context.Background(), m.client(m.boot.UserToken), m.enrollInput(name, address))
	if err != nil {
		m.t.Fatalf("enroll %s: %v", name, err)
	}
	return n
}

// finish ends the node's operation in flight as its workflow would.
func (m *metalEnv) finish(n metal.MetalNode, f metaldomain.Finish) {
	m.t.Helper()
	f.NodeID, f.OpSeq = n.Node.ID, n.Lifecycle.OpSeq
	if err := m.store.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) error {
		return metaldomain.FinishOperation(context.Background(), tx, nodesdomain.TypesOf(m.catalog), f)
	}); err != nil {
		m.t.Fatalf("finish %s: %v", n.Lifecycle.Operation, err)
	}
}

func wantError(t *testing.T, err error, code core.Code, field string) *core.Error {
	t.Helper()
	e := core.AsError(err)
	if err == nil || e.Code != code || (field != "" && e.Details["field"] != field) {
		t.Fatalf("error = %v %v, want %s field %q", err, detailsOf(e), code, field)
	}
	return e
}

func TestMetalEnrollValidation(t *testing.T) {
	m := newMetalEnv(t)
	ctx := context.Background()
	c := m.client(m.boot.UserToken)
	m.putSecret("globex", "bmc", "globex's password")
	m.putSecret(api.DefaultRootTenant, "fleet-bmc", "the fleet's password")

	in := func(mut func(*metal.EnrollInput)) metal.EnrollInput {
		v := m.enrollInput("m1", "https://10.0.0.1")
		mut(&v)
		return v
	}
	cases := []struct {
		name  string
		in    metal.EnrollInput
		code  core.Code
		field string
	}{
		{"not a reference", in(func(v *metal.EnrollInput) { v.BMC.Redfish.PasswordSecret = "secret://acme" }), core.CodeInvalidInput, "bmc.redfish.passwordSecret"},
		{"a missing secret", in(func(v *metal.EnrollInput) { v.BMC.Redfish.PasswordSecret = "secret://acme/nope" }), core.CodeInvalidInput, "bmc.redfish.passwordSecret"},
		{"another tenant's secret", in(func(v *metal.EnrollInput) { v.BMC.Redfish.PasswordSecret = "secret://globex/bmc" }), core.CodeInvalidInput, "bmc.redfish.passwordSecret"},
		{"no endpoint", in(func(v *metal.EnrollInput) { v.BMC.Redfish = nil }), core.CodeInvalidInput, "bmc"},
		{"not https", in(func(v *metal.EnrollInput) { v.BMC.Redfish.Address = "http://10.0.0.1" }), core.CodeInvalidInput, "bmc.redfish.address"},
		{"no username", in(func(v *metal.EnrollInput) { v.BMC.Redfish.Username = "" }), core.CodeInvalidInput, "bmc.redfish.username"},
		{"ipmi without a password", in(func(v *metal.EnrollInput) { v.BMC.IPMI = &metal.IPMIInput{Address: "10.0.0.9:623", Username: "u"} }), core.CodeInvalidInput, "bmc.ipmi.passwordSecret"},
		{"a bad boot MAC", in(func(v *metal.EnrollInput) { v.BootMAC = "zz:zz" }), core.CodeInvalidInput, "bootMac"},
		{"an unknown driver", in(func(v *metal.EnrollInput) { v.Bindings = map[string]string{"power": "ipmitool"} }), core.CodeInvalidInput, "bindings.power"},
		{"a driver without the concern", in(func(v *metal.EnrollInput) { v.Bindings = map[string]string{"virtual-media": "ipmi/v1"} }), core.CodeInvalidInput, "bindings.virtual-media"},
		{"an unknown concern", in(func(v *metal.EnrollInput) { v.Bindings = map[string]string{"raid": "redfish/v1"} }), core.CodeInvalidInput, "bindings.raid"},
		// The tenant's own (custom) site runs the tenant's agent, which must
		// never read a platform secret: refused as if it did not exist.
		{"a fleet secret at the tenant's own site", in(func(v *metal.EnrollInput) {
			v.BMC.IPMI = &metal.IPMIInput{Address: "10.0.0.9:623", Username: "u", PasswordSecret: "secret://root/fleet-bmc"}
		}), core.CodeInvalidInput, "bmc.ipmi.passwordSecret"},
	}
	for _, tc := range cases {
		_, err := metal.Enroll.Call(ctx, c, tc.in)
		e := wantError(t, err, tc.code, tc.field)
		if strings.Contains(e.Message, "globex") && tc.name == "another tenant's secret" {
			// The answer names the field only, the same as for a missing one.
			t.Errorf("%s: %s", tc.name, e.Message)
		}
	}
	// Another tenant's secret and a missing one read the same.
	_, errOther := metal.Enroll.Call(ctx, c, cases[2].in)
	_, errMissing := metal.Enroll.Call(ctx, c, cases[1].in)
	if core.AsError(errOther).Message != core.AsError(errMissing).Message {
		t.Fatalf("another tenant's secret answers %q, a missing one %q", core.AsError(errOther).Message, core.AsError(errMissing).Message)
	}

	// The answer holds the references, never a value.
	ok := in(func(v *metal.EnrollInput) {
		v.BMC.IPMI = &metal.IPMIInput{Address: "10.0.0.9:623", Username: "u", PasswordSecret: "secret://acme/bmc"}
		v.BootMAC = "3C-EC-EF-9A-1B-2C"
		v.Labels = map[string]string{"rack": "r1"}
		v.Bindings = map[string]string{"power": "ipmi/v1"}
	})
	status, body := m.call(m.boot.UserToken, "metal.enroll", jsonOf(t, ok))
	if status != 200 || strings.Contains(body, bmcPassword) || strings.Contains(body, "fleet's password") {
		t.Fatalf("enroll: %d %s", status, body)
	}
	var n metal.MetalNode
	if err := json.Unmarshal([]byte(body), &n); err != nil {
		t.Fatal(err)
	}
	if n.Node.ProvisionState != "enrolling" || n.Node.PoolID != m.pool || n.Node.SiteID != m.site.ID || n.Node.Labels["rack"] != "r1" ||
		n.Node.DriverBindings["power"] != "ipmi/v1" || n.BMC.BootMAC != "3c:ec:ef:9a:1b:2c" ||
		n.BMC.IPMI.PasswordSecret != "secret://acme/bmc" || n.BMC.Redfish.PasswordSecret != "secret://acme/bmc" {
		t.Fatalf("enrolled: %+v %+v", n.Node, n.BMC)
	}
	// One node per BMC address per site.
	for _, dup := range []metal.EnrollInput{
		in(func(v *metal.EnrollInput) { v.Name = "m2" }),
		in(func(v *metal.EnrollInput) {
			v.Name, v.BMC.Redfish = "m3", nil
			v.BMC.IPMI = &metal.IPMIInput{Address: "10.0.0.9:623", Username: "u", PasswordSecret: "secret://acme/bmc"}
		}),
	} {
		_, err := metal.Enroll.Call(ctx, c, dup)
		field := "bmc.redfish.address"
		if dup.BMC.Redfish == nil {
			field = "bmc.ipmi.address"
		}
		wantError(t, err, core.CodeConflict, field)
	}
	// Another tenant cannot enroll in acme's pool.
	gin := m.enrollInput("g1", "https://10.0.0.50")
	gin.TenantID = "globex"
	_, err := metal.Enroll.Call(ctx, m.client(m.globex), gin)
	if code := codeOf(err); code != core.CodeNotFound && code != core.CodeAccessDenied {
		t.Fatalf("globex enrolling in acme's pool: %v", err)
	}
}

func jsonOf(t *testing.T, v any) string { t.Helper(); return string(mustJSON(t, v)) }

// TestMetalLifecycleMethods walks one node through every operation over
// HTTP, finishing each as its workflow would, and checks each call's
// refusal from a state the table does not allow.
func TestMetalLifecycleMethods(t *testing.T) {
	m := newMetalEnv(t)
	ctx := context.Background()
	c := m.client(m.boot.UserToken)
	n := m.enroll("m1", "https://10.0.0.1")
	node := metal.NodeInput{TenantID: "acme", NodeID: n.Node.ID}

	// INVALID_STATE names the state and the allowed operations.
	_, err := metal.Inspect.Call(ctx, c, node)
	e := wantError(t, err, core.CodeInvalidState, "")
	if e.Details["provisionState"] != "enrolling" || fmt.Sprint(e.Details["allowed"]) != "[manage retire]" {
		t.Fatalf("details: %v", e.Details)
	}
	for _, ref := range []rpc1{metal.Provide, metal.Undeploy, metal.Rescue, metal.Unrescue, metal.Recover, metal.Abort} {
		if _, err := ref.Call(ctx, c, node); codeOf(err) != core.CodeInvalidState {
			t.Errorf("%s from enrolling: %v", ref, err)
		}
	}
	profile := m.profile("acme", "plain")
	deploy := metal.DeployInput{TenantID: "acme", NodeID: n.Node.ID, ProfileID: profile}
	if _, err := metal.Deploy.Call(ctx, c, deploy); codeOf(err) != core.CodeInvalidState {
		t.Errorf("deploy from enrolling: %v", err)
	}
	deployRef := func(ctx context.Context, c rpc.Caller, _ metal.NodeInput) (metal.MetalNode, error) {
		d, err := metal.Deploy.Call(ctx, c, deploy)
		return d.MetalNode, err
	}
	if _, err := metal.Power.Call(ctx, c, metal.PowerInput{TenantID: "acme", NodeID: n.Node.ID, Action: metal.PowerOn}); codeOf(err) != core.CodeInvalidState {
		t.Errorf("power before manage: %v", err)
	}

	type caller func(context.Context, rpc.Caller, metal.NodeInput) (metal.MetalNode, error)
	steps := []struct {
		ref    caller
		during string
		fin    metaldomain.Finish
		after  string
	}{
		{metal.Manage.Call, "enrolling", metaldomain.Finish{Managed: true, Power: nodestate.PowerOff}, "enrolling"},
		{metal.Inspect.Call, "inspecting", metaldomain.Finish{Inspected: true}, "enrolling"},
		{metal.Provide.Call, "commissioning", metaldomain.Finish{}, "ready"},
		{deployRef, "deploying", metaldomain.Finish{}, "deployed"},
		{metal.Rescue.Call, "rescue", metaldomain.Finish{}, "rescue"},
		{metal.Unrescue.Call, "rescue", metaldomain.Finish{}, "deployed"},
		{metal.Undeploy.Call, "releasing", metaldomain.Finish{}, "ready"},
	}
	for _, s := range steps {
		got, err := s.ref(ctx, c, node)
		if err != nil {
			t.Fatalf("to %s: %v", s.during, err)
		}
		l := got.Lifecycle
		if l.State != s.during || string(l.Operation) == "" || l.Deadline == nil || l.WorkflowStarted || !slices.Equal(l.Allowed, []string{"abort"}) {
			t.Fatalf("%s: %+v", l.Operation, l)
		}
		m.finish(got, s.fin)
		if now := m.get(n.Node.ID); now.Lifecycle.State != s.after || now.Node.ProvisionState != s.after {
			t.Fatalf("after %s: %s", got.Lifecycle.Operation, now.Lifecycle.State)
		}
	}

	// Power answers at once without a workflow to wait for: the
	// operation in flight, its action in its arguments.
	p, err := metal.Power.Call(ctx, c, metal.PowerInput{TenantID: "acme", NodeID: n.Node.ID, Action: metal.PowerCycle})
	if err != nil || p.Lifecycle.Operation != "power" || p.Lifecycle.State != "ready" {
		t.Fatalf("power: %+v %v", p.Lifecycle, err)
	}
	var args metalact.PowerArgs
	if err := m.store.Pool.QueryRow(ctx, `SELECT op_args FROM node_metal WHERE node_id = $1`, n.Node.ID).Scan(&args); err != nil || args.Action != "cycle" {
		t.Fatalf("power args: %+v %v", args, err)
	}
	m.finish(p, metaldomain.Finish{Power: nodestate.PowerOn})
	if now := m.get(n.Node.ID); now.Lifecycle.Power != "on" || now.Lifecycle.State != "ready" {
		t.Fatalf("after power: %+v", now.Lifecycle)
	}

	// Abort with no workflow running fails the node in the same call;
	// recover takes it back to where the failed operation recovers.
	if _, err := metal.Deploy.Call(ctx, c, deploy); err != nil {
		t.Fatal(err)
	}
	ab, err := metal.Abort.Call(ctx, c, node)
	if err != nil {
		t.Fatal(err)
	}
	if ab.Lifecycle.State != "failed" || ab.Lifecycle.LastError == nil || ab.Lifecycle.LastError.Reason != coremetal.ReasonAborted ||
		ab.Lifecycle.LastError.Operation != "deploy" || ab.Lifecycle.AbortRequestedAt == nil {
		t.Fatalf("aborted: %+v %+v", ab.Lifecycle, ab.Lifecycle.LastError)
	}
	if _, err := metal.Abort.Call(ctx, c, node); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("abort with nothing in flight: %v", err)
	}
	r, err := metal.Recover.Call(ctx, c, node)
	if err != nil || r.Lifecycle.Operation != "recover" || r.Lifecycle.State != "failed" {
		t.Fatalf("recover: %+v %v", r.Lifecycle, err)
	}
	m.finish(r, metaldomain.Finish{})
	if now := m.get(n.Node.ID); now.Lifecycle.State != "ready" {
		t.Fatalf("recovered to %s, want ready (a failed deploy recovers to ready)", now.Lifecycle.State)
	}

	// Retire from ready; its end revokes the node's identities.
	ret, err := metal.Retire.Call(ctx, c, node)
	if err != nil || ret.Lifecycle.State != "retiring" {
		t.Fatalf("retire: %+v %v", ret.Lifecycle, err)
	}
	m.finish(ret, metaldomain.Finish{})
	if now := m.get(n.Node.ID); now.Lifecycle.State != "retired" || len(now.Lifecycle.Allowed) != 0 {
		t.Fatalf("retired: %+v", now.Lifecycle)
	}
	if m.count(`SELECT count(*) FROM node_events WHERE node_id = $1 AND type = 'IdentityRevoked'`, n.Node.ID) != 1 {
		t.Fatal("retire revoked nothing")
	}

	// Another tenant's node is NOT_FOUND.
	if _, err := metal.Manage.Call(ctx, m.client(m.globex), metal.NodeInput{TenantID: "globex", NodeID: n.Node.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex: %v", err)
	}
	// Every start is owed (no Temporal here): the rows say so.
	if owed := m.count(`SELECT count(*) FROM node_metal WHERE node_id = $1 AND operation <> '' AND workflow_started_at IS NULL`, n.Node.ID); owed != 0 {
		t.Fatalf("%d operations left in flight", owed)
	}
}

type rpc1 = rpc.Ref[metal.NodeInput, metal.MetalNode]

func (m *metalEnv) get(nodeID string) metal.MetalNode {
	m.t.Helper()
	var n metal.MetalNode
	if err := m.store.InTx(context.Background(), store.ReadOnly, func(tx store.Tx) (err error) {
		n, err = metaldomain.Get(context.Background(), tx, "acme", nodeID, false)
		return err
	}); err != nil {
		m.t.Fatal(err)
	}
	return n
}

func TestMetalBulkAnswersPerNode(t *testing.T) {
	m := newMetalEnv(t)
	ctx := context.Background()
	c := m.client(m.boot.UserToken)
	a, b := m.enroll("a", "https://10.0.0.1"), m.enroll("b", "https://10.0.0.2")
	other := m.pool // a node of another pool is NOT_FOUND in this one
	otherPool := m.env.pool(m.boot.UserToken, "acme", m.site.ID, "other").ID
	m.pool = otherPool
	x := m.enroll("x", "https://10.0.0.3")
	m.pool = other
	// b is already managing: its item is INVALID_STATE.
	if _, err := metal.Manage.Call(ctx, c, metal.NodeInput{TenantID: "acme", NodeID: b.Node.ID}); err != nil {
		t.Fatal(err)
	}
	res, err := metal.Bulk.Call(ctx, c, metal.BulkInput{TenantID: "acme", PoolID: m.pool, Operation: coremetal.Manage,
		NodeIDs: []string{a.Node.ID, b.Node.ID, x.Node.ID, core.NewID("node")}, Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		accepted bool
		code     string
	}{{true, ""}, {false, "INVALID_STATE"}, {false, "NOT_FOUND"}, {false, "NOT_FOUND"}}
	if len(res.Results) != 4 || res.BulkID == "" {
		t.Fatalf("bulk: %+v", res)
	}
	for i, w := range want {
		if res.Results[i].Accepted != w.accepted || res.Results[i].Code != w.code {
			t.Errorf("item %d: %+v, want %+v", i, res.Results[i], w)
		}
	}
	// The accepted node names its bulk run in its arguments.
	var bulkID string
	if err := m.store.Pool.QueryRow(ctx, `SELECT op_args->>'bulkId' FROM node_metal WHERE node_id = $1`, a.Node.ID).Scan(&bulkID); err != nil || bulkID != res.BulkID {
		t.Fatalf("bulkId %q %v, want %q", bulkID, err, res.BulkID)
	}
	// Input bounds the schema cannot say.
	_, err = metal.Bulk.Call(ctx, c, metal.BulkInput{TenantID: "acme", PoolID: m.pool, Operation: coremetal.Manage, NodeIDs: []string{}})
	wantError(t, err, core.CodeInvalidInput, "nodeIds")
	_, err = metal.Bulk.Call(ctx, c, metal.BulkInput{TenantID: "acme", PoolID: m.pool, Operation: coremetal.Manage, NodeIDs: []string{a.Node.ID, a.Node.ID}})
	wantError(t, err, core.CodeInvalidInput, "nodeIds")
	_, err = metal.Bulk.Call(ctx, c, metal.BulkInput{TenantID: "acme", PoolID: m.pool, Operation: coremetal.Power, NodeIDs: []string{a.Node.ID}})
	wantError(t, err, core.CodeInvalidInput, "args")
	many := make([]string, 101)
	for i := range many {
		many[i] = core.NewID("node")
	}
	_, err = metal.Bulk.Call(ctx, c, metal.BulkInput{TenantID: "acme", PoolID: m.pool, Operation: coremetal.Manage, NodeIDs: many})
	wantError(t, err, core.CodeInvalidInput, "nodeIds")

	// A queued node's deadline counts from its turn: at concurrency 2 the
	// third node waits for one turn, so it has twice the time.
	queued := []string{m.enroll("q1", "https://10.0.0.11").Node.ID, m.enroll("q2", "https://10.0.0.12").Node.ID,
		m.enroll("q3", "https://10.0.0.13").Node.ID}
	if _, err := metal.Bulk.Call(ctx, c, metal.BulkInput{TenantID: "acme", PoolID: m.pool, Operation: coremetal.Manage,
		NodeIDs: queued, Concurrency: 2}); err != nil {
		t.Fatal(err)
	}
	spans := make([]float64, len(queued))
	for i, id := range queued {
		if err := m.store.Pool.QueryRow(ctx, `SELECT extract(epoch FROM deadline_at - op_started_at)::float8 FROM node_metal WHERE node_id = $1`,
			id).Scan(&spans[i]); err != nil {
			t.Fatal(err)
		}
	}
	if spans[1] > 1.5*spans[0] || spans[2] < 1.5*spans[0] {
		t.Fatalf("deadlines of a bulk run at concurrency 2: %v s", spans)
	}
}

// siteHolder registers a site agent and answers its lease epoch.
func (m *metalEnv) siteHolder(token, holder string) int64 {
	m.t.Helper()
	status, body, _ := postAgentH(m.t, m.url, protocol.SiteRegisterPath, `{"token":"`+token+`","holder":"`+holder+`"}`)
	if status != 200 {
		m.t.Fatalf("register: %d %s", status, body)
	}
	var r protocol.SiteResult
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		m.t.Fatal(err)
	}
	return r.Lease.Epoch
}

func siteAuth(token string, epoch int64) string {
	return fmt.Sprintf(`"token":%q,"epoch":%d`, token, epoch)
}

func postAgentH(t testing.TB, base, path, body string) (int, string, http.Header) {
	t.Helper()
	resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw), resp.Header
}

func TestMetalSiteEndpoints(t *testing.T) {
	m := newMetalEnv(t)
	ctx := context.Background()
	c := m.client(m.boot.UserToken)
	n := m.enroll("m1", "https://10.0.0.1")
	// A node of another site, served by another agent.
	site1, pool1 := m.site, m.pool
	m.site = m.env.site(m.boot.UserToken, "acme", "fra-2", "custom")
	m.pool = m.env.pool(m.boot.UserToken, "acme", m.site.ID, "metal-2").ID
	other := m.enroll("m2", "https://10.0.0.1")
	m.site, m.pool = site1, pool1
	epoch := m.siteHolder(m.token, "agent-a")

	creds := func(auth, nodeID string) (int, string, http.Header) {
		return postAgentH(t, m.url, protocol.SiteBMCCredentialsPath, `{`+auth+`,"nodeId":"`+nodeID+`"}`)
	}
	status, body, h := creds(siteAuth(m.token, epoch), n.Node.ID)
	if status != 200 || h.Get("Cache-Control") != "no-store" {
		t.Fatalf("credentials: %d %s %v", status, body, h)
	}
	var got protocol.SiteBMCCredentialsResult
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	if got.Redfish == nil || got.Redfish.Password != bmcPassword || got.Redfish.Address != "https://10.0.0.1" || got.IPMI != nil {
		t.Fatalf("credentials: %+v", got)
	}
	// The resolution is on the node's history, by reference.
	var details string
	if err := m.store.Pool.QueryRow(ctx, `SELECT details::text FROM node_events WHERE node_id = $1 AND type = $2`,
		n.Node.ID, metaldomain.EventCredentialsUsed).Scan(&details); err != nil || !strings.Contains(details, "secret://acme/bmc") {
		t.Fatalf("event: %q %v", details, err)
	}
	// A node of another site is NOT_FOUND, as one that does not exist.
	for _, id := range []string{other.Node.ID, core.NewID("node")} {
		if status, body, _ := creds(siteAuth(m.token, epoch), id); status != 404 || strings.Contains(body, "Password") {
			t.Fatalf("credentials of %s: %d %s", id, status, body)
		}
	}
	// A fleet secret a node of the tenant's own site names (written behind
	// enrolment's back, which refuses it) never reaches the tenant's agent.
	m.putSecret(api.DefaultRootTenant, "fleet-bmc", "the fleet's password")
	if _, err := m.store.Pool.Exec(ctx, `UPDATE node_bmcs SET redfish_password_ref = 'secret://root/fleet-bmc' WHERE node_id = $1`,
		n.Node.ID); err != nil {
		t.Fatal(err)
	}
	if status, body, _ := creds(siteAuth(m.token, epoch), n.Node.ID); status != 409 || strings.Contains(body, "fleet's password") ||
		!strings.Contains(body, "secretGone") {
		t.Fatalf("a fleet secret for a tenant's site: %d %s", status, body)
	}
	if _, err := m.store.Pool.Exec(ctx, `UPDATE node_bmcs SET redfish_password_ref = 'secret://acme/bmc' WHERE node_id = $1`,
		n.Node.ID); err != nil {
		t.Fatal(err)
	}
	// A non-holder (a stale epoch, a lease taken over) is refused.
	if status, _, _ := creds(siteAuth(m.token, epoch+1), n.Node.ID); status != 409 {
		t.Fatalf("stale epoch: %d", status)
	}
	if status, _, _ := creds(siteAuth(core.NewID("x"), epoch), n.Node.ID); status != 401 {
		t.Fatalf("unknown token: %d", status)
	}
	if _, err := m.store.Pool.Exec(ctx, `UPDATE leases SET expires_at = now() - interval '1 second' WHERE name = $1`,
		store.SiteBootLease(m.site.ID)); err != nil {
		t.Fatal(err)
	}
	epochB := m.siteHolder(m.token, "agent-b")
	if status, _, _ := creds(siteAuth(m.token, epoch), n.Node.ID); status != 409 {
		t.Fatalf("the old holder after a takeover: %d", status)
	}

	// Boot tokens: once, for a boot of the agent's site.
	if _, err := metal.Manage.Call(ctx, c, metal.NodeInput{TenantID: "acme", NodeID: n.Node.ID}); err != nil {
		t.Fatal(err)
	}
	mg := m.get(n.Node.ID)
	m.finish(mg, metaldomain.Finish{Managed: true})
	in, err := metal.Inspect.Call(ctx, c, metal.NodeInput{TenantID: "acme", NodeID: n.Node.ID})
	if err != nil {
		t.Fatal(err)
	}
	var boot metaldomain.Boot
	if err := m.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		boot, err = metaldomain.CreateBoot(ctx, tx, n.Node.ID, in.Lifecycle.OpSeq, metaldomain.PurposeInspect)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	mint := func(auth, bootID string) (int, string) {
		s, b, _ := postAgentH(t, m.url, protocol.SiteBootTokenPath, `{`+auth+`,"bootId":"`+bootID+`"}`)
		return s, b
	}
	if status, _ := mint(siteAuth(m.token, epoch), boot.ID); status != 409 {
		t.Fatalf("a non-holder minting: %d", status)
	}
	status, body = mint(siteAuth(m.token, epochB), boot.ID)
	var tok protocol.SiteBootTokenResult
	if err := json.Unmarshal([]byte(body), &tok); status != 200 || err != nil || !strings.HasPrefix(tok.Token, protocol.BootTokenPrefix) {
		t.Fatalf("mint: %d %s", status, body)
	}
	if status, _ := mint(siteAuth(m.token, epochB), boot.ID); status != 409 {
		t.Fatalf("a second mint: %d", status)
	}

	// The ramdisk reports with it; a bad token is 401, an ended boot 410.
	inv := jsonOf(t, machine(t, "00000000a001"))
	report := func(token string) (int, string) {
		s, b, _ := postAgentH(t, m.url, protocol.RamdiskReportPath, `{"token":"`+token+`","inventory":`+inv+`}`)
		return s, b
	}
	if status, _ := report(protocol.BootTokenPrefix + "nope"); status != 401 {
		t.Fatalf("a bad boot token: %d", status)
	}
	if status, body := report(tok.Token); status != 200 || !strings.Contains(body, `"steps":[]`) || !strings.Contains(body, n.Node.ID) {
		t.Fatalf("report: %d %s", status, body)
	}
	if err := m.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		return metaldomain.SetBootSteps(ctx, tx, boot.ID, in.Lifecycle.OpSeq, []protocol.RamdiskStep{{Name: protocol.StepPowerOff}})
	}); err != nil {
		t.Fatal(err)
	}
	status, body, _ = postAgentH(t, m.url, protocol.RamdiskResultPath, `{"token":"`+tok.Token+`","results":[]}`)
	if status != 200 || !strings.Contains(body, protocol.StepPowerOff) {
		t.Fatalf("result: %d %s", status, body)
	}
	if err := m.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error { return metaldomain.FinishBoot(ctx, tx, boot.ID) }); err != nil {
		t.Fatal(err)
	}
	if status, _ := report(tok.Token); status != 410 {
		t.Fatalf("report of an ended boot: %d", status)
	}

	// Discovery: the token, a machine reporting, listed for the site's
	// owner only, then confirmed as the node's boot MAC.
	status, body, _ = postAgentH(t, m.url, protocol.SiteDiscoveryTokenPath, `{`+siteAuth(m.token, epochB)+`}`)
	var dt protocol.SiteDiscoveryTokenResult
	if err := json.Unmarshal([]byte(body), &dt); status != 200 || err != nil || !strings.HasPrefix(dt.Token, protocol.DiscoveryTokenPrefix) {
		t.Fatalf("discovery token: %d %s", status, body)
	}
	found := machine(t, "00000000a002")
	mac := found.NICs[0].PermanentMAC
	if mac == "" {
		mac = found.NICs[0].MAC
	}
	status, body, _ = postAgentH(t, m.url, protocol.RamdiskDiscoverPath,
		`{"token":"`+dt.Token+`","bootMac":"`+mac+`","inventory":`+jsonOf(t, found)+`}`)
	if status != 200 || !strings.Contains(body, protocol.StepPowerOff) {
		t.Fatalf("discover: %d %s", status, body)
	}
	if status, _, _ := postAgentH(t, m.url, protocol.RamdiskDiscoverPath,
		`{"token":"`+protocol.DiscoveryTokenPrefix+`x","bootMac":"`+mac+`","inventory":`+jsonOf(t, found)+`}`); status != 401 {
		t.Fatalf("discover with a bad token: %d", status)
	}
	list, err := metal.ListFound.Call(ctx, c, metal.DiscoveredInput{TenantID: "acme", SiteID: m.site.ID})
	if err != nil || len(list.Items) != 1 || list.Items[0].NodeID != "" {
		t.Fatalf("discovered: %+v %v", list, err)
	}
	if _, err := metal.ListFound.Call(ctx, m.client(m.globex), metal.DiscoveredInput{TenantID: "globex", SiteID: m.site.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex lists acme's site: %v", err)
	}

	fresh := m.enroll("m3", "https://10.0.0.3")
	cm, err := metal.ConfirmMAC.Call(ctx, c, metal.ConfirmMACInput{TenantID: "acme", NodeID: fresh.Node.ID, MAC: mac})
	if err != nil || cm.BMC.BootMACConfirmedAt == nil || cm.Node.HardwareKey == "" {
		t.Fatalf("confirmMac: %+v %v", cm.BMC, err)
	}
	if list, _ := metal.ListFound.Call(ctx, c, metal.DiscoveredInput{TenantID: "acme", SiteID: m.site.ID}); list.Items[0].NodeID != fresh.Node.ID {
		t.Fatalf("not linked: %+v", list.Items[0])
	}

	// No table holds the password in clear, after it was resolved.
	if strings.Contains(testenv.DumpTables(t, m.store), bmcPassword) {
		t.Error("a table holds the BMC password in clear")
	}
}
