// Command importcheck fails when an import runs against the direction the
// packages' layers allow. `make lint` runs it over the module:
//
//	go run ./tools/importcheck [-C dir] [packages]   # default ./...
//
// It reads `go list -deps -json` (production code only: a package's tests
// may import what its code may not, e.g. internal/testenv), checks every
// package of the module against the rules below, prints each violation
// with the import path that causes it, and exits 1 if there is any.
//
// The rules, as the rules table says them (patterns are relative to the
// module, `x/...` is x and everything under it; an external module is
// named in full):
//
//   - core/... imports nothing of ours but core/...;
//   - agent/protocol and agent/nodespec (what bcd and the server both
//     speak) import only core/... and each other;
//   - store/... imports only core/..., store/..., migrations/... and the
//     agent protocol's types;
//   - iam/... imports only core/..., store/... and iam/...;
//   - workflows/... imports only core/..., workflows/..., activities/...
//     (whose methods workflows name by value, and whose domain contracts,
//     names and parameters, both sides share) and the agent protocol's
//     types (a ramdisk step the workflow hands a machine): workflow code is
//     replayed and never calls the database itself;
//   - only cmd/..., tools/..., e2e/..., deploy/... and internal/testenv
//     (the test harness, which starts deploy/postgres's throwaway
//     clusters) import deploy/...;
//   - only go.temporal.io/server's wrapper, deploy/temporal, imports it;
//   - only wiring (cmd/..., tools/..., e2e/..., deploy/...) imports
//     internal/controlplane, which wires api, iam and store together;
//   - api/... never imports workers/...: the HTTP layer starts workflows
//     through their domain's contract (activities/<domain>), it does not
//     run them;
//   - cmd/bcd's whole dependency closure holds neither pgx, nor
//     go.temporal.io/server, nor store/...: the agent binary talks to the
//     API only;
//   - no production package imports internal/testutil or internal/testenv.
//
// Adding a rule is one line in rules.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

// all is every package of the module.
var all = []string{"..."}

// rules is the documented direction of imports; the package comment says
// each in words. Keep the two together.
var rules = []Rule{
	{Name: "core is the bottom layer", Scope: []string{"core/..."}, Only: []string{"core/..."}},
	{Name: "the agent protocol is pure", Scope: []string{"agent/protocol/...", "agent/nodespec/..."}, Only: []string{"core/...", "agent/protocol/...", "agent/nodespec/..."}},
	{Name: "store builds on core", Scope: []string{"store/..."}, Only: []string{"core/...", "store/...", "migrations/...", "agent/protocol/...", "agent/nodespec/..."}},
	{Name: "iam builds on core and store", Scope: []string{"iam/..."}, Only: []string{"core/...", "store/...", "iam/..."}},
	{Name: "workflows stay deterministic", Scope: []string{"workflows/..."}, Only: []string{"core/...", "workflows/...", "activities/...", "agent/protocol/..."}},
	{Name: "deploy is for wiring and the test harness", Scope: all, Except: []string{"cmd/...", "tools/...", "e2e/...", "deploy/...", "internal/testenv"}, Never: []string{"deploy/..."}},
	{Name: "the Temporal server stays behind deploy/temporal", Scope: all, Except: []string{"deploy/temporal/..."}, Never: []string{"go.temporal.io/server/..."}},
	{Name: "the control plane's wiring is imported by wiring only", Scope: all, Except: []string{"cmd/...", "tools/...", "e2e/...", "deploy/..."}, Never: []string{"internal/controlplane/..."}},
	{Name: "the HTTP layer does not run workers", Scope: []string{"api/..."}, Never: []string{"workers/..."}},
	{Name: "bcd talks to the API only", Scope: []string{"cmd/bcd"}, Closure: true, Never: []string{"github.com/jackc/pgx/...", "go.temporal.io/server/...", "store/..."}},
	{Name: "test helpers stay in tests", Scope: all, Except: []string{"internal/testutil/...", "internal/testenv/..."}, Never: []string{"internal/testutil/...", "internal/testenv/..."}},
}

func main() {
	dir := flag.String("C", "", "run go list in this directory (default: the current one)")
	flag.Parse()
	patterns := flag.Args()
	if len(patterns) == 0 {
		patterns = []string{"./..."}
	}
	pkgs, err := goList(*dir, patterns)
	if err != nil {
		fmt.Fprintln(os.Stderr, "importcheck:", err)
		os.Exit(2)
	}
	violations, err := Check(pkgs, rules)
	if err != nil {
		fmt.Fprintln(os.Stderr, "importcheck:", err)
		os.Exit(2)
	}
	for _, v := range violations {
		fmt.Println(v)
	}
	if len(violations) > 0 {
		fmt.Fprintf(os.Stderr, "importcheck: %d import(s) against the documented direction (rules: tools/importcheck/main.go)\n", len(violations))
		os.Exit(1)
	}
}

// goList runs `go list -deps -json` and decodes its stream of packages.
func goList(dir string, patterns []string) ([]Package, error) {
	cmd := exec.Command("go", append([]string{"list", "-deps", "-json=ImportPath,Imports,Module,DepOnly"}, patterns...)...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return decodePackages(bytes.NewReader(out))
}

func decodePackages(r io.Reader) ([]Package, error) {
	var pkgs []Package
	dec := json.NewDecoder(r)
	for {
		var p Package
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return pkgs, nil
		} else if err != nil {
			return nil, fmt.Errorf("decode go list output: %w", err)
		}
		pkgs = append(pkgs, p)
	}
}

// Package is the part of `go list -json` the check reads.
type Package struct {
	ImportPath string
	Imports    []string
	DepOnly    bool // listed only as a dependency of the packages asked for
	Module     *struct{ Path string }
}

// Rule governs the imports of the module's packages matching Scope, except
// those matching Except. Only, when set, lists the module's packages they
// may import (any other of ours is a violation); Never lists imports they
// must not have, ours or external. Closure applies Never to the whole
// dependency closure instead of the direct imports. Patterns without a
// dot in their first element are relative to the module.
type Rule struct {
	Name          string
	Scope, Except []string
	Only, Never   []string
	Closure       bool
}
