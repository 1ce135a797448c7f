package main

import (
	"os/exec"
	"strings"
	"testing"
)

// bcd runs on every machine of the fleet and talks only to the API (and,
// as `bcd site`, to Temporal's frontend): it must not link the database
// driver, the Temporal server, or the control plane's store.
func TestBcdLinksNoControlPlane(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	forbidden := []string{
		"github.com/jackc/pgx",
		"go.temporal.io/server",
		"github.com/better-compute/better-compute/store",
		"github.com/better-compute/better-compute/activities",
		"github.com/better-compute/better-compute/api",
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if pkg == f || strings.HasPrefix(pkg, f+"/") {
				t.Errorf("bcd links %s", pkg)
			}
		}
	}
}
