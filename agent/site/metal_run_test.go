package site

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	dtemporal "github.com/better-compute/better-compute/deploy/temporal"
	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/workers/temporalclient"
	"github.com/better-compute/better-compute/workflows/metal"
)

const runNamespace = "better-compute"

// bootThenPower is a workflow of the control plane's kind: it calls the
// site activities by name on the site's queue, once each.
func bootThenPower(ctx workflow.Context, queue string, req metal.BootRequest) (metal.BootResult, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{TaskQueue: queue, StartToCloseTimeout: time.Minute,
		HeartbeatTimeout: 30 * time.Second, RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 1}})
	var res metal.BootResult
	if err := workflow.ExecuteActivity(ctx, metal.ActivityBootRamdisk, req).Get(ctx, &res); err != nil {
		return res, err
	}
	var pr metal.PowerResult
	if err := workflow.ExecuteActivity(ctx, metal.ActivityPower, metal.PowerRequest{Machine: req.Machine, Action: "off"}).Get(ctx, &pr); err != nil {
		return res, err
	}
	res.Power = pr.Power
	return res, nil
}

// `bcd site` serves the metal activities on the site's queue while it holds
// the lease, with its boot server; a BMC's refusal reaches the workflow
// with its type; once the lease is lost the boot server stops answering.
func TestRunServesMetal(t *testing.T) {
	requireISOTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := newRig(t)
	ts, err := dtemporal.Start(ctx, dtemporal.Options{Namespaces: []string{runNamespace}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ts.Stop)
	r.api.temporal = protocol.SiteTemporal{Address: ts.FrontendAddr(), Namespace: runNamespace}
	apiSrv := httptest.NewServer(r.api)
	defer apiSrv.Close()

	tc, err := temporalclient.Dial(ctx, temporalclient.Config{Address: ts.FrontendAddr(), Namespace: runNamespace}, r.acts.t.a.log)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	w := worker.New(tc, "metal-test", worker.Options{})
	w.RegisterWorkflow(bootThenPower)
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	states := make(chan State, 8)
	actx, acancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- Run(actx, Options{APIURL: apiSrv.URL, Token: testSiteToken, Holder: "agent-m", Logger: r.acts.t.a.log,
			RetryMin: 100 * time.Millisecond, RetryMax: 200 * time.Millisecond, BMC: r.bmc,
			Boot:    BootOptions{Listen: "127.0.0.1:0", MachineAPIURL: machineAPIURL, Images: r.boot.images, Dir: t.TempDir()},
			OnState: func(s State) { states <- s }})
	}()
	defer func() {
		acancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	}()
	st := <-states
	if !st.Serving || st.Epoch != 7 || st.BootURL == "" {
		t.Fatalf("state = %+v, want serving at epoch 7 with a boot server", st)
	}

	queue := protocol.SiteTaskQueue("site_1")
	req := metal.BootRequest{Machine: rfRef(), BootID: "boot_vm", Purpose: "inspect"}
	run, err := tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: core.NewID("wf"), TaskQueue: "metal-test"}, bootThenPower, queue, req)
	if err != nil {
		t.Fatal(err)
	}
	var res metal.BootResult
	if err := run.Get(ctx, &res); err != nil {
		t.Fatalf("workflow: %v", err)
	}
	if res.Via != ViaVirtualMedia || res.Power != "off" || r.bmc.media != st.BootURL+"/boot/boot_vm/ramdisk.iso" {
		t.Fatalf("result %+v, media %q; want virtual media from %s", res, r.bmc.media, st.BootURL)
	}
	if code, _, _ := get(t, r.bmc.media); code != http.StatusOK {
		t.Fatalf("GET the boot's ISO from the agent's boot server = %d", code)
	}

	// The BMC refuses the credentials: the workflow sees BMCAuth, final.
	r.bmc.fail["SetPower:off"] = fmt.Errorf("HTTP 401: %w", drivers.ErrAuth)
	run, err = tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: core.NewID("wf"), TaskQueue: "metal-test"}, bootThenPower, queue, req)
	if err != nil {
		t.Fatal(err)
	}
	err = run.Get(ctx, &res)
	var ae *temporal.ApplicationError
	if !errors.As(err, &ae) || ae.Type() != metal.ErrTypeBMCAuth || !ae.NonRetryable() {
		t.Fatalf("workflow error = %v, want a non-retryable %s", err, metal.ErrTypeBMCAuth)
	}

	// Another agent takes the lease: this one stops serving at its next
	// renewal, and its boot server with it.
	r.api.taken.Store(true)
	r.api.epoch.Store(8)
	if st := <-states; st.Serving {
		t.Fatalf("state = %+v, want stopped", st)
	}
	if code, _, _ := get(t, st.BootURL+"/boot/boot_vm/ramdisk.iso"); code != http.StatusNotFound {
		t.Fatalf("GET the ISO after the lease was lost = %d, want 404", code)
	}
	if code, _, _ := get(t, st.BootURL+"/boot/mac/52:54:00:00:00:01/boot.json"); code != http.StatusServiceUnavailable {
		t.Fatalf("GET by MAC after the lease was lost = %d, want 503", code)
	}
}
