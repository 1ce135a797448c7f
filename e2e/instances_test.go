package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/agent/ramdisk/image"
	"github.com/better-compute/better-compute/agent/runtime"
	"github.com/better-compute/better-compute/agent/runtime/testimage"
	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/flavors"
	"github.com/better-compute/better-compute/api/images"
	"github.com/better-compute/better-compute/api/instances"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/deploy/devstack"
	"github.com/better-compute/better-compute/drivers/providers"
	"github.com/better-compute/better-compute/drivers/providers/dofake"
	"github.com/better-compute/better-compute/internal/freeport"
	"github.com/better-compute/better-compute/internal/testutil"
)

// demoTenant is the dev stack's demo tenant, whose user creates the
// instances; rootTenant the platform's.
const (
	demoTenant = "acme"
	rootTenant = "root"
	// instanceWait bounds one wait for an instance's state.
	instanceWait = 2 * time.Minute
	// providerImage is one of the fake DigitalOcean's distribution images.
	providerImage = "ubuntu-24-04-x64"
)

// vpsStack is the dev stack with its VPS fleet: the host agent (a real
// `bcd node run` running runc and QEMU), the fake DigitalOcean behind the
// provider pool, the demo image (the instance test image) and the demo
// user's client.
type vpsStack struct {
	s       *devstack.Stack
	demo    *api.Client
	admin   *api.Client
	db      *pgx.Conn
	flavors map[string]string // name → id, over both pools
}

func startVPSStack(tb testing.TB) *vpsStack {
	tb.Helper()
	if testing.Short() {
		tb.Skip("starts PostgreSQL, Temporal and a host agent")
	}
	if os.Geteuid() != 0 {
		tb.Skip("the host agent runs containers with runc: needs root")
	}
	for _, tool := range []string{"runc", "unsquashfs", "mksquashfs", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			tb.Fatalf("no %s (Debian packages runc, squashfs-tools, iproute2): %v", tool, err)
		}
	}
	dir, err := os.MkdirTemp("", "bc-e2e-vps-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	demoImage := filepath.Join(dir, "image.squashfs")
	if err := testimage.Build(context.Background(), testimage.DefaultBusybox, demoImage); err != nil {
		tb.Fatal(err)
	}
	bcd, err := bcdBinary()
	if err != nil {
		tb.Fatal(err)
	}
	ports, err := freeport.PickN("127.0.0.1", 2)
	if err != nil {
		tb.Fatal(err)
	}
	s, err := devstack.Start(context.Background(), devstack.Options{Dir: dir, APIAddr: "127.0.0.1:0", AgentAddr: "127.0.0.1:0",
		PostgresPort: ports[0], TemporalAddr: "127.0.0.1:0", UIAddr: "-", Agents: 1, BCD: bcd,
		ProviderAddr: "127.0.0.1:" + strconv.Itoa(ports[1]), DemoImage: demoImage,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		tb.Fatalf("devstack: %v", err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			b, _ := os.ReadFile(filepath.Join(s.HostAgentDir(), "bcd.log"))
			tb.Logf("the host agent's log (its last 8 KiB):\n%s", b[max(0, len(b)-8192):])
		}
		s.Stop(context.Background())
		removeHostInstances(tb, s.HostAgentDir())
	})
	v := &vpsStack{s: s, flavors: map[string]string{}}
	adminToken, err := s.AdminToken()
	if err != nil {
		tb.Fatal(err)
	}
	demoToken, err := s.DemoToken()
	if err != nil {
		tb.Fatal(err)
	}
	v.admin, v.demo = api.NewClient(s.APIURL(), adminToken), api.NewClient(s.APIURL(), demoToken)
	if v.db, err = pgx.Connect(context.Background(), s.DatabaseURL()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { v.db.Close(context.Background()) })
	ctx := context.Background()
	for _, pool := range []string{s.VPS().HostPoolID, s.VPS().ProviderPoolID} {
		l, err := flavors.List.Call(ctx, v.demo, flavors.ListInput{TenantID: demoTenant, PoolID: pool})
		if err != nil {
			tb.Fatal(err)
		}
		for _, f := range l.Items {
			v.flavors[f.Name] = f.ID
		}
	}
	testutil.Eventually(tb, agentWait, "the VPS host's node to connect", func() bool {
		l, err := nodes.List.Call(ctx, v.admin, nodes.ListInput{TenantID: rootTenant, PoolID: s.VPS().HostPoolID, Connectivity: "connected"})
		if err != nil {
			tb.Fatal(err)
		}
		return len(l.Items) == 1
	})
	return v
}

// removeHostInstances removes what a failed test left on this machine:
// the host agent's runc containers and gVisor sandboxes, their network
// namespaces, its volumes' mounts and its VMs.
func removeHostInstances(tb testing.TB, hostDir string) {
	for _, oci := range []string{"runc", "runsc"} { // containers, and gVisor sandboxes
		root := filepath.Join(hostDir, oci)
		out, _ := exec.Command(oci, "--root", root, "list", "-q").Output()
		for _, id := range strings.Fields(string(out)) {
			_ = exec.Command(oci, "--root", root, "delete", "--force", id).Run()
			_ = exec.Command("ip", "netns", "del", "bc-"+id).Run()
		}
	}
	// A gVisor sandbox runsc could not delete still names its root on its
	// command line; an instance stopped mid-create may hold a network
	// namespace no runtime lists (its address would shadow the next
	// stack's on the shared bridge).
	_ = exec.Command("pkill", "-9", "-f", "--", "--root="+filepath.Join(hostDir, "runsc")+" ").Run()
	dirs, _ := filepath.Glob(filepath.Join(hostDir, "instances", "*"))
	for _, d := range dirs {
		_ = exec.Command("ip", "netns", "del", "bc-"+filepath.Base(d)).Run()
	}
	// Sandbox volumes: loop mounts (mount -o loop frees the device on umount).
	mounts, _ := filepath.Glob(filepath.Join(hostDir, "volumes", "*", "mnt"))
	for _, m := range mounts {
		_ = exec.Command("umount", "-l", m).Run()
	}
	pidfiles, _ := filepath.Glob(filepath.Join(hostDir, "instances", "*", "qemu.pid"))
	for _, f := range pidfiles {
		if b, err := os.ReadFile(f); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = exec.Command("kill", "-9", strconv.Itoa(pid)).Run()
			}
		}
	}
}

// create creates an instance as the demo user.
func (v *vpsStack) create(tb testing.TB, in instances.CreateInput) instances.Instance {
	tb.Helper()
	in.TenantID = demoTenant
	out, err := instances.Create.Call(context.Background(), v.demo, in)
	if err != nil {
		tb.Fatalf("instances.create %s: %v", in.Name, err)
	}
	return out
}

// await waits for the instance's state (failing at once on failed).
func (v *vpsStack) await(tb testing.TB, id, state string) instances.Instance {
	tb.Helper()
	var got instances.Instance
	testutil.EventuallyNil(tb, instanceWait, func() error {
		var err error
		if got, err = instances.Get.Call(context.Background(), v.demo, instances.InstanceInput{TenantID: demoTenant, InstanceID: id}); err != nil {
			tb.Fatal(err)
		}
		if got.State == "failed" && state != "failed" {
			tb.Fatalf("instance %s failed: %s (%s)", id, got.Failure, got.ObservedError)
		}
		if got.State != state {
			return fmt.Errorf("instance %s is %s, not %s", id, got.State, state)
		}
		return nil
	})
	return got
}

func (v *vpsStack) change(tb testing.TB, m rpc.Ref[instances.InstanceInput, instances.Instance], id string) {
	tb.Helper()
	if _, err := m.Call(context.Background(), v.demo, instances.InstanceInput{TenantID: demoTenant, InstanceID: id}); err != nil {
		tb.Fatalf("%s: %v", m, err)
	}
}

// liveBookings counts the instance's allocations not released.
func (v *vpsStack) liveBookings(tb testing.TB, id string) int {
	tb.Helper()
	var n int
	if err := v.db.QueryRow(context.Background(), `SELECT count(*) FROM allocations WHERE instance_id = $1 AND released_at IS NULL`,
		id).Scan(&n); err != nil {
		tb.Fatal(err)
	}
	return n
}

// containerPid is the pid of the instance's runc container (0: none).
func (v *vpsStack) containerPid(tb testing.TB, id string) int {
	tb.Helper()
	out, err := exec.Command("runc", "--root", filepath.Join(v.s.HostAgentDir(), "runc"), "state", id).Output()
	if err != nil {
		return 0
	}
	var st struct {
		Status string `json:"status"`
		Pid    int    `json:"pid"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.Status != "running" {
		return 0
	}
	return st.Pid
}

// cgroupLimits reads the container's memory limit (bytes) and CPU quota
// (µs per 100 ms period) from its cgroup (v1 hierarchies, else v2).
func cgroupLimits(tb testing.TB, id string) (memory, cpuQuota int64) {
	tb.Helper()
	cg := runtime.CgroupPath(id)
	read := func(paths ...string) string {
		for _, p := range paths {
			if b, err := os.ReadFile(p); err == nil {
				return strings.TrimSpace(string(b))
			}
		}
		tb.Fatalf("none of %v", paths)
		return ""
	}
	memory, _ = strconv.ParseInt(read(filepath.Join("/sys/fs/cgroup/memory", cg, "memory.limit_in_bytes"),
		filepath.Join("/sys/fs/cgroup", cg, "memory.max")), 10, 64)
	if q := read(filepath.Join("/sys/fs/cgroup/cpu", cg, "cpu.cfs_quota_us"), filepath.Join("/sys/fs/cgroup", cg, "cpu.max")); q != "" {
		cpuQuota, _ = strconv.ParseInt(strings.Fields(q)[0], 10, 64)
	}
	return memory, cpuQuota
}

// get fetches the instance's port 8080 through `better-compute tunnel`
// (its stdin and stdout spliced to the port, as an ssh ProxyCommand).
func (v *vpsStack) get(tb testing.TB, id string) string {
	tb.Helper()
	cli, err := betterComputeBinary()
	if err != nil {
		tb.Fatal(err)
	}
	token, err := v.s.DemoToken()
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, cli, "tunnel", "--instance", id, "--port", strconv.Itoa(testimage.Port))
	cmd.Env = []string{"BC_API_URL=" + v.s.APIURL(), "BC_TOKEN=" + token, "BC_TENANT=" + demoTenant, "HOME=" + tb.TempDir()}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	// stdin stays open until the answer is read: its end closes the tunnel.
	if _, err := io.WriteString(stdin, "GET / HTTP/1.0\r\nHost: instance\r\n\r\n"); err != nil {
		tb.Fatal(err)
	}
	page, err := io.ReadAll(stdout) // httpd closes after an HTTP/1.0 answer
	stdin.Close()
	if werr := cmd.Wait(); err != nil || werr != nil {
		tb.Fatalf("better-compute tunnel: %v, %v; stderr: %s", err, werr, stderr.String())
	}
	return string(page)
}

// An instance of each kind on the dev stack, through its API as the demo
// user: a runc container whose page a tunnel reaches, stopped, started and
// resized for real (the process and its cgroup limits), deleted with its
// booking freed; a QEMU VM that boots the test disk; a droplet at the
// fake DigitalOcean through 429s and a create whose answer is lost, with
// exactly one droplet made.
func TestInstancesOnTheDevStack(t *testing.T) {
	v := startVPSStack(t)
	vps := v.s.VPS()

	t.Run("container", func(t *testing.T) {
		in := v.create(t, instances.CreateInput{IdempotencyKey: "web", PoolID: vps.HostPoolID, FlavorID: v.flavors["c1-m1"],
			ImageID: vps.ImageID, Name: "web", UserData: "hello from the e2e\n"})
		if v.liveBookings(t, in.ID) != 1 {
			t.Fatalf("a placed instance holds %d live allocations", v.liveBookings(t, in.ID))
		}
		running := v.await(t, in.ID, "running")
		if running.NodeID == "" || running.Address == "" {
			t.Fatalf("running instance %+v", running)
		}
		page := v.get(t, in.ID)
		if !strings.Contains(page, "200 OK") || !strings.Contains(page, testimage.Marker) || !strings.Contains(page, "user-data: hello from the e2e") {
			t.Fatalf("the page through the tunnel: %q", page)
		}
		pid := v.containerPid(t, in.ID)
		if pid == 0 {
			t.Fatal("no running container")
		}
		if mem, quota := cgroupLimits(t, in.ID); mem != 1<<30 || quota != 100000 {
			t.Fatalf("cgroup limits: memory %d, cpu quota %d; want 1 GiB and one CPU", mem, quota)
		}

		v.change(t, instances.Stop, in.ID)
		v.await(t, in.ID, "stopped")
		if p := v.containerPid(t, in.ID); p != 0 {
			t.Fatalf("a stopped instance still runs as pid %d", p)
		}
		v.change(t, instances.Start, in.ID)
		v.await(t, in.ID, "running")
		restarted := v.containerPid(t, in.ID)
		if restarted == 0 || restarted == pid {
			t.Fatalf("after start: pid %d (before the stop %d)", restarted, pid)
		}

		if _, err := instances.Resize.Call(context.Background(), v.demo, instances.ResizeInput{TenantID: demoTenant,
			InstanceID: in.ID, FlavorID: v.flavors["c2-m2"]}); err != nil {
			t.Fatal(err)
		}
		resized := v.await(t, in.ID, "running")
		if resized.VCPU != 2 || resized.MemoryMiB != 2048 {
			t.Fatalf("resized instance %+v", resized)
		}
		testutil.EventuallyNil(t, instanceWait, func() error {
			if mem, quota := cgroupLimits(t, in.ID); mem != 2<<30 || quota != 200000 {
				return fmt.Errorf("cgroup limits after the resize: memory %d, cpu quota %d", mem, quota)
			}
			return nil
		})
		if p := v.containerPid(t, in.ID); p != restarted {
			t.Fatalf("the resize restarted the container: pid %d, was %d", p, restarted)
		}

		v.change(t, instances.Delete, in.ID)
		v.await(t, in.ID, "deleted")
		if p := v.containerPid(t, in.ID); p != 0 {
			t.Fatalf("a deleted instance still runs as pid %d", p)
		}
		if n := v.liveBookings(t, in.ID); n != 0 {
			t.Fatalf("a deleted instance holds %d live allocations", n)
		}
	})

	t.Run("vm", func(t *testing.T) {
		im := v.registerTestDisk(t)
		in := v.create(t, instances.CreateInput{IdempotencyKey: "vm", PoolID: vps.HostPoolID, FlavorID: v.flavors["vm-c1-m512"],
			ImageID: im, Name: "vm"})
		running := v.await(t, in.ID, "running")
		if !strings.HasPrefix(running.Address, "127.0.0.1:") {
			t.Fatalf("running VM %+v", running)
		}
		console := filepath.Join(v.s.HostAgentDir(), "instances", in.ID, "console.log")
		testutil.EventuallyNil(t, instanceWait, func() error {
			b, _ := os.ReadFile(console)
			if !bytes.Contains(b, []byte("bcd-init: disk boot")) {
				return fmt.Errorf("no boot marker on the VM's console yet (%d bytes)", len(b))
			}
			return nil
		})
		v.change(t, instances.Delete, in.ID)
		v.await(t, in.ID, "deleted")
		if n := v.liveBookings(t, in.ID); n != 0 {
			t.Fatalf("a deleted VM holds %d live allocations", n)
		}
	})

	t.Run("droplet", func(t *testing.T) {
		fake := v.s.Provider()
		settings := fake.Settings()
		settings.ListLag = 2 * time.Second // a new droplet is listed late
		fake.SetSettings(settings)
		for _, ft := range []dofake.Fault{
			{Count: 2, Kind: dofake.FaultStatus, Status: 429, RetryAfter: time.Second},
			{Method: "POST", Path: "/v2/droplets", Kind: dofake.FaultApplyThenDrop},
		} {
			if err := fake.Inject(ft); err != nil {
				t.Fatal(err)
			}
		}
		before := fake.DropletsCreated()
		in := v.create(t, instances.CreateInput{IdempotencyKey: "droplet", PoolID: vps.ProviderPoolID,
			FlavorID: v.flavors["s-1vcpu-1gb"], ProviderImage: providerImage, Name: "droplet"})
		running := v.await(t, in.ID, "running")
		if got := fake.DropletsCreated() - before; got != 1 {
			t.Fatalf("%d droplets created for one instance", got)
		}
		if n := len(fake.Faults()); n != 0 {
			t.Fatalf("%d injected faults never reached", n)
		}
		var droplet *dofake.DropletRecord
		for _, d := range fake.Droplets() {
			if d.Name == providers.ServerName(in.ID) {
				droplet = &d
			}
		}
		if droplet == nil || running.ProviderServerID != strconv.Itoa(droplet.ID) || running.Address == "" {
			t.Fatalf("instance %+v, droplet %+v", running, droplet)
		}
		v.change(t, instances.Delete, in.ID)
		v.await(t, in.ID, "deleted")
		if live := fake.Stats().DropletsLive; live != 0 {
			t.Fatalf("%d droplets live after the delete", live)
		}
	})
}

// registerTestDisk registers bare metal II's test disk (docs/testdisk.md)
// as a public fleet image: a VM flavor boots it.
func (v *vpsStack) registerTestDisk(tb testing.TB) string {
	tb.Helper()
	kernelDir := image.DefaultKernelDir()
	if _, _, err := image.FindKernel(kernelDir); err != nil {
		tb.Fatalf("no kernel cache (run `make kernel`): %v", err)
	}
	bcd, err := bcdBinary()
	if err != nil {
		tb.Fatal(err)
	}
	d, err := image.BuildDisk(context.Background(), image.DiskOptions{Options: image.Options{KernelDir: kernelDir, BCD: bcd,
		OutDir: filepath.Join(tb.TempDir(), "disk")}})
	if err != nil {
		tb.Fatal(err)
	}
	b, err := os.ReadFile(d.Image)
	if err != nil {
		tb.Fatal(err)
	}
	sum := sha256.Sum256(b)
	ctx := context.Background()
	reg, err := images.Register.Call(ctx, v.admin, images.RegisterInput{TenantID: rootTenant, Scope: images.ScopeFleet,
		Name: "testdisk", Version: "1", Format: "raw", SHA256: hex.EncodeToString(sum[:]), SizeBytes: int64(len(b)),
		IdempotencyKey: "e2e-testdisk"})
	if err != nil {
		tb.Fatal(err)
	}
	if reg.Upload != nil {
		if _, err := images.UploadBytes(ctx, v.admin.HTTP, v.admin.BaseURL, *reg.Upload, bytes.NewReader(b), int64(len(b))); err != nil {
			tb.Fatal(err)
		}
	}
	if _, err := images.Promote.Call(ctx, v.admin, images.ImageInput{TenantID: rootTenant, ImageID: reg.Image.ID}); err != nil {
		tb.Fatal(err)
	}
	return reg.Image.ID
}
