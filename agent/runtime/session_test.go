package runtime_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/join"
	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/runtime"
	"github.com/better-compute/better-compute/agent/session"
	"github.com/better-compute/better-compute/internal/testutil"
)

// TestSessionDrivesTheRuntime: the agent session applies a spec frame and
// hands it to the runtime (OnSpec); the runtime's reports go back up the
// same session (OnSession): a Full report, then the instance running. A
// runtime started later, with no session, converges on the spec the
// nodespec.Store kept.
func TestSessionDrivesTheRuntime(t *testing.T) {
	requireRunc(t)
	srv := newImageServer(t)
	image := buildTestImage(t)
	id := randID(t, "inst_")
	srv.serve(id, image, nil)
	in := containerInstance(id, 1, protocol.InstanceRunning, 1, 64, image)

	reports := make(chan protocol.Instances, 64)
	srv.handle(session.Path, func(w http.ResponseWriter, r *http.Request) {
		if !srv.fromNode(w, r) {
			return
		}
		enc := json.NewEncoder(w)
		flush := func(v any) {
			_ = enc.Encode(v)
			_ = http.NewResponseController(w).Flush()
		}
		w.WriteHeader(http.StatusOK)
		_ = http.NewResponseController(w).Flush()
		sc := bufio.NewScanner(r.Body)
		if !sc.Scan() { // hello
			return
		}
		flush(protocol.Welcome{Type: protocol.FrameWelcome, NodeID: srv.nodeID, Epoch: 1, HeartbeatSeconds: 10, LeaseSeconds: 30})
		flush(protocol.Spec{Type: protocol.FrameSpec, Generation: 1, Spec: nodespec.Spec{Instances: []nodespec.Instance{in}}})
		for sc.Scan() {
			f, err := protocol.DecodeAgentFrame(sc.Bytes())
			if rep, ok := f.(protocol.Instances); err == nil && ok {
				reports <- rep
			}
		}
	})

	h := newHarness(t, srv)
	h.stop() // the session's runtime stands in for the harness's
	rt, err := runtime.New(h.opts)
	if err != nil {
		t.Fatal(err)
	}
	store, err := nodespec.Open(h.opts.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rtDone, sessDone := make(chan error, 1), make(chan error, 1)
	go func() { rtDone <- rt.Run(ctx) }()
	go func() {
		sessDone <- session.Run(ctx, session.Options{Identity: join.Identity{NodeID: srv.nodeID, AgentEndpoint: srv.URL},
			HTTPClient: h.opts.Client, StateDir: h.opts.StateDir, NodeSpec: store, Logger: testLogger(),
			OnSpec: rt.OnSpec, OnSession: rt.OnSession, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	}()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			<-sessDone
			<-rtDone
		}
	}
	defer stop()

	first := <-reports
	if !first.Full {
		t.Fatalf("the first report %+v is not Full", first)
	}
	var running protocol.InstanceStatus
	testutil.Eventually(t, 30*time.Second, "the instance reported running on the session", func() bool {
		select {
		case rep := <-reports:
			for _, st := range rep.Statuses {
				if st.ID == id && st.State == protocol.InstanceRunning {
					running = st
				}
			}
		default:
		}
		return running.State == protocol.InstanceRunning
	})
	waitPage(t, running.Address, "user-data: \n")
	stop()

	// The container goes (a crash of the node, say); a runtime started
	// with no session brings it back from the kept spec.
	if out, err := exec.Command("runc", "--root", filepath.Join(h.opts.StateDir, "runc"), "delete", "--force", id).CombinedOutput(); err != nil {
		t.Fatalf("runc delete: %v: %s", err, out)
	}
	h.start()
	if st := h.wait(id, 1, protocol.InstanceRunning, 30*time.Second); st.Address != running.Address {
		t.Errorf("address %s from the kept spec, was %s", st.Address, running.Address)
	}
}
