package runtime_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/internal/testutil"
)

// TestVolumes: a file written through one gVisor instance's mount of a
// volume is read by a second instance mounting it read-only after the
// first is removed; the volume grows in place in between; a read-only
// mount refuses writes; the volume goes once it left the spec and nothing
// mounts it.
func TestVolumes(t *testing.T) {
	requireRunsc(t)
	srv := newImageServer(t)
	image := buildTestImage(t)
	writer, reader, vol := randID(t, "inst_"), randID(t, "inst_"), randID(t, "vol_")
	srv.serve(writer, image, nil)
	srv.serve(reader, image, nil)
	h := newHarness(t, srv)
	img := filepath.Join(h.opts.StateDir, "volumes", vol, "disk.img")
	t.Cleanup(func() {
		// Before the harness's own cleanup: nothing left mounted in the
		// state directory.
		h.rt.OnSpec(1<<39, nodespec.Spec{})
		testutil.Eventually(t, 30*time.Second, "the volume removed", func() bool {
			_, err := os.Stat(filepath.Dir(img))
			return os.IsNotExist(err)
		})
	})

	w := gvisorInstance(writer, image)
	w.Mounts = []nodespec.Mount{{VolumeID: vol, Path: "/data"}}
	h.rt.OnSpec(1, nodespec.Spec{Volumes: []nodespec.Volume{{ID: vol, SizeGiB: 1}}, Instances: []nodespec.Instance{w}})
	h.wait(writer, 1, protocol.InstanceRunning, 30*time.Second)
	execOut(t, h.rt, writer, "sh", "-c", "echo kept across sandboxes > /data/note && sync")
	if st, err := os.Stat(img); err != nil || st.Size() != 1<<30 {
		t.Fatalf("image %v, %v", st, err)
	}

	// The writer goes; the volume stays, as the spec lists it.
	h.rt.OnSpec(2, nodespec.Spec{Volumes: []nodespec.Volume{{ID: vol, SizeGiB: 2}}})
	testutil.Eventually(t, 30*time.Second, "the writer removed", func() bool {
		_, ok := h.rt.Status(writer)
		return !ok && h.instanceDirs() == 0
	})

	r := gvisorInstance(reader, image)
	r.Mounts = []nodespec.Mount{{VolumeID: vol, Path: "/data", ReadOnly: true}}
	h.rt.OnSpec(3, nodespec.Spec{Volumes: []nodespec.Volume{{ID: vol, SizeGiB: 2}}, Instances: []nodespec.Instance{r}})
	h.wait(reader, 1, protocol.InstanceRunning, 30*time.Second)
	if got := execOut(t, h.rt, reader, "cat", "/data/note"); got != "kept across sandboxes\n" {
		t.Fatalf("the reader reads %q", got)
	}
	var errb bytes.Buffer
	code, err := h.rt.Exec(context.Background(), protocol.ExecSpec{InstanceID: reader,
		Command: []string{"sh", "-c", "echo x > /data/other"}}, nil, &bytes.Buffer{}, &errb)
	if err != nil || code == 0 {
		t.Fatalf("a write to the read-only mount: code %d, %v", code, err)
	}
	// The filesystem grew with the image: above 1.5 GiB of 1 KiB blocks.
	df := strings.Fields(strings.Split(strings.TrimSpace(execOut(t, h.rt, reader, "/bin/busybox", "df", "-k", "/data")), "\n")[1])
	if blocks, err := strconv.Atoi(df[1]); err != nil || blocks < 1_500_000 {
		t.Fatalf("df in the reader: %v (%v)", df, err)
	}

	// Listed nowhere and mounted by nothing, the volume goes.
	h.rt.OnSpec(4, nodespec.Spec{})
	testutil.Eventually(t, 30*time.Second, "the volume removed", func() bool {
		_, err := os.Stat(filepath.Dir(img))
		return os.IsNotExist(err)
	})
}
