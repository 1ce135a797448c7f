package e2e

import (
	"bytes"
	"context"
	"fmt"
	osexec "os/exec"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/better-compute/better-compute/api/sandboxes"
	"github.com/better-compute/better-compute/api/secrets"
	"github.com/better-compute/better-compute/api/tunnels"
	"github.com/better-compute/better-compute/core"
	coresandboxes "github.com/better-compute/better-compute/core/sandboxes"
	"github.com/better-compute/better-compute/internal/testutil"
)

// createSandbox creates a sandbox of the dev stack's demo template as the
// demo user.
func (v *vpsStack) createSandbox(tb testing.TB, key string, ttl int) sandboxes.Sandbox {
	tb.Helper()
	s, err := sandboxes.Create.Call(context.Background(), v.demo, sandboxes.CreateInput{TenantID: demoTenant, IdempotencyKey: key,
		TemplateID: v.s.VPS().SandboxTemplateID, TTLSeconds: ttl})
	if err != nil {
		tb.Fatalf("sandboxes.create: %v", err)
	}
	return s
}

// awaitSandbox waits for the sandbox's state (failing at once on failed).
func (v *vpsStack) awaitSandbox(tb testing.TB, id, state string) sandboxes.Sandbox {
	tb.Helper()
	var got sandboxes.Sandbox
	testutil.EventuallyNil(tb, instanceWait, func() error {
		var err error
		if got, err = sandboxes.Get.Call(context.Background(), v.demo, sandboxes.SandboxInput{TenantID: demoTenant, SandboxID: id}); err != nil {
			tb.Fatal(err)
		}
		if got.State == "failed" && state != "failed" {
			tb.Fatalf("sandbox %s failed: %s", id, got.Failure)
		}
		if got.State != state {
			return fmt.Errorf("sandbox %s is %s, not %s", id, got.State, state)
		}
		return nil
	})
	return got
}

// exec runs command in the sandbox through sandboxes.exec and its tunnel.
func (v *vpsStack) exec(tb testing.TB, id string, stdin string, command ...string) (stdout, stderr string, st tunnels.ExitStatus) {
	tb.Helper()
	ctx := context.Background()
	opened, err := sandboxes.Exec.Call(ctx, v.demo, sandboxes.ExecInput{TenantID: demoTenant, SandboxID: id, Command: command})
	if err != nil {
		tb.Fatalf("sandboxes.exec %q: %v", command, err)
	}
	var out, errOut bytes.Buffer
	st, err = tunnels.Exec(ctx, nil, v.s.APIURL()+opened.URL, opened.Token, strings.NewReader(stdin), &out, &errOut)
	if err != nil {
		tb.Fatalf("exec %q: %v", command, err)
	}
	return out.String(), errOut.String(), st
}

// expiresAt reads the sandbox's recorded deadline.
func (v *vpsStack) expiresAt(tb testing.TB, id string) time.Time {
	tb.Helper()
	var at time.Time
	if err := v.db.QueryRow(context.Background(), `SELECT expires_at FROM sandboxes WHERE id = $1`, id).Scan(&at); err != nil {
		tb.Fatal(err)
	}
	return at
}

// A sandbox of the demo template starts, execs with streamed stdin,
// stdout, stderr and exit codes (several at once), keeps its deadline
// through execs, reads and a lost workflow, extends to an explicit
// instant, ends at its TTL with its workload deleted, and refuses execs
// once ended.
func TestSandboxesOnTheDevStack(t *testing.T) {
	v := startVPSStack(t)
	ctx := context.Background()

	s := v.createSandbox(t, "life", 600)
	s = v.awaitSandbox(t, s.ID, "running")
	// .ci/run installs runsc: the demo template runs under gVisor there.
	if _, err := osexec.LookPath("runsc"); err == nil && s.Runtime != "gvisor" {
		t.Fatalf("the sandbox runs under %s, not gvisor", s.Runtime)
	}
	deadline := v.expiresAt(t, s.ID)

	out, errOut, st := v.exec(t, s.ID, "", "sh", "-c", "echo hello; echo oops >&2; exit 3")
	if out != "hello\n" || errOut != "oops\n" || st.ExitCode != 3 {
		t.Fatalf("exec = %q %q %+v", out, errOut, st)
	}
	if out, _, st := v.exec(t, s.ID, "from stdin\n", "cat"); out != "from stdin\n" || st.ExitCode != 0 {
		t.Fatalf("cat = %q %+v", out, st)
	}
	// Concurrent execs in one sandbox.
	done := make(chan string, 4)
	for i := range 4 {
		go func() {
			opened, err := sandboxes.Exec.Call(ctx, v.demo, sandboxes.ExecInput{TenantID: demoTenant, SandboxID: s.ID,
				Command: []string{"sh", "-c", fmt.Sprintf("sleep 0.2; echo %d", i)}})
			if err != nil {
				done <- err.Error()
				return
			}
			var b bytes.Buffer
			if _, err := tunnels.Exec(ctx, nil, v.s.APIURL()+opened.URL, opened.Token, strings.NewReader(""), &b, &b); err != nil {
				done <- err.Error()
				return
			}
			done <- b.String()
		}()
	}
	got := map[string]bool{}
	for range 4 {
		got[<-done] = true
	}
	for i := range 4 {
		if !got[fmt.Sprintf("%d\n", i)] {
			t.Fatalf("concurrent execs answered %v", got)
		}
	}
	// A timeout kills the command.
	opened, err := sandboxes.Exec.Call(ctx, v.demo, sandboxes.ExecInput{TenantID: demoTenant, SandboxID: s.ID,
		Command: []string{"sleep", "30"}, TimeoutSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := tunnels.Exec(ctx, nil, v.s.APIURL()+opened.URL, opened.Token, strings.NewReader(""), &bytes.Buffer{}, &bytes.Buffer{}); err != nil || !st.TimedOut {
		t.Fatalf("timed-out exec = %+v, %v", st, err)
	}
	if now := v.expiresAt(t, s.ID); !now.Equal(deadline) {
		t.Fatalf("the deadline moved from %s to %s with execs", deadline, now)
	}

	// extend moves it to the instant asked, within the template's maximum.
	want := s.CreatedAt + 1_200_000
	ext, err := sandboxes.Extend.Call(ctx, v.demo, sandboxes.ExtendInput{TenantID: demoTenant, SandboxID: s.ID, ExpiresAt: want})
	if err != nil || ext.ExpiresAt != want || v.expiresAt(t, s.ID).UnixMilli() != want {
		t.Fatalf("extend = %+v, %v", ext, err)
	}

	// A short-lived sandbox whose workflow is lost (terminated) still ends
	// at its recorded deadline: the reconciler starts it again and it reads
	// the row's deadline.
	short := v.createSandbox(t, "short", 4)
	shortDeadline := v.expiresAt(t, short.ID)
	if err := v.s.Client().TerminateWorkflow(ctx, short.ID, "", "the test loses the workflow"); err != nil {
		t.Fatal(err)
	}
	if err := v.s.Client().ScheduleClient().GetHandle(ctx, "sandboxes-reconciler").Trigger(ctx, client.ScheduleTriggerOptions{}); err != nil {
		t.Fatal(err)
	}
	ended := v.awaitSandbox(t, short.ID, "deleted")
	if ended.EndReason != "ttl" || ended.EndedAt < shortDeadline.UnixMilli() || !v.expiresAt(t, short.ID).Equal(shortDeadline) {
		t.Fatalf("short sandbox ended %+v (deadline %s)", ended, shortDeadline)
	}
	var workload string
	if err := v.db.QueryRow(ctx, `SELECT state FROM instances WHERE id = $1`, ended.InstanceID).Scan(&workload); err != nil || workload != "deleted" {
		t.Fatalf("the workload is %s, %v", workload, err)
	}
	if _, err := sandboxes.Exec.Call(ctx, v.demo, sandboxes.ExecInput{TenantID: demoTenant, SandboxID: short.ID,
		Command: []string{"sh", "-c", "true"}}); core.AsError(err).Code != core.CodeInvalidState {
		t.Fatalf("exec in an ended sandbox = %v", err)
	}

	if _, err := sandboxes.Delete.Call(ctx, v.demo, sandboxes.SandboxInput{TenantID: demoTenant, SandboxID: s.ID}); err != nil {
		t.Fatal(err)
	}
	if gone := v.awaitSandbox(t, s.ID, "deleted"); gone.EndReason != "deleted" {
		t.Fatalf("deleted sandbox = %+v", gone)
	}
}

// warmTemplate makes the demo user's template like the demo one with a
// warm pool of size, and waits for the pool to hold size running
// workloads.
func (v *vpsStack) warmTemplate(tb testing.TB, name string, size int) sandboxes.Template {
	tb.Helper()
	ctx := context.Background()
	demo, err := sandboxes.GetTemplate.Call(ctx, v.demo, sandboxes.TemplateRef{TenantID: demoTenant, TemplateID: v.s.VPS().SandboxTemplateID})
	if err != nil {
		tb.Fatal(err)
	}
	t, err := sandboxes.CreateTemplate.Call(ctx, v.demo, sandboxes.TemplateInput{TenantID: demoTenant, Name: name, PoolID: demo.PoolID,
		FlavorID: demo.FlavorID, ImageID: demo.ImageID, Runtime: coresandboxes.Runtime(demo.Runtime), WarmPoolSize: size, MaxTTLSeconds: 3600})
	if err != nil {
		tb.Fatal(err)
	}
	v.awaitWarm(tb, t.ID, size)
	return t
}

// awaitWarm waits for n warm workloads of the template that a create can claim.
func (v *vpsStack) awaitWarm(tb testing.TB, templateID string, n int) {
	tb.Helper()
	testutil.EventuallyNil(tb, instanceWait, func() error {
		var ready int
		if err := v.db.QueryRow(context.Background(), `SELECT count(*) FROM instances WHERE warm_template_id = $1 AND sandbox_id IS NULL
			AND state = 'running' AND observed_state = 'running' AND observed_generation = generation`, templateID).Scan(&ready); err != nil {
			tb.Fatal(err)
		}
		if ready < n {
			return fmt.Errorf("%d of %d warm workloads ready", ready, n)
		}
		return nil
	})
}

// A create on a template with a warm pool claims a running workload (the
// sandbox is running in the create's answer, on the warm workload's own
// id), execs at once, and the pool is topped up behind it; a template
// update replaces the stale warm workloads.
func TestSandboxesWarmPool(t *testing.T) {
	v := startVPSStack(t)
	ctx := context.Background()
	tpl := v.warmTemplate(t, "warm", 1)
	var warmID string
	if err := v.db.QueryRow(ctx, `SELECT id FROM instances WHERE warm_template_id = $1 AND sandbox_id IS NULL`, tpl.ID).Scan(&warmID); err != nil {
		t.Fatal(err)
	}
	s, err := sandboxes.Create.Call(ctx, v.demo, sandboxes.CreateInput{TenantID: demoTenant, IdempotencyKey: "warm-1", TemplateID: tpl.ID})
	if err != nil {
		t.Fatal(err)
	}
	if s.State != "running" || s.InstanceID != warmID {
		t.Fatalf("warm create = %+v, want running on %s", s, warmID)
	}
	if out, _, st := v.exec(t, s.ID, "", "sh", "-c", "echo warm"); out != "warm\n" || st.ExitCode != 0 {
		t.Fatalf("exec = %q %+v", out, st)
	}
	// The pool refills: one more warm workload, not the claimed one.
	v.awaitWarm(t, tpl.ID, 1)
	// An update makes the warm workload stale: it is replaced at the new version.
	ttl := 120
	tpl, err = sandboxes.UpdateTemplate.Call(ctx, v.demo, sandboxes.TemplateUpdateInput{TenantID: demoTenant, TemplateID: tpl.ID, DefaultTTLSeconds: &ttl})
	if err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyNil(t, instanceWait, func() error {
		var fresh, stale int
		if err := v.db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE warm_version = $2 AND observed_state = 'running'),
				count(*) FILTER (WHERE warm_version <> $2 AND state <> 'deleted')
			FROM instances WHERE warm_template_id = $1 AND sandbox_id IS NULL`, tpl.ID, tpl.Version).Scan(&fresh, &stale); err != nil {
			t.Fatal(err)
		}
		if fresh != 1 || stale != 0 {
			return fmt.Errorf("warm workloads: %d at version %d, %d stale", fresh, tpl.Version, stale)
		}
		return nil
	})
	if _, err := sandboxes.Delete.Call(ctx, v.demo, sandboxes.SandboxInput{TenantID: demoTenant, SandboxID: s.ID}); err != nil {
		t.Fatal(err)
	}
	v.awaitSandbox(t, s.ID, "deleted")
}

// awaitSnapshot waits for the snapshot to leave creating and answers it.
func (v *vpsStack) awaitSnapshot(tb testing.TB, id string) sandboxes.Snapshot {
	tb.Helper()
	var got sandboxes.Snapshot
	testutil.EventuallyNil(tb, instanceWait, func() error {
		var err error
		if got, err = sandboxes.GetSnapshot.Call(context.Background(), v.demo, sandboxes.SnapshotRef{TenantID: demoTenant, SnapshotID: id}); err != nil {
			tb.Fatal(err)
		}
		if got.State == "creating" {
			return fmt.Errorf("snapshot %s is creating", id)
		}
		return nil
	})
	return got
}

// counter reads the guest's counter file.
func (v *vpsStack) counter(tb testing.TB, id string) int {
	tb.Helper()
	n, err := v.readCounter(tb, id)
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

func (v *vpsStack) readCounter(tb testing.TB, id string) (int, error) {
	tb.Helper()
	out, errOut, st := v.exec(tb, id, "", "cat", "/var/count")
	var n int
	if _, err := fmt.Sscan(out, &n); err != nil || st.ExitCode != 0 {
		return 0, fmt.Errorf("cat /var/count = %q %q %+v", out, errOut, st)
	}
	return n, nil
}

// A memory snapshot of a gVisor sandbox restores into new sandboxes, twice,
// with its processes running on (a counter keeps counting from where it
// was) and its files; the snapshot outlives its sandbox, is refused
// deletion while a restore runs from it, and deleting removes it. A
// template whose ttlAction is snapshot takes one at the deadline before
// the workload goes.
func TestSandboxSnapshots(t *testing.T) {
	if _, err := osexec.LookPath("runsc"); err != nil {
		t.Skip("memory snapshots need gVisor's runsc (.ci/run installs it)")
	}
	v := startVPSStack(t)
	ctx := context.Background()

	demo, err := sandboxes.GetTemplate.Call(ctx, v.demo, sandboxes.TemplateRef{TenantID: demoTenant, TemplateID: v.s.VPS().SandboxTemplateID})
	if err != nil {
		t.Fatal(err)
	}
	// The guest's command is a counter whose state is in its memory (i).
	counting, err := sandboxes.CreateTemplate.Call(ctx, v.demo, sandboxes.TemplateInput{TenantID: demoTenant, Name: "counter", PoolID: demo.PoolID,
		FlavorID: demo.FlavorID, ImageID: demo.ImageID, Command: []string{"/bin/sh", "-c",
			"echo kept > /var/file; i=0; while true; do i=$((i+1)); echo $i > /var/count; sleep 0.1; done"}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := sandboxes.Create.Call(ctx, v.demo, sandboxes.CreateInput{TenantID: demoTenant, IdempotencyKey: "snap-src",
		TemplateID: counting.ID, TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	s = v.awaitSandbox(t, s.ID, "running")
	deadline := v.expiresAt(t, s.ID)
	testutil.EventuallyNil(t, time.Minute, func() error {
		if n, err := v.readCounter(t, s.ID); err != nil || n < 5 {
			return fmt.Errorf("the counter is at %d (%v)", n, err)
		}
		return nil
	})

	snap, err := sandboxes.TakeSnapshot.Call(ctx, v.demo, sandboxes.SnapshotInput{TenantID: demoTenant, SandboxID: s.ID,
		IncludeMemory: true, IdempotencyKey: "snap-1"})
	if err != nil || snap.State != "creating" || snap.OwnerIdentityID != s.OwnerIdentityID {
		t.Fatalf("sandboxes.snapshot = %+v, %v", snap, err)
	}
	// A retry with the key answers the same snapshot.
	if again, err := sandboxes.TakeSnapshot.Call(ctx, v.demo, sandboxes.SnapshotInput{TenantID: demoTenant, SandboxID: s.ID,
		IncludeMemory: true, IdempotencyKey: "snap-1"}); err != nil || again.ID != snap.ID {
		t.Fatalf("retried snapshot = %+v, %v", again, err)
	}
	snap = v.awaitSnapshot(t, snap.ID)
	if snap.State != "ready" || snap.SizeBytes == 0 || len(snap.SHA256) != 64 {
		t.Fatalf("snapshot = %+v", snap)
	}
	t.Logf("memory snapshot: %d bytes, ready %d ms after the call", snap.SizeBytes, snap.ReadyAt-snap.CreatedAt)
	atSnapshot := v.counter(t, s.ID)
	if _, err := sandboxes.Delete.Call(ctx, v.demo, sandboxes.SandboxInput{TenantID: demoTenant, SandboxID: s.ID}); err != nil {
		t.Fatal(err)
	}
	v.awaitSandbox(t, s.ID, "deleted")
	if !v.expiresAt(t, s.ID).Equal(deadline) {
		t.Fatal("the deadline moved with a snapshot")
	}

	// Restored twice: both continue counting, with the files.
	var restored []string
	for i := range 2 {
		r, err := sandboxes.Create.Call(ctx, v.demo, sandboxes.CreateInput{TenantID: demoTenant, IdempotencyKey: fmt.Sprintf("restore-%d", i),
			FromSnapshot: snap.ID, TTLSeconds: 600})
		if err != nil {
			t.Fatalf("restore %d: %v", i, err)
		}
		if r.FromSnapshotID != snap.ID || r.TemplateID != s.TemplateID {
			t.Fatalf("restored sandbox = %+v", r)
		}
		began := time.Now()
		r = v.awaitSandbox(t, r.ID, "running")
		t.Logf("restore %d: running %s after the create's answer", i, time.Since(began))
		rd := v.expiresAt(t, r.ID)
		first := v.counter(t, r.ID)
		// The snapshot was taken before atSnapshot was read: the restored
		// counter starts a little below it, never from 1.
		if first < atSnapshot-20 {
			t.Fatalf("restore %d: the counter is at %d, the source was at %d", i, first, atSnapshot)
		}
		testutil.EventuallyNil(t, time.Minute, func() error {
			if n := v.counter(t, r.ID); n <= first {
				return fmt.Errorf("the restored counter stays at %d", n)
			}
			return nil
		})
		if out, _, _ := v.exec(t, r.ID, "", "cat", "/var/file"); out != "kept\n" {
			t.Fatalf("restore %d: /var/file = %q", i, out)
		}
		if !v.expiresAt(t, r.ID).Equal(rd) {
			t.Fatal("the deadline moved with a restore")
		}
		restored = append(restored, r.ID)
	}
	if _, err := sandboxes.DeleteSnapshot.Call(ctx, v.demo, sandboxes.SnapshotRef{TenantID: demoTenant, SnapshotID: snap.ID}); core.AsError(err).Details["reason"] != "inUse" {
		t.Fatalf("deleting a snapshot in use = %v", err)
	}
	for _, id := range restored {
		if _, err := sandboxes.Delete.Call(ctx, v.demo, sandboxes.SandboxInput{TenantID: demoTenant, SandboxID: id}); err != nil {
			t.Fatal(err)
		}
		v.awaitSandbox(t, id, "deleted")
	}
	list, err := sandboxes.ListSnapshots.Call(ctx, v.demo, sandboxes.SnapshotListInput{TenantID: demoTenant, SandboxID: s.ID})
	if err != nil || len(list.Items) != 1 || list.Items[0].ID != snap.ID {
		t.Fatalf("sandboxSnapshots.list = %+v, %v", list, err)
	}
	if _, err := sandboxes.DeleteSnapshot.Call(ctx, v.demo, sandboxes.SnapshotRef{TenantID: demoTenant, SnapshotID: snap.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := sandboxes.GetSnapshot.Call(ctx, v.demo, sandboxes.SnapshotRef{TenantID: demoTenant, SnapshotID: snap.ID}); core.AsError(err).Code != core.CodeNotFound {
		t.Fatalf("a deleted snapshot = %v", err)
	}
	if _, err := sandboxes.Create.Call(ctx, v.demo, sandboxes.CreateInput{TenantID: demoTenant, IdempotencyKey: "restore-gone",
		FromSnapshot: snap.ID}); core.AsError(err).Code != core.CodeNotFound {
		t.Fatalf("a restore of a deleted snapshot = %v", err)
	}

	// ttlAction snapshot: the deadline takes a memory snapshot, then ends.
	tpl, err := sandboxes.CreateTemplate.Call(ctx, v.demo, sandboxes.TemplateInput{TenantID: demoTenant, Name: "pause-at-ttl", PoolID: demo.PoolID,
		FlavorID: demo.FlavorID, ImageID: demo.ImageID, TTLAction: coresandboxes.TTLSnapshot})
	if err != nil {
		t.Fatal(err)
	}
	short, err := sandboxes.Create.Call(ctx, v.demo, sandboxes.CreateInput{TenantID: demoTenant, IdempotencyKey: "ttl-snap",
		TemplateID: tpl.ID, TTLSeconds: 4})
	if err != nil {
		t.Fatal(err)
	}
	v.awaitSandbox(t, short.ID, "running")
	if ended := v.awaitSandbox(t, short.ID, "deleted"); ended.EndReason != "ttl" {
		t.Fatalf("ttl sandbox ended %+v", ended)
	}
	list, err = sandboxes.ListSnapshots.Call(ctx, v.demo, sandboxes.SnapshotListInput{TenantID: demoTenant, SandboxID: short.ID})
	if err != nil || len(list.Items) != 1 || list.Items[0].Reason != "ttl" || list.Items[0].State != "ready" || !list.Items[0].IncludeMemory {
		t.Fatalf("the ttl snapshot = %+v, %v", list, err)
	}
}

// A volume keeps a file across two sandboxes of a template that mounts
// it, on the volume's host; a read-only mount of it reads the file and
// cannot write. The template's env reaches the guest and its execs, its
// secret resolved by the node.
func TestSandboxVolumesOnTheDevStack(t *testing.T) {
	v := startVPSStack(t)
	ctx := context.Background()
	demo, err := sandboxes.GetTemplate.Call(ctx, v.demo, sandboxes.TemplateRef{TenantID: demoTenant, TemplateID: v.s.VPS().SandboxTemplateID})
	if err != nil {
		t.Fatal(err)
	}
	vol, err := sandboxes.CreateVolume.Call(ctx, v.demo, sandboxes.VolumeCreateInput{TenantID: demoTenant, IdempotencyKey: "data",
		PoolID: demo.PoolID, SizeGiB: 1})
	if err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyNil(t, instanceWait, func() error {
		got, err := sandboxes.GetVolume.Call(ctx, v.demo, sandboxes.VolumeInput{TenantID: demoTenant, VolumeID: vol.ID})
		if err != nil {
			t.Fatal(err)
		}
		if got.State != "ready" {
			return fmt.Errorf("volume %s is %s", vol.ID, got.State)
		}
		return nil
	})
	if _, err := secrets.Put.Call(ctx, v.demo, secrets.PutInput{TenantID: demoTenant, Name: "api-token", Value: "s3cr3t"}); err != nil {
		t.Fatal(err)
	}
	template := func(name string, readOnly bool) string {
		tpl, err := sandboxes.CreateTemplate.Call(ctx, v.demo, sandboxes.TemplateInput{TenantID: demoTenant, Name: name, PoolID: demo.PoolID,
			FlavorID: demo.FlavorID, ImageID: demo.ImageID, Runtime: coresandboxes.Runtime(demo.Runtime),
			Volumes: []sandboxes.MountInput{{VolumeID: vol.ID, MountPath: "/data", ReadOnly: readOnly}},
			Env:     map[string]string{"MODE": "e2e", "API_TOKEN": "secret://" + demoTenant + "/api-token"}})
		if err != nil {
			t.Fatal(err)
		}
		return tpl.ID
	}
	rw, ro := template("with-data", false), template("read-data", true)
	run := func(key, tpl string, command string) (string, int) {
		s, err := sandboxes.Create.Call(ctx, v.demo, sandboxes.CreateInput{TenantID: demoTenant, IdempotencyKey: key, TemplateID: tpl})
		if err != nil {
			t.Fatal(err)
		}
		s = v.awaitSandbox(t, s.ID, "running")
		if s.NodeID != vol.NodeID {
			t.Fatalf("sandbox on %s, the volume on %s", s.NodeID, vol.NodeID)
		}
		out, errOut, st := v.exec(t, s.ID, "", "sh", "-c", command)
		if _, err := sandboxes.Delete.Call(ctx, v.demo, sandboxes.SandboxInput{TenantID: demoTenant, SandboxID: s.ID}); err != nil {
			t.Fatal(err)
		}
		v.awaitSandbox(t, s.ID, "deleted")
		return out + errOut, st.ExitCode
	}
	if out, code := run("first", rw, `echo persisted > /data/file && sync && echo "$MODE $API_TOKEN"`); out != "e2e s3cr3t\n" || code != 0 {
		t.Fatalf("writing the volume: %q %d", out, code)
	}
	if out, code := run("second", rw, "cat /data/file"); out != "persisted\n" || code != 0 {
		t.Fatalf("the second sandbox reads %q (%d)", out, code)
	}
	if out, code := run("reader", ro, "cat /data/file && ! touch /data/other"); !strings.HasPrefix(out, "persisted\n") || code != 0 {
		t.Fatalf("the read-only mount: %q (%d)", out, code)
	}
}
