package main

import (
	"slices"
	"strings"
	"testing"
)

// TestFixtureModule runs the real rules over testdata/fixture, a module
// laid out like ours with one forbidden import of each kind: every one is
// caught, with the chain that causes it, and nothing allowed is.
func TestFixtureModule(t *testing.T) {
	t.Setenv("GOWORK", "off")
	pkgs, err := goList("testdata/fixture", []string{"./..."})
	if err != nil {
		t.Fatal(err)
	}
	violations, err := Check(pkgs, rules)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]string, len(violations))
	for i, v := range violations {
		got[i] = v.String()
	}
	slices.Sort(got)
	want := []string{
		"bcd talks to the API only: cmd/bcd -> agent -> workers -> store",
		"core is the bottom layer: core/bad -> store",
		"deploy is for wiring and the test harness: api/bad -> deploy/postgres",
		"iam builds on core and store: iam/bad -> api",
		"test helpers stay in tests: activities -> internal/testutil",
		"the HTTP layer does not run workers: api -> workers",
		"the control plane's wiring is imported by wiring only: api/bad -> internal/controlplane",
		"workflows stay deterministic: workflows/bad -> store",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("violations:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestClosureReachesExternalModules checks a closure rule against a
// module outside ours, through a package of ours, as `go list -deps`
// reports them.
func TestClosureReachesExternalModules(t *testing.T) {
	mod := &struct{ Path string }{"example.com/m"}
	pkgs := []Package{
		{ImportPath: "fmt"},
		{ImportPath: "github.com/jackc/pgx/v5/pgconn"},
		{ImportPath: "github.com/jackc/pgx/v5", Imports: []string{"fmt", "github.com/jackc/pgx/v5/pgconn"}},
		{ImportPath: "example.com/m/agent/site", Imports: []string{"fmt", "github.com/jackc/pgx/v5"}, Module: mod},
		{ImportPath: "example.com/m/cmd/bcd", Imports: []string{"example.com/m/agent/site"}, Module: mod},
		{ImportPath: "example.com/m/cmd/other", Imports: []string{"github.com/jackc/pgx/v5"}, Module: mod},
	}
	rule := Rule{Name: "no pgx", Scope: []string{"cmd/bcd"}, Closure: true, Never: []string{"github.com/jackc/pgx/..."}}
	violations, err := Check(pkgs, []Rule{rule})
	if err != nil {
		t.Fatal(err)
	}
	if len(violations) != 1 || violations[0].String() != "no pgx: cmd/bcd -> agent/site -> github.com/jackc/pgx/v5" {
		t.Fatalf("violations = %v; want only bcd's path to pgx, stopping at the first forbidden package", violations)
	}
}

func TestPatterns(t *testing.T) {
	m := matcher{module: "example.com/m"}
	for _, tc := range []struct {
		pattern, path string
		want          bool
	}{
		{"core/...", "example.com/m/core", true},
		{"core/...", "example.com/m/core/gpu", true},
		{"core/...", "example.com/m/corex", false},
		{"cmd/bcd", "example.com/m/cmd/bcd", true},
		{"cmd/bcd", "example.com/m/cmd/bcd/sub", false},
		{"...", "example.com/m/anything/below", true},
		{"...", "example.com/other", false},
		{"go.temporal.io/server/...", "go.temporal.io/server/common", true},
		{"go.temporal.io/server/...", "go.temporal.io/sdk/client", false},
	} {
		if got := m.match(tc.pattern, tc.path); got != tc.want {
			t.Errorf("match(%q, %q) = %v, want %v", tc.pattern, tc.path, got, tc.want)
		}
	}
}

func TestRulesAreNamedOnce(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range rules {
		if r.Name == "" || seen[r.Name] || len(r.Scope) == 0 || len(r.Only)+len(r.Never) == 0 {
			t.Errorf("rule %+v: each rule needs a unique name, a scope and something it forbids", r)
		}
		seen[r.Name] = true
	}
}
