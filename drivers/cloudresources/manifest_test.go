package cloudresources

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"
)

// cluster is a valid manifest with a parent-less kind; child one that
// lives in it. The defect cases below each change one thing.
const cluster = `{"kind":"x.cluster","family":"data","description":"d","regional":true,"preview":false,"releasable":true,
	"spec":{"type":"object","additionalProperties":false,"required":["region","size"],
		"properties":{"region":{"type":"string"},"size":{"type":"string"},"engine":{"type":"string"}}},
	"updatable":["size"],"outputs":["host"],"secretOutputs":["password"],
	"meters":[{"name":"x.node.hours","unit":"node-hour","description":"d"}]}`

const child = `{"kind":"x.cluster.user","family":"data","description":"d","regional":false,"preview":false,"releasable":true,
	"parent":"x.cluster","identity":{"field":"name"},
	"spec":{"type":"object","additionalProperties":false,"required":["name"],"properties":{"name":{"type":"string"}}},
	"updatable":[],"outputs":[],"secretOutputs":["password"],"meters":[]}`

const booking = `{"kind":"x.gpu","family":"ai","description":"d","regional":false,"preview":true,"releasable":true,
	"spec":{"type":"object","additionalProperties":false,"required":["accelerator","replicas"],
		"properties":{"accelerator":{"type":"string","enum":["a1","a8"]},"replicas":{"type":"integer","minimum":1},"maxReplicas":{"type":"integer","minimum":1}}},
	"updatable":["replicas","maxReplicas"],"outputs":[],"secretOutputs":[],"meters":[],
	"books":{"quota":"gpu","perReplica":{"field":"accelerator","counts":{"a1":1,"a8":8}},"replicas":["replicas","maxReplicas"]}}`

// edit changes a manifest's JSON: replace old by new, which must occur.
func edit(t *testing.T, doc, old, new string) string {
	t.Helper()
	require.Contains(t, doc, old)
	return strings.Replace(doc, old, new, 1)
}

func files(kv ...string) fstest.MapFS {
	fsys := fstest.MapFS{}
	for i := 0; i+1 < len(kv); i += 2 {
		fsys[kv[i]] = &fstest.MapFile{Data: []byte(kv[i+1])}
	}
	return fsys
}

func TestLoadKinds(t *testing.T) {
	set, err := LoadKinds(files("x.cluster.json", cluster, "x.cluster.user.json", child, "x.gpu.json", booking, "README.md", "not a manifest"))
	require.NoError(t, err)
	var kinds []string
	for _, m := range set.All() {
		kinds = append(kinds, m.Kind)
	}
	require.Equal(t, []string{"x.cluster", "x.cluster.user", "x.gpu"}, kinds)
	m, ok := set.Lookup("x.cluster.user")
	require.True(t, ok)
	require.Equal(t, "x.cluster", m.Parent)
	_, ok = set.Lookup("x.other")
	require.False(t, ok)
}

func TestLoadKindsRefusesDefects(t *testing.T) {
	tests := []struct {
		name  string
		fsys  fstest.MapFS
		error string
	}{
		{name: "no manifest", fsys: files(), error: "no manifest"},
		{name: "not JSON", fsys: files("x.cluster.json", `{`), error: "decoding"},
		{name: "an unknown manifest field", fsys: files("x.cluster.json", edit(t, cluster, `"preview":false`, `"preview":false,"previews":true`)), error: "unknown field"},
		{name: "a file named for another kind", fsys: files("x.db.json", cluster), error: `the file names "x.db"`},
		{name: "a bad kind name", fsys: files("X.json", edit(t, cluster, `"kind":"x.cluster"`, `"kind":"X"`)), error: "not a kind name"},
		{name: "an unknown family", fsys: files("x.cluster.json", edit(t, cluster, `"family":"data"`, `"family":"databases"`)), error: "family"},
		{name: "a schema that does not compile", fsys: files("x.cluster.json", edit(t, cluster, `"size":{"type":"string"}`, `"size":{"type":"text"}`)), error: "spec schema"},
		{name: "a schema of no object", fsys: files("x.cluster.json", edit(t, cluster, `"spec":{"type":"object"`, `"spec":{"type":"array"`)), error: "not an object's schema"},
		{name: "a schema taking unknown fields", fsys: files("x.cluster.json", edit(t, cluster, `"additionalProperties":false`, `"additionalProperties":true`)), error: "unknown fields must be refused"},
		{name: "a regional kind without a required region", fsys: files("x.cluster.json", edit(t, cluster, `"required":["region","size"]`, `"required":["size"]`)), error: "requires region"},
		{name: "an updatable field the spec lacks", fsys: files("x.cluster.json", edit(t, cluster, `"updatable":["size"]`, `"updatable":["nodes"]`)), error: `updatable field "nodes"`},
		{name: "an output also secret", fsys: files("x.cluster.json", edit(t, cluster, `"outputs":["host"]`, `"outputs":["host","password"]`)), error: `"password" is empty or repeated`},
		{name: "a meter without a unit", fsys: files("x.cluster.json", edit(t, cluster, `"unit":"node-hour"`, `"unit":""`)), error: "a meter needs"},
		{name: "a missing parent", fsys: files("x.cluster.user.json", child), error: `parent kind "x.cluster" is not in the set`},
		{name: "a grandparent", fsys: files("x.cluster.json", cluster, "x.cluster.user.json", child,
			"x.cluster.user.grant.json", edit(t, edit(t, child, `"kind":"x.cluster.user"`, `"kind":"x.cluster.user.grant"`), `"parent":"x.cluster"`, `"parent":"x.cluster.user"`)), error: "has a parent itself"},
		{name: "an identity without a parent", fsys: files("x.cluster.json", edit(t, cluster, `"preview":false`, `"preview":false,"identity":{}`)), error: "needs a parent"},
		{name: "an identity field not required", fsys: files("x.cluster.json", cluster, "x.cluster.user.json", edit(t, child, `"identity":{"field":"name"}`, `"identity":{"field":"login"}`)), error: `identity field "login"`},
		{name: "a count missing for a value", fsys: files("x.gpu.json", edit(t, booking, `"counts":{"a1":1,"a8":8}`, `"counts":{"a1":1}`)), error: "must enumerate exactly"},
		{name: "a count that is not positive", fsys: files("x.gpu.json", edit(t, booking, `"a8":8}`, `"a8":0}`)), error: `"a8"`},
		{name: "a replicas field the spec lacks", fsys: files("x.gpu.json", edit(t, booking, `"replicas":["replicas","maxReplicas"]}`, `"replicas":["replicas","max"]}`)), error: `field "max"`},
		{name: "booking without a quota", fsys: files("x.gpu.json", edit(t, booking, `"quota":"gpu"`, `"quota":""`)), error: "a quota"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadKinds(tt.fsys)
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.error)
		})
	}
}

func load(t *testing.T, kind string) *Manifest {
	t.Helper()
	set, err := LoadKinds(files("x.cluster.json", cluster, "x.cluster.user.json", child, "x.gpu.json", booking))
	require.NoError(t, err)
	m, ok := set.Lookup(kind)
	require.True(t, ok)
	return m
}

func TestReplaceRequired(t *testing.T) {
	m := load(t, "x.cluster")
	tests := []struct {
		name, old, new string
		want           []string
	}{
		{name: "an updatable field", old: `{"region":"r","size":"s"}`, new: `{"region":"r","size":"m"}`},
		{name: "an updatable field added", old: `{"region":"r"}`, new: `{"region":"r","size":"m"}`},
		{name: "numbers compare by value", old: `{"region":"r","engine":1}`, new: `{"region":"r","engine":1.0}`},
		{name: "a field added", old: `{"region":"r"}`, new: `{"region":"r","engine":"pg"}`, want: []string{"spec.engine"}},
		{name: "a field removed", old: `{"region":"r","engine":"pg"}`, new: `{"region":"r"}`, want: []string{"spec.engine"}},
		{name: "two fields, sorted", old: `{"region":"r","engine":"pg"}`, new: `{"region":"q","engine":"my"}`, want: []string{"spec.engine", "spec.region"}},
		{name: "a nested change", old: `{"region":{"a":[1,2]}}`, new: `{"region":{"a":[2,1]}}`, want: []string{"spec.region"}},
		{name: "an old spec that is not JSON", old: `{`, new: `{}`, want: []string{"spec"}},
		{name: "a null spec", old: `null`, new: `{}`, want: []string{"spec"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, m.ReplaceRequired(json.RawMessage(tt.old), json.RawMessage(tt.new)))
		})
	}
}

func TestBooking(t *testing.T) {
	m := load(t, "x.gpu")
	tests := []struct {
		spec  string
		want  int
		error bool
	}{
		{spec: `{"accelerator":"a1","replicas":2}`, want: 2},
		{spec: `{"accelerator":"a8","replicas":2,"maxReplicas":3}`, want: 24},
		{spec: `{"accelerator":"a8","replicas":3,"maxReplicas":1}`, want: 24},
		{spec: `{"accelerator":"a2","replicas":1}`, error: true},
		{spec: `{"accelerator":"a1","replicas":1.5}`, error: true},
		{spec: `[]`, error: true},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			b, err := m.Booking(json.RawMessage(tt.spec))
			if tt.error {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, Booking{Quota: "gpu", Amount: tt.want}, b)
		})
	}
	b, err := load(t, "x.cluster").Booking(json.RawMessage(`{"region":"r","size":"s"}`))
	require.NoError(t, err)
	require.Zero(t, b)
}

func TestNamingAndOwnership(t *testing.T) {
	const id = "crs_0123456789ABCDEFGHJKMNPQRSTVWXYZ"
	require.Equal(t, "bc-r-0123456789abcdefghjkmnpq", ResourceName(id))
	o := Owner{ResourceID: id, TenantID: "acme corp"}
	require.Equal(t, []string{"better-compute-managed", "better-compute-resource:" + id, "better-compute-tenant:acme_corp"}, o.Tags())
	require.Equal(t, map[string]string{"better-compute-managed": "true", "better-compute-resource": id, "better-compute-tenant": "acme corp"}, o.Labels())
	require.True(t, o.Owns(append([]string{"team:db"}, o.Tags()...)))
	require.False(t, o.Owns(o.Tags()[:2]), "a resource without the tenant's tag is not the owner's")
	other := Owner{ResourceID: "crs_other", TenantID: "acme corp"}
	require.False(t, other.Owns(o.Tags()))
}

func TestSecretValuesNeverPrint(t *testing.T) {
	s := SecretValues{"password": "hunter2", "uri": "postgres://u:hunter2@h/db"}
	obs := Observed{Secrets: s}
	raw, err := json.Marshal(obs)
	require.NoError(t, err)
	for _, out := range []string{fmt.Sprint(s), fmt.Sprintf("%v %+v %#v %s", s, obs, obs, s), string(raw)} {
		require.NotContains(t, out, "hunter2")
	}
	require.Contains(t, fmt.Sprint(s), "password")
	require.Equal(t, "hunter2", s["password"], "the map itself keeps the values for sealing")
}

func TestValidateNeedsALoadedManifest(t *testing.T) {
	err := (&Manifest{Kind: "x.cluster"}).Validate(json.RawMessage(`{}`))
	require.ErrorContains(t, err, "not loaded")
}
