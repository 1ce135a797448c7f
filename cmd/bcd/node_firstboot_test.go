package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/better-compute/better-compute/agent/firstboot/firstboottest"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	coreinv "github.com/better-compute/better-compute/core/inventory"
)

// `bcd node firstboot` reads the seed directory, joins with its token and
// this machine's inventory (no GPUs with --no-gpus), and stops on a
// refused token.
func TestNodeFirstbootJoinsWithTheSeedsTokenAndStopsWhenRefused(t *testing.T) {
	api := firstboottest.New(t, "node_x", "")
	api.FailNext(1, http.StatusForbidden, `{"error":{"code":"ACCESS_DENIED","message":"spent"}}`)
	srv := httptest.NewServer(api)
	defer srv.Close()
	seed := t.TempDir()
	raw, _ := json.Marshal(protocol.SeedJoin{APIURL: srv.URL, Token: protocol.BootTokenPrefix + "cli", NodeID: "node_x"})
	if err := os.MkdirAll(filepath.Join(seed, "bcd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(seed, protocol.SeedJoinFile), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := nodeFirstbootCommand()
	cmd.SetArgs([]string{"--seed", seed, "--state-dir", filepath.Join(t.TempDir(), "state"), "--no-gpus"})
	cmd.SetContext(context.Background())
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.Execute()
	var ce *core.Error
	if !errors.As(err, &ce) || ce.Code != core.CodeAccessDenied {
		t.Fatalf("err %v, want the API's ACCESS_DENIED", err)
	}
	reqs := api.Requests()
	if len(reqs) != 1 || reqs[0].Token != protocol.BootTokenPrefix+"cli" {
		t.Fatalf("joins %+v", reqs)
	}
	var inv coreinv.NodeInventory
	if err := json.Unmarshal(reqs[0].Inventory, &inv); err != nil || inv.GPUs.Devices == nil || len(inv.GPUs.Devices) != 0 {
		t.Errorf("inventory GPUs %+v (%v), want none", inv.GPUs, err)
	}

	cmd = nodeFirstbootCommand()
	cmd.SetArgs([]string{"--seed", t.TempDir(), "--state-dir", t.TempDir()})
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	if err := cmd.Execute(); err == nil {
		t.Error("an empty seed directory was accepted")
	}
}
