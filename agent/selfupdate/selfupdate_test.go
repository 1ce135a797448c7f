package selfupdate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
	coreimages "github.com/better-compute/better-compute/core/images"
	"github.com/better-compute/better-compute/internal/sshsigtest"
)

// build is an executable that answers `version` as bcd of version does.
func build(version string) []byte {
	return []byte("#!/bin/sh\necho \"bcd " + version + " (commit test, go)\"\n")
}

type rig struct {
	t      *testing.T
	u      *Updater
	served []byte
	signer sshsigtest.Key
	execs  []string
}

func newRig(t *testing.T, running string) *rig {
	t.Helper()
	dir := t.TempDir()
	r := &rig{t: t, signer: sshsigtest.NewKey(t, "release")}
	exe := filepath.Join(dir, "bin", "bcd")
	if err := os.MkdirAll(filepath.Dir(exe), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, build(running), 0o755); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != protocol.ReleaseArtifactPath+"rel_1/bcd" {
			http.NotFound(w, req)
			return
		}
		_, _ = w.Write(r.served)
	}))
	t.Cleanup(srv.Close)
	r.u = &Updater{StateDir: filepath.Join(dir, "state"), Executable: exe, Version: "bcd/" + running, Endpoint: srv.URL,
		Client: srv.Client(), Exec: func(path string, _, _ []string) error { r.execs = append(r.execs, path); return nil }}
	if err := os.MkdirAll(r.u.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	return r
}

// args serves b and answers agent.update's args for it, signed by the
// rig's signer.
func (r *rig) args(b []byte, version string) protocol.AgentUpdateArgs {
	r.served = b
	sum := sha256.Sum256(b)
	return protocol.AgentUpdateArgs{ReleaseID: "rel_1", Artifact: "bcd", Version: "bcd/" + version, SHA256: hex.EncodeToString(sum[:]),
		SizeBytes: int64(len(b)), Signature: r.signer.SignBytes(r.t, coreimages.SignatureNamespace, b),
		Signers: []string{r.signer.AuthorizedKey}, ConfirmWithinSeconds: 60}
}

func (r *rig) executable() string {
	b, err := os.ReadFile(r.u.Executable)
	if err != nil {
		r.t.Fatal(err)
	}
	return string(b)
}

// Refused builds change nothing: no swap, no marker, no file left.
func TestUpdateRefusesWhatIsNotTheRelease(t *testing.T) {
	other := sshsigtest.NewKey(t, "someone else")
	cases := map[string]func(r *rig) protocol.AgentUpdateArgs{
		"digest": func(r *rig) protocol.AgentUpdateArgs {
			a := r.args(build("2.0"), "2.0")
			r.served = build("2.1") // same size, other bytes
			return a
		},
		"signature": func(r *rig) protocol.AgentUpdateArgs {
			a := r.args(build("2.0"), "2.0")
			a.Signature = other.SignBytes(t, coreimages.SignatureNamespace, build("2.0"))
			return a
		},
		"namespace": func(r *rig) protocol.AgentUpdateArgs {
			a := r.args(build("2.0"), "2.0")
			a.Signature = r.signer.SignBytes(t, "file", build("2.0"))
			return a
		},
		"no signers": func(r *rig) protocol.AgentUpdateArgs {
			a := r.args(build("2.0"), "2.0")
			a.Signers = nil
			return a
		},
		"version": func(r *rig) protocol.AgentUpdateArgs { return r.args(build("3.0"), "2.0") },
		"not a build": func(r *rig) protocol.AgentUpdateArgs {
			return r.args([]byte("#!/bin/sh\nexit 3\n"), "2.0")
		},
		"already running": func(r *rig) protocol.AgentUpdateArgs { return r.args(build("1.0"), "1.0") },
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			r := newRig(t, "1.0")
			err := r.u.Update(context.Background(), 7, args(r))
			if err == nil {
				t.Fatal("accepted")
			}
			if r.executable() != string(build("1.0")) || len(r.execs) != 0 {
				t.Fatalf("the running build changed: %q, execs %v", r.executable(), r.execs)
			}
			entries, _ := os.ReadDir(filepath.Dir(r.u.Executable))
			state, _ := os.ReadDir(r.u.StateDir)
			if len(entries) != 1 || len(state) != 0 {
				t.Fatalf("left behind: %v, %v", entries, state)
			}
			t.Logf("%s: %v", name, err)
		})
	}
}

// A good build swaps in and is exec'd; its first start holds the update
// until its session answers it; the marker then goes and the previous
// build stays.
func TestUpdateSwapsAndTheNewBuildAnswers(t *testing.T) {
	r := newRig(t, "1.0")
	if err := r.u.Update(context.Background(), 7, r.args(build("2.0"), "2.0")); err != nil {
		t.Fatal(err)
	}
	if r.executable() != string(build("2.0")) || len(r.execs) != 1 || r.execs[0] != r.u.Executable {
		t.Fatalf("executable %q, execs %v", r.executable(), r.execs)
	}
	if prev, _ := os.ReadFile(r.u.Executable + previousSuffix); string(prev) != string(build("1.0")) {
		t.Fatalf("previous build %q", prev)
	}
	// The new build starts.
	r.u.Version = "bcd/2.0"
	m, err := r.u.Start()
	if err != nil || m == nil || m.State != Swapped || m.Starts != 1 || m.Seq != 7 {
		t.Fatalf("start: %+v, %v", m, err)
	}
	if res := m.Result(); res.State != protocol.CommandSucceeded || res.Seq != 7 {
		t.Fatalf("result %+v", res)
	}
	if err := r.u.Confirmed(); err != nil {
		t.Fatal(err)
	}
	if m, err := r.u.Start(); m != nil || err != nil {
		t.Fatalf("a marker after confirm: %+v, %v", m, err)
	}
}

// A new build that dies before its session (its second start), or that
// does not hold one by the deadline, is replaced by the previous build,
// which answers the command failed.
func TestUpdateRollsBack(t *testing.T) {
	for _, how := range []string{"second start", "deadline at start", "deadline while running"} {
		t.Run(how, func(t *testing.T) {
			r := newRig(t, "1.0")
			clock := time.Now()
			r.u.Now = func() time.Time { return clock }
			if err := r.u.Update(context.Background(), 9, r.args(build("2.0"), "2.0")); err != nil {
				t.Fatal(err)
			}
			r.u.Version = "bcd/2.0"
			switch how {
			case "second start":
				if m, err := r.u.Start(); err != nil || m == nil {
					t.Fatalf("first start: %+v, %v", m, err)
				}
				if m, err := r.u.Start(); err != nil || m != nil {
					t.Fatalf("second start: %+v, %v", m, err)
				}
			case "deadline at start":
				clock = clock.Add(61 * time.Second)
				if m, err := r.u.Start(); err != nil || m != nil {
					t.Fatalf("late start: %+v, %v", m, err)
				}
			case "deadline while running":
				m, err := r.u.Start()
				if err != nil || m == nil {
					t.Fatalf("start: %+v, %v", m, err)
				}
				m.Deadline = time.Now().Add(50 * time.Millisecond).UnixMilli()
				r.u.Watch(context.Background(), *m) // returns once it rolled back
			}
			if r.executable() != string(build("1.0")) || len(r.execs) != 2 {
				t.Fatalf("after the rollback: executable %q, execs %v", r.executable(), r.execs)
			}
			// The previous build starts and answers the command failed.
			r.u.Version = "bcd/1.0"
			m, err := r.u.Start()
			if err != nil || m == nil || m.State != RolledBack {
				t.Fatalf("the previous build's start: %+v, %v", m, err)
			}
			if res := m.Result(); res.State != protocol.CommandFailed || res.Seq != 9 || !strings.Contains(res.Error, "rolled back to bcd/1.0") {
				t.Fatalf("result %+v", res)
			}
		})
	}
}

// A crash after the marker but before the swap leaves the previous build
// running: its start answers the update failed.
func TestUpdateInterruptedBeforeTheSwap(t *testing.T) {
	r := newRig(t, "1.0")
	if err := r.u.writeMarker(Marker{Seq: 4, FromVersion: "bcd/1.0", ToVersion: "bcd/2.0", State: Swapped,
		Deadline: time.Now().Add(time.Minute).UnixMilli()}); err != nil {
		t.Fatal(err)
	}
	m, err := r.u.Start()
	if err != nil || m == nil || m.State != RolledBack || m.Result().State != protocol.CommandFailed {
		t.Fatalf("start: %+v, %v", m, err)
	}
	if len(r.execs) != 0 {
		t.Fatalf("execs %v", r.execs)
	}
}
