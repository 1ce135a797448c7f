package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/agent/firstboot"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/ramdisk/image"
	"github.com/better-compute/better-compute/agent/ramdisk/simboot"
	apimetal "github.com/better-compute/better-compute/api/metal"
	apisecrets "github.com/better-compute/better-compute/api/secrets"
	apiworkflows "github.com/better-compute/better-compute/api/workflows"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/deploy/devstack"
	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/drivers/machines/sim"
	"github.com/better-compute/better-compute/internal/testutil"
)

// workflow reads a node's provisioning workflow (its latest when id is "").
func (r *metalRig) workflow(nodeID, id string) apiworkflows.Workflow {
	r.t.Helper()
	w, err := apiworkflows.Get.Call(r.ctx, r.admin, apiworkflows.GetInput{TenantID: metalRoot, NodeID: nodeID, WorkflowID: id})
	if err != nil {
		r.t.Fatal(err)
	}
	return w
}

// stepOf is the workflow's step of that name.
func stepOf(w apiworkflows.Workflow, name string) apiworkflows.Step {
	i := slices.IndexFunc(w.Steps, func(s apiworkflows.Step) bool { return s.Name == name })
	if i < 0 {
		return apiworkflows.Step{}
	}
	return w.Steps[i]
}

// awaitWorkflow waits until the node's workflow satisfies done.
func (r *metalRig) awaitWorkflow(nodeID, id, what string, done func(apiworkflows.Workflow) bool) apiworkflows.Workflow {
	r.t.Helper()
	var w apiworkflows.Workflow
	testutil.Eventually(r.t, metalWait, what, func() bool {
		w = r.workflow(nodeID, id)
		return done(w)
	})
	return w
}

// logSteps writes each step's attempts and duration to the test's log.
func logSteps(t *testing.T, w apiworkflows.Workflow) {
	t.Helper()
	for _, s := range w.Steps {
		var ms int64
		if s.DurationMs != nil {
			ms = *s.DurationMs
		}
		t.Logf("  %-16s %-13s %-9s attempts %d, %d ms %s", s.Name, s.On, s.State, s.Attempts, ms, s.Error)
	}
}

// checkDeployed holds a deployed node to what a deploy promises: its
// workflow succeeded at every step, the machine's disk holds the image's
// bytes, and the installed system's agent re-joined and holds a session.
func (r *metalRig) checkDeployed(nodeID, diskPath string, boots int) {
	r.t.Helper()
	w := r.workflow(nodeID, "")
	if w.State != "succeeded" || w.Image == nil || w.Image.ID != r.image.ID {
		r.t.Fatalf("the deploy's workflow: %+v", w)
	}
	r.t.Logf("deploy workflow %s (%d boots so far):", w.ID, boots)
	logSteps(r.t, w)
	for _, s := range w.Steps {
		if s.State != "succeeded" {
			r.t.Fatalf("step %s is %s", s.Name, s.State)
		}
	}
	r.checkDisk(diskPath, nodeID, "")
	testutil.Eventually(r.t, qemuWait, "the deployed system's agent connected", func() bool {
		return r.get(nodeID).Connectivity == "connected"
	})
}

// checkDisk holds a deployed machine's disk file to the image and its
// seed: every byte of the image is there but the partition table's
// entries (the seed's partition was added to it), and the CIDATA seed
// holds the node's re-join config and, when userData is given, user data
// containing it.
func (r *metalRig) checkDisk(path, nodeID, userData string) {
	r.t.Helper()
	want, err := os.ReadFile(r.disk.Image)
	if err != nil {
		r.t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		r.t.Fatal(err)
	}
	got := make([]byte, len(want))
	_, err = io.ReadFull(f, got)
	f.Close()
	if err != nil {
		r.t.Fatal(err)
	}
	const entries, signature = 446, 510 // the MBR's partition entries
	if !bytes.Equal(got[:entries], want[:entries]) || !bytes.Equal(got[signature:], want[signature:]) {
		r.t.Fatalf("the disk %s does not hold the image's bytes", path)
	}
	seed, closeSeed, err := image.SeedFS(path)
	if err != nil {
		r.t.Fatalf("the disk's seed: %v", err)
	}
	defer closeSeed()
	s, err := firstboot.ReadSeed(seed)
	if err != nil || s.Join.NodeID != nodeID || !strings.HasPrefix(s.Join.Token, protocol.BootTokenPrefix) {
		r.t.Fatalf("the seed's re-join config: %+v %v", s.Join, err)
	}
	if userData != "" {
		ud, err := fs.ReadFile(seed, "user-data")
		if err != nil || !strings.Contains(string(ud), userData) {
			r.t.Fatalf("the seed's user-data %q: %v", ud, err)
		}
	}
}

// testDeploys are the provisioning workflow's cases on simulated machines:
// a tampered image, pause and resume, a failed step retried, an abort
// while the image is written.
func testDeploys(t *testing.T, r *metalRig) {
	ready := func(t *testing.T, rt *metalRig, name string, o simboot.Options) (string, *sim.Machine) {
		m, bmc := rt.simMachineWith(name, o)
		id := rt.enrollRedfish(name, bmc).Node.ID
		rt.run(apimetal.Manage, id, "enrolling", metalWait)
		rt.run(apimetal.Inspect, id, "enrolling", metalWait)
		rt.run(apimetal.Provide, id, "ready", metalWait)
		return id, m
	}
	deploy := func(t *testing.T, id, profile string) apimetal.Deployed {
		t.Helper()
		d, err := apimetal.Deploy.Call(r.ctx, r.admin, apimetal.DeployInput{TenantID: metalRoot, NodeID: id, ProfileID: profile})
		if err != nil {
			t.Fatalf("deploy: %v", err)
		}
		return d
	}

	// An image whose stored bytes no longer match its digest: the site's
	// staging refuses it before anything boots, for good.
	t.Run("TamperedImageRefusedAtDeploy", func(t *testing.T) {
		rt := *r
		rt.t = t
		file := filepath.Join(t.TempDir(), "tampered.img")
		if err := os.WriteFile(file, []byte(strings.Repeat("an image that will be tampered with\n", 4096)), 0o600); err != nil {
			t.Fatal(err)
		}
		im := rt.pushImage("e2e-tampered", file)
		blob := filepath.Join(rt.dir, devstack.BlobDir)
		var tampered int
		_ = filepath.WalkDir(blob, func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.Contains(p, im.SHA256) {
				tampered++
				return os.WriteFile(p, []byte(strings.Repeat("an image that WAS tampered with\n", 4608)), 0o600)
			}
			return nil
		})
		if tampered == 0 {
			t.Fatalf("no blob of %s under %s", im.SHA256, blob)
		}
		profile := rt.profile("e2e-tampered", `{"target": "metal", "image": {"name": "e2e-tampered", "version": "1"}}`)
		id, m := ready(t, &rt, "tampered-1", simboot.Options{})
		boots := len(m.Boots())
		d := deploy(t, id, profile)
		n := rt.await(id, "failed", metalWait)
		w := rt.workflow(id, d.WorkflowID)
		st := stepOf(w, "stage-image")
		if w.State != "failed" || st.State != "failed" || !strings.Contains(st.Error, "SHA-256") ||
			n.Metal.Lifecycle.LastError == nil || n.Metal.Lifecycle.LastError.Step != "stage-image" {
			t.Fatalf("a tampered image's deploy: %+v / %+v", w, n.Metal.Lifecycle.LastError)
		}
		if len(m.Boots()) != boots {
			t.Fatalf("the machine booted %d times for a tampered image", len(m.Boots())-boots)
		}
		logSteps(t, w)
	})

	// Pause stops before the next step and resume goes on; a step that
	// fails (the user data's secret is gone) fails the workflow at that
	// step, and workflows.retry, once the secret is back, runs it again in
	// the same workflow, which ends deployed.
	t.Run("PauseResumeFailRetry", func(t *testing.T) {
		rt := *r
		rt.t = t
		if _, err := apisecrets.Put.Call(r.ctx, r.admin, apisecrets.PutInput{TenantID: metalRoot, Name: "cloud-init",
			Value: "#cloud-config\nhostname: retried\n"}); err != nil {
			t.Fatal(err)
		}
		profile := rt.profile("e2e-secret", `{"target": "metal", "image": {"name": "e2e-disk", "version": "1"},
			"userData": "secret://root/cloud-init", "steps": [
			{"name": "check-image", "on": "control-plane", "action": "check-image"},
			{"name": "stage-image", "on": "site", "action": "stage-image"},
			{"name": "boot-ramdisk", "on": "site", "action": "boot-ramdisk"},
			{"name": "write-image", "on": "ramdisk", "action": "write-image"},
			{"name": "write-seed", "on": "ramdisk", "action": "write-seed", "retry": {"maxAttempts": 2, "backoffSeconds": 1}},
			{"name": "boot-from-disk", "on": "site", "action": "set-boot-device", "args": {"device": "disk"}},
			{"name": "reboot", "on": "ramdisk", "action": "reboot", "await": "rejoin"}]}`)
		id, m := ready(t, &rt, "retry-1", simboot.Options{})
		d := deploy(t, id, profile)
		ref := apiworkflows.WorkflowInput{TenantID: metalRoot, NodeID: id, WorkflowID: d.WorkflowID}
		if _, err := apiworkflows.Pause.Call(r.ctx, r.admin, ref); err != nil {
			t.Fatalf("pause: %v", err)
		}
		w := rt.awaitWorkflow(id, d.WorkflowID, "the workflow paused", func(w apiworkflows.Workflow) bool { return w.Paused })
		for _, s := range w.Steps[w.StepIndex:] {
			if s.State != "pending" {
				t.Fatalf("paused at %d, but step %s is %s", w.StepIndex, s.Name, s.State)
			}
		}
		t.Logf("paused before step %d (%s)", w.StepIndex, w.Steps[w.StepIndex].Name)
		// While it is paused the secret goes: the seed cannot be written.
		if _, err := apisecrets.Delete.Call(r.ctx, r.admin, apisecrets.DeleteInput{TenantID: metalRoot, Name: "cloud-init"}); err != nil {
			t.Fatal(err)
		}
		if _, err := apiworkflows.Resume.Call(r.ctx, r.admin, ref); err != nil {
			t.Fatalf("resume: %v", err)
		}
		n := rt.await(id, "failed", metalWait)
		w = rt.workflow(id, d.WorkflowID)
		seed := stepOf(w, "write-seed")
		if w.State != "failed" || seed.State != "failed" || seed.Attempts != 2 || !strings.Contains(seed.Error, "secret") ||
			n.Metal.Lifecycle.LastError == nil || n.Metal.Lifecycle.LastError.Step != "write-seed" {
			t.Fatalf("the failed workflow: %+v / %+v", seed, n.Metal.Lifecycle.LastError)
		}
		if st := stepOf(w, "write-image"); st.State != "succeeded" {
			t.Fatalf("write-image before the failure: %+v", st)
		}
		// The secret is back: retry runs write-seed and what follows.
		if _, err := apisecrets.Put.Call(r.ctx, r.admin, apisecrets.PutInput{TenantID: metalRoot, Name: "cloud-init",
			Value: "#cloud-config\nhostname: retried\n"}); err != nil {
			t.Fatal(err)
		}
		if _, err := apiworkflows.Retry.Call(r.ctx, r.admin, ref); err != nil {
			t.Fatalf("retry: %v", err)
		}
		rt.await(id, "deployed", metalWait)
		w = rt.workflow(id, d.WorkflowID)
		if w.State != "succeeded" || stepOf(w, "write-image").Attempts != 1 || stepOf(w, "write-seed").Attempts != 3 {
			t.Fatalf("the retried workflow: %+v", w)
		}
		logSteps(t, w)
		disk, err := m.Disk()
		if err != nil {
			t.Fatal(err)
		}
		rt.checkDisk(disk, id, "hostname: retried")
	})

	// metal.bulk deploys with a profile: each node's own workflow, pinned
	// to the version; without args.profileId it refuses before anything.
	t.Run("BulkDeploy", func(t *testing.T) {
		rt := *r
		rt.t = t
		a, _ := ready(t, &rt, "bulk-deploy-1", simboot.Options{})
		b, _ := ready(t, &rt, "bulk-deploy-2", simboot.Options{})
		in := apimetal.BulkInput{TenantID: metalRoot, PoolID: r.poolID, Operation: "deploy", NodeIDs: []string{a, b}, Concurrency: 2}
		if _, err := apimetal.Bulk.Call(r.ctx, r.admin, in); core.AsError(err).Code != core.CodeInvalidInput {
			t.Fatalf("a bulk deploy without a profile: %v", err)
		}
		in.Args = json.RawMessage(`{"profileId": "` + r.profileID + `"}`)
		res, err := apimetal.Bulk.Call(r.ctx, r.admin, in)
		if err != nil || len(res.Results) != 2 || !res.Results[0].Accepted || !res.Results[1].Accepted {
			t.Fatalf("bulk deploy: %+v %v", res, err)
		}
		seen := map[string]bool{}
		for _, id := range []string{a, b} {
			rt.await(id, "deployed", metalWait)
			w := rt.workflow(id, "")
			if w.State != "succeeded" || w.ProfileID != r.profileID || seen[w.ID] {
				t.Fatalf("node %s's workflow: %+v", id, w)
			}
			seen[w.ID] = true
		}
	})

	// An abort while the image is written stops the write, powers the
	// machine off and leaves the node failed (its disk is half written).
	t.Run("AbortDuringImageWrite", func(t *testing.T) {
		rt := *r
		rt.t = t
		id, m := ready(t, &rt, "abort-1", simboot.Options{DiskBytesPerSecond: 1 << 20})
		d := deploy(t, id, r.profileID)
		rt.awaitWorkflow(id, d.WorkflowID, "the image write running", func(w apiworkflows.Workflow) bool {
			return stepOf(w, "write-image").State == "running"
		})
		w, err := apiworkflows.Abort.Call(r.ctx, r.admin, apiworkflows.WorkflowInput{TenantID: metalRoot, NodeID: id, WorkflowID: d.WorkflowID})
		if err != nil {
			t.Fatalf("abort: %v", err)
		}
		n := rt.await(id, "failed", metalWait)
		w = rt.workflow(id, d.WorkflowID)
		if w.State != "aborted" || stepOf(w, "write-image").State != "aborted" || n.Metal.Lifecycle.LastError == nil ||
			n.Metal.Lifecycle.LastError.Reason != "aborted" || n.Metal.Lifecycle.LastError.Step != "write-image" {
			t.Fatalf("aborted during the write: %+v / %+v", w, n.Metal.Lifecycle.LastError)
		}
		testutil.Eventually(t, metalWait, "the aborted machine powered off", func() bool {
			p, _ := m.PowerState(r.ctx)
			return p == drivers.PowerOff
		})
		logSteps(t, w)
	})
}
