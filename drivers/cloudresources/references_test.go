package cloudresources

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// referring is a kind whose spec names objects outside it, through a $ref
// and an allOf as DigitalOcean's app manifest does.
const referring = `{"kind":"x.ref","family":"data","description":"d","regional":false,"preview":false,"releasable":true,
	"references":{
		"accountWide":[{"path":"vpc"},{"path":"rules.*.type","except":["ip_addr"]},{"path":"parts.*.repo"}],
		"instances":[{"path":"instances.*"}],
		"networks":[{"path":"network"}]},
	"spec":{"type":"object","additionalProperties":false,
		"properties":{
			"vpc":{"type":"string"},"network":{"type":"string"},
			"instances":{"type":"array","items":{"type":"string"}},
			"rules":{"type":"array","items":{"type":"object","properties":{"type":{"type":"string"},"value":{"type":"string"}}}},
			"parts":{"type":"array","items":{"$ref":"#/$defs/part"}}},
		"$defs":{"part":{"allOf":[{"$ref":"#/$defs/source"}],"unevaluatedProperties":false},
			"source":{"type":"object","properties":{"repo":{"type":"object"},"name":{"type":"string"}}}}},
	"updatable":[],"outputs":[],"secretOutputs":[],"meters":[]}`

func TestReferences(t *testing.T) {
	set, err := LoadKinds(files("x.ref.json", referring))
	require.NoError(t, err)
	m, _ := set.Lookup("x.ref")
	tests := []struct {
		name                         string
		spec                         string
		accountWide, instances, nets []string
	}{
		{name: "none", spec: `{}`},
		{name: "not an object", spec: `[1]`},
		{name: "ip rules only", spec: `{"rules":[{"type":"ip_addr","value":"10.0.0.1"}]}`},
		{
			name:        "account-wide fields with their indices",
			spec:        `{"vpc":"u","rules":[{"type":"ip_addr","value":"a"},{"type":"droplet","value":"1"},{"type":"tag","value":"t"}],"parts":[{"name":"a"},{"name":"b","repo":{}}]}`,
			accountWide: []string{"spec.parts.1.repo", "spec.rules.1.type", "spec.rules.2.type", "spec.vpc"},
		},
		{name: "null is absent", spec: `{"vpc":null}`},
		{
			name:      "instances and networks, deduplicated and sorted",
			spec:      `{"instances":["inst_b","inst_a","inst_b",""],"network":"net_x"}`,
			instances: []string{"inst_a", "inst_b"}, nets: []string{"net_x"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := json.RawMessage(tt.spec)
			require.Equal(t, tt.accountWide, m.AccountWide(spec))
			require.Equal(t, tt.instances, m.Instances(spec))
			require.Equal(t, tt.nets, m.Networks(spec))
		})
	}
}

func TestReferencesMustBeSpecPaths(t *testing.T) {
	tests := []struct{ name, old, new string }{
		{"unknown property", `{"path":"vpc"}`, `{"path":"vpcs"}`},
		{"a star on an object", `{"path":"vpc"}`, `{"path":"vpc.*"}`},
		{"below a string", `{"path":"network"}`, `{"path":"network.id"}`},
		{"unknown inside a $ref", `{"path":"parts.*.repo"}`, `{"path":"parts.*.branch"}`},
		{"empty", `{"path":"instances.*"}`, `{"path":""}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadKinds(files("x.ref.json", edit(t, referring, tt.old, tt.new)))
			require.ErrorContains(t, err, "references.")
		})
	}
}
