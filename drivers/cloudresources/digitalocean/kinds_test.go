package digitalocean

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/drivers/cloudresources"
)

func manifest(t *testing.T, kind string) *cloudresources.Manifest {
	t.Helper()
	m, ok := Kinds().Lookup(kind)
	require.True(t, ok, "kind %s", kind)
	return m
}

func TestKindsLoad(t *testing.T) {
	var names []string
	for _, m := range Kinds().All() {
		names = append(names, m.Kind)
		require.Contains(t, cloudresources.Families(), m.Family, m.Kind)
		require.NotEmpty(t, m.Description, m.Kind)
		require.True(t, strings.HasPrefix(m.Kind, "do."), m.Kind)
		// The answer of the kinds method carries the schema as JSON.
		raw, err := json.Marshal(m)
		require.NoError(t, err)
		var back map[string]any
		require.NoError(t, json.Unmarshal(raw, &back))
		require.Equal(t, "object", back["spec"].(map[string]any)["type"], m.Kind)
	}
	require.Equal(t, []string{
		"do.app",
		"do.database.pg",
		"do.database.pg.database",
		"do.database.pg.firewall",
		"do.database.pg.pool",
		"do.database.pg.replica",
		"do.database.pg.user",
		"do.functions.namespace",
		"do.inference.dedicated",
	}, names)
}

func TestKindShapes(t *testing.T) {
	tests := []struct {
		kind       string
		family     string
		parent     string
		identity   *cloudresources.Identity
		regional   bool
		preview    bool
		releasable bool
		books      bool
		secrets    []string
	}{
		{kind: "do.database.pg", family: "data", regional: true, releasable: true, secrets: []string{"password", "uri", "privateUri"}},
		{kind: "do.database.pg.user", family: "data", parent: "do.database.pg", identity: &cloudresources.Identity{Field: "name"}, releasable: true, secrets: []string{"password", "uri"}},
		{kind: "do.database.pg.database", family: "data", parent: "do.database.pg", identity: &cloudresources.Identity{Field: "name"}, releasable: true},
		{kind: "do.database.pg.pool", family: "data", parent: "do.database.pg", identity: &cloudresources.Identity{Field: "name"}, releasable: true, secrets: []string{"password", "uri", "privateUri"}},
		{kind: "do.database.pg.firewall", family: "data", parent: "do.database.pg", identity: &cloudresources.Identity{}, releasable: true},
		{kind: "do.database.pg.replica", family: "data", parent: "do.database.pg", regional: true, releasable: true, secrets: []string{"password", "uri", "privateUri"}},
		{kind: "do.app", family: "platform", regional: true, releasable: true},
		{kind: "do.functions.namespace", family: "platform", regional: true, secrets: []string{"key"}},
		{kind: "do.inference.dedicated", family: "ai", regional: true, preview: true, releasable: false, books: true, secrets: []string{"token"}},
	}
	for _, tt := range tests {
		t.Run(tt.kind, func(t *testing.T) {
			m := manifest(t, tt.kind)
			require.Equal(t, tt.family, m.Family)
			require.Equal(t, tt.parent, m.Parent)
			require.Equal(t, tt.identity, m.Identity)
			require.Equal(t, tt.regional, m.Regional)
			require.Equal(t, tt.preview, m.Preview)
			require.Equal(t, tt.releasable, m.Releasable)
			require.Equal(t, tt.books, m.Books != nil)
			require.ElementsMatch(t, tt.secrets, m.SecretOutputs)
		})
	}
}

// refusal reads Validate's error as the API would answer it.
func refusal(t *testing.T, err error) (field, reason string) {
	t.Helper()
	require.Error(t, err)
	e := core.AsError(err)
	require.Equal(t, core.CodeInvalidInput, e.Code, err.Error())
	field, _ = e.Details["field"].(string)
	reason, _ = e.Details["reason"].(string)
	return field, reason
}

func TestValidate(t *testing.T) {
	const (
		uuid = "0a1b2c3d-4e5f-4a6b-8c9d-0e1f2a3b4c5d"
		inst = "inst_0123456789abcdefghjkmnpqrs"
	)
	tests := []struct {
		kind, name, spec string
		field, reason    string // empty: valid
	}{
		// The cluster.
		{kind: "do.database.pg", name: "minimal", spec: `{"region":"fra1","size":"db-s-1vcpu-1gb"}`},
		{kind: "do.database.pg", name: "everything", spec: `{"name":"orders","engine":"pg","version":"16","region":"fra1","size":"db-s-2vcpu-4gb","num_nodes":3,
			"storage_size_mib":40960,"private_network_uuid":"` + uuid + `","project_id":"` + uuid + `","network":"net_0123456789abcdefghjkmnpqrs",
			"maintenance_window":{"day":"sunday","hour":"03:30"},"storage_autoscale":{"enabled":true,"threshold_percent":80,"increment_gib":10}}`},
		{kind: "do.database.pg", name: "region missing", spec: `{"size":"db-s-1vcpu-1gb"}`, field: "spec.region", reason: "required"},
		{kind: "do.database.pg", name: "unknown field", spec: `{"region":"fra1","size":"db-s-1vcpu-1gb","nodes":2}`, field: "spec.nodes", reason: "unknown"},
		{kind: "do.database.pg", name: "another engine", spec: `{"region":"fra1","size":"db-s-1vcpu-1gb","engine":"mysql"}`, field: "spec.engine", reason: "enum"},
		{kind: "do.database.pg", name: "four nodes", spec: `{"region":"fra1","size":"db-s-1vcpu-1gb","num_nodes":4}`, field: "spec.num_nodes", reason: "range"},
		{kind: "do.database.pg", name: "nodes as text", spec: `{"region":"fra1","size":"db-s-1vcpu-1gb","num_nodes":"2"}`, field: "spec.num_nodes", reason: "type"},
		{kind: "do.database.pg", name: "storage off whole GiB", spec: `{"region":"fra1","size":"db-s-1vcpu-1gb","storage_size_mib":15000}`, field: "spec.storage_size_mib", reason: "multipleOf"},
		{kind: "do.database.pg", name: "a droplet size", spec: `{"region":"fra1","size":"s-1vcpu-1gb"}`, field: "spec.size", reason: "pattern"},
		{kind: "do.database.pg", name: "a bad region", spec: `{"region":"Frankfurt","size":"db-s-1vcpu-1gb"}`, field: "spec.region", reason: "pattern"},
		{kind: "do.database.pg", name: "a bad hour", spec: `{"region":"fra1","size":"db-s-1vcpu-1gb","maintenance_window":{"day":"sunday","hour":"25:00"}}`, field: "spec.maintenance_window.hour", reason: "pattern"},
		{kind: "do.database.pg", name: "a window without a day", spec: `{"region":"fra1","size":"db-s-1vcpu-1gb","maintenance_window":{"hour":"03:00"}}`, field: "spec.maintenance_window.day", reason: "required"},
		{kind: "do.database.pg", name: "a VPC that is no uuid", spec: `{"region":"fra1","size":"db-s-1vcpu-1gb","private_network_uuid":"vpc-1"}`, field: "spec.private_network_uuid", reason: "pattern"},
		{kind: "do.database.pg", name: "not an object", spec: `["fra1"]`, field: "spec", reason: "type"},
		{kind: "do.database.pg", name: "empty", spec: ``, field: "spec", reason: "required"},
		{kind: "do.database.pg", name: "not JSON", spec: `{"region":`, field: "spec", reason: "type"},
		{kind: "do.database.pg", name: "too large", spec: `{"region":"fra1","size":"db-s-1vcpu-1gb","name":"` + strings.Repeat("a", cloudresources.MaxSpecBytes) + `"}`, field: "spec", reason: "maxBytes"},

		// What lives in it.
		{kind: "do.database.pg.user", name: "a user", spec: `{"name":"app_rw"}`},
		{kind: "do.database.pg.user", name: "the admin", spec: `{"name":"doadmin"}`, field: "spec.name", reason: "reserved"},
		{kind: "do.database.pg.user", name: "no name", spec: `{}`, field: "spec.name", reason: "required"},
		{kind: "do.database.pg.user", name: "a password", spec: `{"name":"app","password":"x"}`, field: "spec.password", reason: "unknown"},
		{kind: "do.database.pg.database", name: "a database", spec: `{"name":"orders"}`},
		{kind: "do.database.pg.database", name: "the default", spec: `{"name":"defaultdb"}`, field: "spec.name", reason: "reserved"},
		{kind: "do.database.pg.database", name: "upper case", spec: `{"name":"Orders"}`, field: "spec.name", reason: "pattern"},
		{kind: "do.database.pg.pool", name: "a pool", spec: `{"name":"web","db":"orders","user":"app_rw","size":10,"mode":"transaction"}`},
		{kind: "do.database.pg.pool", name: "an unknown mode", spec: `{"name":"web","db":"orders","size":10,"mode":"pooled"}`, field: "spec.mode", reason: "enum"},
		{kind: "do.database.pg.pool", name: "no connections", spec: `{"name":"web","db":"orders","size":0,"mode":"session"}`, field: "spec.size", reason: "range"},
		{kind: "do.database.pg.pool", name: "a short name", spec: `{"name":"wb","db":"orders","size":10,"mode":"session"}`, field: "spec.name", reason: "minLength"},
		{kind: "do.database.pg.pool", name: "no database", spec: `{"name":"web","size":5,"mode":"session"}`, field: "spec.db", reason: "required"},
		{kind: "do.database.pg.firewall", name: "rules and instances", spec: `{"rules":[{"type":"ip_addr","value":"192.0.2.0/24"}],"instances":["` + inst + `"]}`},
		{kind: "do.database.pg.firewall", name: "an unknown rule type", spec: `{"rules":[{"type":"vpc","value":"x"}]}`, field: "spec.rules.0.type", reason: "enum"},
		{kind: "do.database.pg.firewall", name: "a rule without a value", spec: `{"rules":[{"type":"ip_addr","value":"192.0.2.1"},{"type":"tag"}]}`, field: "spec.rules.1.value", reason: "required"},
		{kind: "do.database.pg.firewall", name: "not an instance id", spec: `{"instances":["droplet-1"]}`, field: "spec.instances.0", reason: "pattern"},
		{kind: "do.database.pg.firewall", name: "an instance twice", spec: `{"instances":["` + inst + `","` + inst + `"]}`, field: "spec.instances", reason: "uniqueItems"},
		{kind: "do.database.pg.replica", name: "a replica", spec: `{"region":"ams3","size":"db-s-2vcpu-4gb"}`},
		{kind: "do.database.pg.replica", name: "a replica without a size", spec: `{"region":"ams3"}`, field: "spec.size", reason: "required"},

		// Apps.
		{kind: "do.app", name: "a service from an image", spec: `{"region":"fra","services":[{"name":"web","image":{"registry_type":"DOCKER_HUB","repository":"nginx","tag":"1.27"},
			"instance_count":2,"instance_size_slug":"apps-s-1vcpu-1gb","http_port":8080,"routes":[{"path":"/"}],
			"envs":[{"key":"DB_PASSWORD","type":"SECRET","value":"secret://acme/db-password"},{"key":"MODE","value":"prod"}]}]}`},
		{kind: "do.app", name: "a static site from git", spec: `{"region":"ams","static_sites":[{"name":"docs","git":{"repo_clone_url":"https://example.com/docs.git","branch":"main"},"output_dir":"public"}]}`},
		{kind: "do.app", name: "a worker and a job from github", spec: `{"region":"nyc","workers":[{"name":"queue","github":{"repo":"acme/app","branch":"main"},"run_command":"work"}],
			"jobs":[{"name":"migrate","github":{"repo":"acme/app"},"kind":"PRE_DEPLOY"}]}`},
		{kind: "do.app", name: "a droplet region", spec: `{"region":"fra1"}`, field: "spec.region", reason: "pattern"},
		{kind: "do.app", name: "a secret env in clear", spec: `{"region":"fra","services":[{"name":"web","image":{"registry_type":"GHCR","repository":"acme/web"},"envs":[{"key":"TOKEN","type":"SECRET","value":"hunter2"}]}]}`,
			field: "spec.services.0.envs.0.value", reason: "pattern"},
		{kind: "do.app", name: "a service field on a static site", spec: `{"region":"fra","static_sites":[{"name":"docs","git":{"repo_clone_url":"https://example.com/d.git"},"instance_count":2}]}`,
			field: "spec.static_sites.0.instance_count", reason: "unknown"},
		{kind: "do.app", name: "a job kind on a service", spec: `{"region":"fra","services":[{"name":"web","image":{"registry_type":"GHCR","repository":"acme/web"},"kind":"PRE_DEPLOY"}]}`,
			field: "spec.services.0.kind", reason: "unknown"},
		{kind: "do.app", name: "a component without a source", spec: `{"region":"fra","services":[{"name":"web"}]}`, field: "spec.services.0", reason: "oneOf"},
		{kind: "do.app", name: "two sources", spec: `{"region":"fra","services":[{"name":"web","image":{"registry_type":"GHCR","repository":"a/b"},"github":{"repo":"a/b"}}]}`, field: "spec.services.0", reason: "oneOf"},
		{kind: "do.app", name: "a component name with capitals", spec: `{"region":"fra","workers":[{"name":"Queue","github":{"repo":"a/b"}}]}`, field: "spec.workers.0.name", reason: "pattern"},

		// Functions.
		{kind: "do.functions.namespace", name: "a namespace", spec: `{"region":"fra1"}`},
		{kind: "do.functions.namespace", name: "a label", spec: `{"region":"fra1","label":"mine"}`, field: "spec.label", reason: "unknown"},
		{kind: "do.functions.namespace", name: "no region", spec: `{}`, field: "spec.region", reason: "required"},

		// Dedicated inference.
		{kind: "do.inference.dedicated", name: "an endpoint", spec: `{"region":"atl1","model_slug":"llama-3-1-8b","model_provider":"hugging_face","provider_model_id":"meta-llama/Llama-3.1-8B-Instruct",
			"accelerator_slug":"gpu-h100x1-80gb","type":"prefill_decode","replicas":1,"maxReplicas":3,"enable_public_endpoint":true,"hugging_face_token":"secret://acme/hf"}`},
		{kind: "do.inference.dedicated", name: "an unknown accelerator", spec: `{"region":"atl1","model_slug":"m","model_provider":"hugging_face","accelerator_slug":"gpu-a100","replicas":1}`, field: "spec.accelerator_slug", reason: "enum"},
		{kind: "do.inference.dedicated", name: "no replicas", spec: `{"region":"atl1","model_slug":"m","model_provider":"hugging_face","accelerator_slug":"gpu-h100x1-80gb"}`, field: "spec.replicas", reason: "required"},
		{kind: "do.inference.dedicated", name: "zero replicas", spec: `{"region":"atl1","model_slug":"m","model_provider":"hugging_face","accelerator_slug":"gpu-h100x1-80gb","replicas":0}`, field: "spec.replicas", reason: "range"},
		{kind: "do.inference.dedicated", name: "a token in clear", spec: `{"region":"atl1","model_slug":"m","model_provider":"hugging_face","accelerator_slug":"gpu-h100x1-80gb","replicas":1,"hugging_face_token":"hf_abc"}`,
			field: "spec.hugging_face_token", reason: "pattern"},
	}
	for _, tt := range tests {
		t.Run(tt.kind+"/"+tt.name, func(t *testing.T) {
			err := manifest(t, tt.kind).Validate(json.RawMessage(tt.spec))
			if tt.field == "" {
				require.NoError(t, err)
				return
			}
			field, reason := refusal(t, err)
			require.Equal(t, tt.field, field, err.Error())
			require.Equal(t, tt.reason, reason, err.Error())
		})
	}
}

func TestEveryManifestsSpecFieldsStayUnderSpec(t *testing.T) {
	for _, m := range Kinds().All() {
		field, _ := refusal(t, m.Validate(json.RawMessage(`{"notAField":1}`)))
		require.True(t, strings.HasPrefix(field, "spec."), "%s: %s", m.Kind, field)
	}
}

func TestClusterReplaceRequired(t *testing.T) {
	base := `{"region":"fra1","size":"db-s-1vcpu-1gb","version":"16","num_nodes":1,"engine":"pg","name":"orders"}`
	tests := []struct {
		name string
		new  string
		want []string
	}{
		{name: "unchanged", new: base},
		{name: "the same fields in another order", new: `{"name":"orders","engine":"pg","num_nodes":1,"version":"16","size":"db-s-1vcpu-1gb","region":"fra1"}`},
		{name: "size in place", new: `{"region":"fra1","size":"db-s-2vcpu-4gb","version":"16","num_nodes":1,"engine":"pg","name":"orders"}`},
		{name: "nodes, storage, version and maintenance window in place",
			new: `{"region":"fra1","size":"db-s-1vcpu-1gb","version":"17","num_nodes":2,"engine":"pg","name":"orders","storage_size_mib":20480,"maintenance_window":{"day":"monday","hour":"01:00"}}`},
		{name: "engine replaces", new: `{"region":"fra1","size":"db-s-1vcpu-1gb","version":"16","num_nodes":1,"engine":"mysql","name":"orders"}`, want: []string{"spec.engine"}},
		{name: "name replaces", new: `{"region":"fra1","size":"db-s-1vcpu-1gb","version":"16","num_nodes":1,"engine":"pg","name":"sales"}`, want: []string{"spec.name"}},
		{name: "removing the name replaces", new: `{"region":"fra1","size":"db-s-1vcpu-1gb","version":"16","num_nodes":1,"engine":"pg"}`, want: []string{"spec.name"}},
		{name: "private network, project and region replace, size does not",
			new: `{"region":"ams3","size":"db-s-2vcpu-4gb","version":"16","num_nodes":1,"engine":"pg","name":"orders",
				"private_network_uuid":"0a1b2c3d-4e5f-4a6b-8c9d-0e1f2a3b4c5d","project_id":"0a1b2c3d-4e5f-4a6b-8c9d-0e1f2a3b4c5d","network":"net_0123456789abcdefghjkmnpqrs"}`,
			want: []string{"spec.network", "spec.private_network_uuid", "spec.project_id", "spec.region"}},
		{name: "not an object", new: `[1]`, want: []string{"spec"}},
	}
	m := manifest(t, "do.database.pg")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, m.ReplaceRequired(json.RawMessage(base), json.RawMessage(tt.new)))
		})
	}
}

func TestInferenceBooksGPUs(t *testing.T) {
	spec := func(accelerator string, replicas ...int) json.RawMessage {
		s := map[string]any{"region": "atl1", "model_slug": "m", "model_provider": "hugging_face", "accelerator_slug": accelerator, "replicas": replicas[0]}
		if len(replicas) > 1 {
			s["maxReplicas"] = replicas[1]
		}
		raw, _ := json.Marshal(s)
		return raw
	}
	tests := []struct {
		name string
		spec json.RawMessage
		gpus int
	}{
		{name: "one GPU, one replica", spec: spec("gpu-h100x1-80gb", 1), gpus: 1},
		{name: "one GPU, up to four replicas", spec: spec("gpu-h100x1-80gb", 1, 4), gpus: 4},
		{name: "eight GPUs, three replicas above a lower maximum", spec: spec("gpu-h100x8-640gb", 3, 2), gpus: 24},
		{name: "eight GPUs of another vendor, two replicas up to five", spec: spec("gpu-mi300x8-1536gb", 2, 5), gpus: 40},
	}
	m := manifest(t, "do.inference.dedicated")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.NoError(t, m.Validate(tt.spec))
			b, err := m.Booking(tt.spec)
			require.NoError(t, err)
			require.Equal(t, cloudresources.Booking{Quota: "gpu", Amount: tt.gpus}, b)
		})
	}
	// The replica counts update in place, so a resize is a booking change,
	// not a replacement.
	require.Empty(t, m.ReplaceRequired(spec("gpu-h100x1-80gb", 1, 2), spec("gpu-h100x8-640gb", 2, 4)))
	require.Equal(t, []string{"spec.region"}, m.ReplaceRequired(spec("gpu-h100x1-80gb", 1), json.RawMessage(`{"region":"nyc2","model_slug":"m","model_provider":"hugging_face","accelerator_slug":"gpu-h100x1-80gb","replicas":1}`)))
}

func TestOnlyInferenceBooks(t *testing.T) {
	for _, m := range Kinds().All() {
		b, err := m.Booking(json.RawMessage(`{}`))
		if m.Kind == "do.inference.dedicated" {
			require.Error(t, err, "a spec without an accelerator books no known amount")
			continue
		}
		require.NoError(t, err)
		require.Zero(t, b, m.Kind)
	}
}

func TestProviderNames(t *testing.T) {
	const id = "crs_0123456789abcdefghjkmnpqrstvwxyz"
	tests := []struct {
		kind, spec, want string
	}{
		{kind: "do.database.pg", spec: `{"region":"fra1","size":"db-s-1vcpu-1gb"}`, want: "bc-r-0123456789abcdefghjkmnpq"},
		{kind: "do.database.pg", spec: `{"region":"fra1","size":"db-s-1vcpu-1gb","name":"orders"}`, want: "orders"},
		{kind: "do.database.pg.user", spec: `{"name":"app_rw"}`, want: "app_rw"},
		{kind: "do.functions.namespace", spec: `{"region":"fra1"}`, want: "bc-r-0123456789abcdefghjkmnpq"},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, manifest(t, tt.kind).ProviderName(id, json.RawMessage(tt.spec)), tt.kind+" "+tt.spec)
	}
}

func TestUpdatableFieldsAreSpecFields(t *testing.T) {
	for _, m := range Kinds().All() {
		var schema struct {
			Properties map[string]json.RawMessage `json:"properties"`
		}
		require.NoError(t, json.Unmarshal(m.Spec, &schema))
		for _, f := range m.Updatable {
			require.Contains(t, schema.Properties, f, m.Kind)
		}
		require.False(t, slices.Contains(m.Updatable, "region"), "%s: a region change replaces", m.Kind)
	}
}

func TestKindReferences(t *testing.T) {
	const vpc = "5a4b3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c1d"
	tests := []struct {
		kind, spec             string
		accountWide, instances []string
		networks               []string
	}{
		{kind: KindCluster, spec: `{"region":"nyc3","size":"db-s-1vcpu-1gb","network":"net_01jabcdefghjkmnpqrstvwxyz0"}`, networks: []string{"net_01jabcdefghjkmnpqrstvwxyz0"}},
		{kind: KindCluster, spec: `{"region":"nyc3","size":"db-s-1vcpu-1gb","private_network_uuid":"` + vpc + `","project_id":"` + vpc + `"}`,
			accountWide: []string{"spec.private_network_uuid", "spec.project_id"}},
		{kind: KindReplica, spec: `{"region":"nyc3","size":"db-s-1vcpu-1gb","private_network_uuid":"` + vpc + `"}`, accountWide: []string{"spec.private_network_uuid"}},
		{kind: KindFirewall, spec: `{"rules":[{"type":"ip_addr","value":"192.0.2.1"},{"type":"droplet","value":"1"},{"type":"k8s","value":"c"},{"type":"tag","value":"t"},{"type":"app","value":"a"}],
			"instances":["inst_01jabcdefghjkmnpqrstvwxyz0"]}`,
			accountWide: []string{"spec.rules.1.type", "spec.rules.2.type", "spec.rules.3.type", "spec.rules.4.type"},
			instances:   []string{"inst_01jabcdefghjkmnpqrstvwxyz0"}},
		{kind: KindApp, spec: `{"region":"nyc","services":[
			{"name":"web","git":{"repo_clone_url":"https://example.invalid/r.git"}},
			{"name":"api","github":{"repo":"acme/api"}},
			{"name":"img","image":{"registry_type":"DOCKER_HUB","repository":"nginx"}},
			{"name":"own","image":{"registry_type":"DOCR","repository":"x"}}],
			"workers":[{"name":"w","gitlab":{"repo":"acme/w"}}],
			"databases":[{"name":"db","cluster_name":"shared-pg"},{"name":"dev","engine":"PG"}]}`,
			accountWide: []string{"spec.databases.0.cluster_name", "spec.services.1.github", "spec.services.3.image.registry_type", "spec.workers.0.gitlab"}},
		{kind: KindInference, spec: `{"region":"nyc2","vpc_uuid":"` + vpc + `"}`, accountWide: []string{"spec.vpc_uuid"}},
		{kind: KindNamespace, spec: `{"region":"nyc1"}`},
	}
	for _, tt := range tests {
		t.Run(tt.kind, func(t *testing.T) {
			m := manifest(t, tt.kind)
			spec := json.RawMessage(tt.spec)
			require.Equal(t, tt.accountWide, m.AccountWide(spec))
			require.Equal(t, tt.instances, m.Instances(spec))
			require.Equal(t, tt.networks, m.Networks(spec))
		})
	}
}
