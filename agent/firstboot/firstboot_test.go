package firstboot_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/firstboot"
	"github.com/better-compute/better-compute/agent/firstboot/firstboottest"
	"github.com/better-compute/better-compute/agent/join"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	coreinv "github.com/better-compute/better-compute/core/inventory"
)

func machineInventory() *coreinv.NodeInventory {
	return &coreinv.NodeInventory{Kind: coreinv.Kind, Version: coreinv.Version, AgentVersion: "bcd/test",
		System: coreinv.System{ProductUUID: "0f5a1b2c-3d4e-4f60-8a7b-9c0d1e2f3a4b", SerialNumber: "FB-1", Architecture: "x86_64"},
		CPU:    coreinv.CPU{Sockets: 1, CoresPerSocket: 2, ThreadsPerCore: 1, LogicalCPUs: 2, NUMANodes: 1},
		Memory: coreinv.Memory{TotalBytes: 1 << 30},
		NICs:   []coreinv.NIC{{Name: "eth0", MAC: "52:54:00:fb:00:01"}},
		GPUs:   coreinv.GPUs{Devices: []coreinv.GPU{}}}
}

func writeSeedDir(t *testing.T, j protocol.SeedJoin, metaData string) string {
	t.Helper()
	dir := t.TempDir()
	raw, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(protocol.SeedJoinFile)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, protocol.SeedJoinFile), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if metaData != "" {
		if err := os.WriteFile(filepath.Join(dir, firstboot.MetaDataFile), []byte(metaData), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestReadSeed(t *testing.T) {
	j := protocol.SeedJoin{APIURL: "https://api.example", Token: protocol.BootTokenPrefix + "t1", NodeID: "node_a", AgentEndpoint: "https://agent.example"}
	s, err := firstboot.ReadSeed(os.DirFS(writeSeedDir(t, j, "instance-id: wf_1\nlocal-hostname: 'web-1'\nnested:\n  local-hostname: no\n")))
	if err != nil {
		t.Fatal(err)
	}
	if s.Join != j || s.Hostname != "web-1" {
		t.Errorf("seed %+v", s)
	}
	if s, err := firstboot.ReadSeed(os.DirFS(writeSeedDir(t, j, ""))); err != nil || s.Hostname != "" {
		t.Errorf("without meta-data: %+v, %v", s, err)
	}
	if _, err := firstboot.ReadSeed(os.DirFS(t.TempDir())); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an empty seed: %v, want not exist", err)
	}
	if _, err := firstboot.ReadSeed(os.DirFS(writeSeedDir(t, protocol.SeedJoin{APIURL: "https://api.example"}, ""))); err == nil {
		t.Error("a seed without a token was read")
	}
}

func TestRunJoinsWithTheSeedsTokenThenRunsTheSessionAgainstTheSeedsEndpoint(t *testing.T) {
	api := firstboottest.New(t, "node_fb1", "https://joined.example:8444")
	api.FailNext(2, http.StatusServiceUnavailable, `{"error":{"code":"UNAVAILABLE","message":"restarting"}}`)
	srv := httptest.NewServer(api)
	defer srv.Close()
	seed := firstboot.Seed{Hostname: "web-1", Join: protocol.SeedJoin{APIURL: srv.URL, Token: protocol.BootTokenPrefix + "deploy",
		NodeID: "node_fb1", AgentEndpoint: "https://10.0.2.2:8444"}}
	state := filepath.Join(t.TempDir(), "state")
	var sessions []join.Identity
	o := firstboot.Options{Seed: seed, StateDir: state, RetryMin: time.Millisecond,
		Inventory: func(context.Context) (*coreinv.NodeInventory, error) { return machineInventory(), nil },
		Session: func(_ context.Context, id join.Identity) error {
			sessions = append(sessions, id)
			return nil
		}}
	if err := firstboot.Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	reqs := api.Requests()
	if len(reqs) != 3 {
		t.Fatalf("%d join requests, want two refused by 503 and one that joined", len(reqs))
	}
	last := reqs[2]
	if last.Token != seed.Join.Token || last.Name != "web-1" {
		t.Errorf("join with token %q name %q", last.Token, last.Name)
	}
	var inv coreinv.NodeInventory
	if err := json.Unmarshal(last.Inventory, &inv); err != nil || inv.System.ProductUUID != machineInventory().System.ProductUUID {
		t.Errorf("join inventory %s: %v", last.Inventory, err)
	}
	if len(sessions) != 1 || sessions[0].NodeID != "node_fb1" || sessions[0].AgentEndpoint != seed.Join.AgentEndpoint {
		t.Fatalf("sessions %+v, want one as node_fb1 against the seed's endpoint", sessions)
	}
	if _, err := join.LoadIdentity(state); err != nil {
		t.Errorf("identity not kept: %v", err)
	}

	// A restarted agent finds the identity and spends no token.
	seed.Join.AgentEndpoint = ""
	o.Seed = seed
	if err := firstboot.Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	if n := len(api.Requests()); n != 3 {
		t.Errorf("the restart sent %d more joins", n-3)
	}
	if len(sessions) != 2 || sessions[1].AgentEndpoint != "https://joined.example:8444" {
		t.Errorf("without the seed's endpoint the session went to %q, want the join's", sessions[1].AgentEndpoint)
	}
}

func TestRunStopsOnARefusedToken(t *testing.T) {
	api := firstboottest.New(t, "node_fb1", "")
	api.FailNext(5, http.StatusForbidden, `{"error":{"code":"ACCESS_DENIED","message":"token spent"}}`)
	srv := httptest.NewServer(api)
	defer srv.Close()
	ran := false
	err := firstboot.Run(context.Background(), firstboot.Options{
		Seed:     firstboot.Seed{Join: protocol.SeedJoin{APIURL: srv.URL, Token: protocol.BootTokenPrefix + "spent"}},
		StateDir: t.TempDir(), RetryMin: time.Millisecond,
		Inventory: func(context.Context) (*coreinv.NodeInventory, error) { return machineInventory(), nil },
		Session:   func(context.Context, join.Identity) error { ran = true; return nil },
	})
	var ce *core.Error
	if !errors.As(err, &ce) || ce.Code != core.CodeAccessDenied {
		t.Fatalf("err %v, want ACCESS_DENIED", err)
	}
	if n := len(api.Requests()); n != 1 || ran {
		t.Errorf("%d joins and session %v after a refusal, want one and none", n, ran)
	}
}

func TestRunRefusesAnIdentityOfAnotherNode(t *testing.T) {
	api := firstboottest.New(t, "node_fb1", "")
	srv := httptest.NewServer(api)
	defer srv.Close()
	err := firstboot.Run(context.Background(), firstboot.Options{
		Seed:      firstboot.Seed{Join: protocol.SeedJoin{APIURL: srv.URL, Token: protocol.BootTokenPrefix + "x", NodeID: "node_other"}},
		StateDir:  t.TempDir(),
		Inventory: func(context.Context) (*coreinv.NodeInventory, error) { return machineInventory(), nil },
		Session:   func(context.Context, join.Identity) error { t.Error("a session ran"); return nil },
	})
	if err == nil {
		t.Fatal("joined as node_fb1 for node_other's seed without an error")
	}
}
