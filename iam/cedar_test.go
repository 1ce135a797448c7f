package iam

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/cedar-policy/cedar-go/types"

	"github.com/better-compute/better-compute/core"
)

func TestCedarNumber(t *testing.T) {
	tests := []struct {
		in   any
		want int64
		ok   bool
	}{
		{8, 8, true},
		{int64(-3), -3, true},
		{uint8(7), 7, true},
		{float64(72), 72, true},
		{72.5, 73, true},
		{72.0001, 73, true},
		{-1.5, -1, true},
		{float32(2.5), 3, true},
		{json.Number("12"), 12, true},
		{json.Number("1.2"), 2, true},
		{uint64(math.MaxUint64), 0, false},
		{math.NaN(), 0, false},
		{math.Inf(1), 0, false},
		{1e300, 0, false},
		{"8", 0, false},
		{true, 0, false},
	}
	for _, tt := range tests {
		got, ok := cedarNumber(tt.in)
		if ok != tt.ok || (ok && int64(got) != tt.want) {
			t.Errorf("cedarNumber(%#v) = %d, %v; want %d, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestCedarDeclared(t *testing.T) {
	tests := []struct {
		typ  core.AttrType
		in   any
		want types.Value
	}{
		{core.AttrString, "H100", types.String("H100")},
		{core.AttrString, 5, nil},
		{core.AttrBoolean, true, types.True},
		{core.AttrBoolean, "true", nil},
		{core.AttrNumber, 8.2, types.Long(9)},
		{core.AttrNumber, "8", nil},
	}
	for _, tt := range tests {
		got, ok := cedarDeclared(tt.typ, tt.in)
		if ok != (tt.want != nil) || (ok && !got.Equal(tt.want)) {
			t.Errorf("cedarDeclared(%s, %#v) = %v, %v", tt.typ, tt.in, got, ok)
		}
	}
}

func TestCedarValue(t *testing.T) {
	v, err := cedarValue(map[string]any{"a": []any{1, "x", nil}, "b": map[string]int{"c": 2}, "d": nil})
	if err != nil {
		t.Fatal(err)
	}
	want := types.NewRecord(types.RecordMap{
		"a": types.NewSet(types.Long(1), types.String("x")),
		"b": types.NewRecord(types.RecordMap{"c": types.Long(2)}),
	})
	if !v.Equal(want) {
		t.Fatalf("cedarValue = %v, want %v", v, want)
	}
	for _, bad := range []any{struct{}{}, map[int]string{1: "a"}, []any{make(chan int)}} {
		if _, err := cedarValue(bad); err == nil {
			t.Errorf("cedarValue(%T) has no error", bad)
		}
	}
}

func TestCedarActionGroups(t *testing.T) {
	got := cedarActionGroups("compute:join-tokens:create")
	want := []string{"compute:*:create", "compute:join-tokens:*", "compute:*"}
	if len(got) != len(want) {
		t.Fatalf("groups = %v", got)
	}
	for i := range want {
		if string(got[i].ID) != want[i] || got[i].Type != CedarActionType {
			t.Fatalf("groups = %v, want %v", got, want)
		}
	}
	if g := cedarActionGroups("compute:acme-autoinstall:render"); string(g[1].ID) != "compute:acme-autoinstall:*" {
		t.Fatalf("plugin action groups = %v", g)
	}
	if g := cedarActionGroups("iam:users:read"); g != nil {
		t.Fatalf("a host action has compute groups: %v", g)
	}
	cat, err := core.DefaultCatalog()
	if err != nil {
		t.Fatal(err)
	}
	ents := cedarActionEntities(cat)
	if len(ents) != len(cat.Actions()) {
		t.Fatalf("%d action entities for %d actions", len(ents), len(cat.Actions()))
	}
	read := ents[types.NewEntityUID(CedarActionType, "compute:pools:read")]
	if !read.Parents.Contains(types.NewEntityUID(CedarActionType, "compute:*:read")) {
		t.Fatalf("compute:pools:read parents = %v", read.Parents)
	}
}

func TestParsePolicies(t *testing.T) {
	list, err := ParsePolicies("p", `permit (principal, action, resource); forbid (principal, action, resource) when { context.mfa == false };`)
	if err != nil || len(list) != 2 {
		t.Fatalf("%d, %v", len(list), err)
	}
	for _, bad := range []string{"", "permit", "permit (principal, action, resource) when { 1 + };", "allow (principal, action, resource);"} {
		if _, err := ParsePolicies("p", bad); embCode(err) != core.CodeInvalidInput || embField(err) != "cedar" {
			t.Errorf("ParsePolicies(%q) = %v", bad, err)
		}
	}
}

func TestCredentialToken(t *testing.T) {
	tests := []struct {
		cred Credential
		want string
	}{
		{Credential{Authorization: "Bearer abc"}, "abc"},
		{Credential{Authorization: "BEARER  abc "}, "abc"},
		{Credential{Authorization: "Bearer abc", Cookie: "def"}, "abc"},
		{Credential{Authorization: "Basic xyz", Cookie: "def"}, "def"},
		{Credential{Cookie: "a=1; bc_session=def; c=3"}, "def"},
		{Credential{Cookie: "a=1"}, ""},
		{Credential{Authorization: "Bearer"}, ""},
		{Credential{}, ""},
	}
	for _, tt := range tests {
		if got := credentialToken(tt.cred); got != tt.want {
			t.Errorf("credentialToken(%+v) = %q, want %q", tt.cred, got, tt.want)
		}
	}
}
