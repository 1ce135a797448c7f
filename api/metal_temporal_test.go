package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/internal/testenv"

	"go.temporal.io/sdk/worker"

	metalact "github.com/better-compute/better-compute/activities/metal"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/agentgateway"
	"github.com/better-compute/better-compute/api/metal"
	"github.com/better-compute/better-compute/api/rpc"
	coremetal "github.com/better-compute/better-compute/core/metal"
	"github.com/better-compute/better-compute/internal/testutil"
	sitewf "github.com/better-compute/better-compute/workflows/metal"
	"github.com/better-compute/better-compute/workflows/metal/lifecycle"
	"github.com/better-compute/better-compute/workflows/sites"
)

// httpSite is a site agent's activities as a test drives them: its BMC is
// an in-memory power switch, and booting the ramdisk goes through the real
// gateway, as `bcd site` and the ramdisk do: the boot token is minted with
// the site's token and lease epoch, and the "ramdisk" reports the
// inventory with it over HTTP (unless hold is set: then it never reports).
type httpSite struct {
	t             *testing.T
	url           string
	token         string
	epoch         int64
	inventory     []byte
	mu            sync.Mutex
	power         map[string]string
	hold          bool
	bootedRamdisk chan string
}

func (s *httpSite) setPower(node, p string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.power[node] = p
}

func (s *httpSite) powerOf(node string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.power[node]; ok {
		return p
	}
	return "off"
}

func (s *httpSite) VerifyBMC(_ context.Context, m sitewf.MachineRef) (sitewf.BMCStatus, error) {
	// The credentials come from the gateway, as the site agent gets them.
	status, body, _ := postAgentH(s.t, s.url, protocol.SiteBMCCredentialsPath,
		fmt.Sprintf(`{"token":%q,"epoch":%d,"nodeId":%q}`, s.token, s.epoch, m.NodeID))
	if status != 200 || !strings.Contains(body, bmcPassword) {
		return sitewf.BMCStatus{}, fmt.Errorf("credentials: %d", status)
	}
	return sitewf.BMCStatus{Driver: "redfish/v1", Power: s.powerOf(m.NodeID)}, nil
}

func (s *httpSite) Power(_ context.Context, r sitewf.PowerRequest) (sitewf.PowerResult, error) {
	switch r.Action {
	case "on", "cycle", "reset":
		s.setPower(r.Machine.NodeID, "on")
	case "off":
		s.setPower(r.Machine.NodeID, "off")
	}
	return sitewf.PowerResult{Power: s.powerOf(r.Machine.NodeID), Driver: "redfish/v1"}, nil
}

func (s *httpSite) InspectOOB(context.Context, sitewf.MachineRef) (sitewf.InspectOOBResult, error) {
	return sitewf.InspectOOBResult{Supported: false}, nil
}

func (s *httpSite) BootRamdisk(_ context.Context, r sitewf.BootRequest) (sitewf.BootResult, error) {
	s.setPower(r.Machine.NodeID, "on")
	status, body, _ := postAgentH(s.t, s.url, protocol.SiteBootTokenPath,
		fmt.Sprintf(`{"token":%q,"epoch":%d,"bootId":%q}`, s.token, s.epoch, r.BootID))
	var tok protocol.SiteBootTokenResult
	if status == 409 && strings.Contains(body, "tokenMinted") {
		return sitewf.BootResult{Via: "virtual-media", Power: "on"}, nil // a retried boot: the ramdisk has its token
	}
	if err := json.Unmarshal([]byte(body), &tok); status != 200 || err != nil {
		return sitewf.BootResult{}, fmt.Errorf("boot token: %d %s", status, body)
	}
	s.bootedRamdisk <- r.BootID
	s.mu.Lock()
	hold := s.hold
	s.mu.Unlock()
	if !hold {
		go func() {
			postAgentH(s.t, s.url, protocol.RamdiskReportPath, `{"token":"`+tok.Token+`","inventory":`+string(s.inventory)+`}`)
		}()
	}
	return sitewf.BootResult{Via: "virtual-media", Power: "on"}, nil
}

func (s *httpSite) EndBoot(_ context.Context, r sitewf.EndBootRequest) error {
	if r.PowerOff {
		s.setPower(r.Machine.NodeID, "off")
	}
	return nil
}

func (s *httpSite) ResetBIOS(context.Context, sitewf.MachineRef) (sitewf.ResetBIOSResult, error) {
	return sitewf.ResetBIOSResult{}, nil
}

func (s *httpSite) ConsoleLog(context.Context, sitewf.ConsoleLogRequest) ([]byte, error) {
	return nil, nil
}

// TestMetalMethodsDriveTheWorkflow runs the metal methods against a real
// Temporal with the lifecycle workflows over the database: manage ends by
// itself (the site's activity fetched the credentials from the gateway),
// power answers the power read back, inspect ingests the inventory its
// ramdisk reported through the gateway, and abort stops an inspect that
// waits for a ramdisk.
func TestMetalMethodsDriveTheWorkflow(t *testing.T) {
	ctx := context.Background()
	m := newMetalEnv(t)
	tc, temporalAddr := startTemporal(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	const queue = "control-plane"
	gw, err := agentgateway.New(agentgateway.Deps{Store: m.store, Catalog: m.catalog, Logger: quiet, Secrets: m.vault, Temporal: tc,
		TemporalAddress: temporalAddr, TemporalNamespace: "default", SiteLease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Deps{Store: m.store, IAM: m.outer, Catalog: m.catalog, Routes: gw, Logger: quiet, Secrets: m.vault,
		Temporal: tc, TaskQueue: queue, Metal: rpc.MetalConfig{PowerWait: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	m.server, m.url = srv, hs.URL

	site := &httpSite{t: t, url: m.url, token: m.token, epoch: m.siteHolder(m.token, "agent-a"), power: map[string]string{},
		inventory: mustJSON(t, machine(t, "00000000b001")), bootedRamdisk: make(chan string, 8)}
	cp := worker.New(tc, queue, worker.Options{})
	lifecycle.Register(cp, &metalact.Metal{Store: metalact.NewDBStore(m.store, m.catalog), Temporal: tc, TaskQueue: queue})
	sw := worker.New(tc, sites.SiteTaskQueue(m.site.ID), worker.Options{})
	sitewf.RegisterAgent(sw, site)
	for _, w := range []worker.Worker{cp, sw} {
		if err := w.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Stop)
	}

	c := m.client(m.boot.UserToken)
	n := m.enroll("m1", "https://10.0.0.1")
	node := metal.NodeInput{TenantID: "acme", NodeID: n.Node.ID}
	settled := func(want string) metal.MetalNode {
		t.Helper()
		var got metal.MetalNode
		testutil.Eventually(t, 30*time.Second, "the node settles in "+want, func() bool {
			got = m.get(n.Node.ID)
			return got.Lifecycle.Operation == "" && got.Lifecycle.State == want
		})
		return got
	}

	started, err := metal.Manage.Call(ctx, c, node)
	if err != nil || !started.Lifecycle.WorkflowStarted {
		t.Fatalf("manage: %+v %v", started.Lifecycle, err)
	}
	if got := settled("enrolling"); !got.Lifecycle.Managed {
		t.Fatalf("managed: %+v", got.Lifecycle)
	}

	// Power waits for the read-back.
	p, err := metal.Power.Call(ctx, c, metal.PowerInput{TenantID: "acme", NodeID: n.Node.ID, Action: metal.PowerOn})
	if err != nil || p.Lifecycle.Operation != "" || p.Lifecycle.Power != "on" || site.powerOf(n.Node.ID) != "on" {
		t.Fatalf("power on: %+v %v", p.Lifecycle, err)
	}

	// Inspect: the ramdisk reports through the gateway, the workflow
	// ingests the inventory.
	booted := func() {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, "the ramdisk boots", func() bool { return len(site.bootedRamdisk) > 0 })
		<-site.bootedRamdisk
	}
	if _, err := metal.Inspect.Call(ctx, c, node); err != nil {
		t.Fatal(err)
	}
	booted()
	got := settled("enrolling")
	if !got.Lifecycle.Inspected || got.Node.HardwareKey == "" || got.Node.Devices == 0 {
		t.Fatalf("inspected: %+v key %q devices %d", got.Lifecycle, got.Node.HardwareKey, got.Node.Devices)
	}

	// Abort an inspect waiting for a ramdisk that never reports.
	site.mu.Lock()
	site.hold = true
	site.mu.Unlock()
	if _, err := metal.Inspect.Call(ctx, c, node); err != nil {
		t.Fatal(err)
	}
	booted()
	testutil.Eventually(t, 30*time.Second, "inspect waits for its ramdisk", func() bool {
		return m.get(n.Node.ID).Lifecycle.Step == coremetal.StepAwaitRamdisk
	})
	ab, err := metal.Abort.Call(ctx, c, node)
	if err != nil {
		t.Fatal(err)
	}
	if ab.Lifecycle.State != "failed" || ab.Lifecycle.LastError == nil || ab.Lifecycle.LastError.Reason != coremetal.ReasonAborted {
		t.Fatalf("aborted: %+v %+v", ab.Lifecycle, ab.Lifecycle.LastError)
	}
	if strings.Contains(testenv.DumpTables(t, m.store), bmcPassword) {
		t.Error("a table holds the BMC password in clear")
	}
}
