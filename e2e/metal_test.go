package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/better-compute/better-compute/activities/metal"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/ramdisk"
	"github.com/better-compute/better-compute/agent/ramdisk/image"
	"github.com/better-compute/better-compute/agent/ramdisk/image/imagetest"
	"github.com/better-compute/better-compute/agent/ramdisk/simboot"
	"github.com/better-compute/better-compute/api"
	apidrivers "github.com/better-compute/better-compute/api/drivers"
	apiimages "github.com/better-compute/better-compute/api/images"
	apimetal "github.com/better-compute/better-compute/api/metal"
	apinodes "github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/api/pools"
	apiprofiles "github.com/better-compute/better-compute/api/profiles"
	"github.com/better-compute/better-compute/api/rpc"
	apisecrets "github.com/better-compute/better-compute/api/secrets"
	"github.com/better-compute/better-compute/api/sites"
	apiworkflows "github.com/better-compute/better-compute/api/workflows"
	"github.com/better-compute/better-compute/core"
	coreimages "github.com/better-compute/better-compute/core/images"
	coreinv "github.com/better-compute/better-compute/core/inventory"
	"github.com/better-compute/better-compute/deploy/devstack"
	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/drivers/ipmisim"
	"github.com/better-compute/better-compute/drivers/machines"
	"github.com/better-compute/better-compute/drivers/machines/qemu"
	"github.com/better-compute/better-compute/drivers/machines/sim"
	"github.com/better-compute/better-compute/drivers/redfish/emulator"
	"github.com/better-compute/better-compute/internal/freeport"
	"github.com/better-compute/better-compute/internal/sshsigtest"
	"github.com/better-compute/better-compute/internal/testutil"
	"github.com/better-compute/better-compute/store"
	imagestore "github.com/better-compute/better-compute/store/images"
	storemetal "github.com/better-compute/better-compute/store/metal"
)

// metalWait bounds one lifecycle operation of a simulated machine; a QEMU
// boot under TCG on a loaded 2-core machine takes longer.
const (
	metalWait = 90 * time.Second
	qemuWait  = 4 * time.Minute
)

// metalRig is the bare-metal end to end: the dev stack (no demo agents), a
// site of its own whose `bcd site` is a real process serving the site's
// queue and its boot server, a pool there, the Redfish emulator of the
// test's machines, and the fleet secret of their BMC password.
type metalRig struct {
	t       *testing.T
	ctx     context.Context
	dir     string // the stack's directory
	stack   *devstack.Stack
	admin   *api.Client
	base    *image.Base
	siteID  string
	poolID  string
	emu     *emulator.Emulator
	secret  string // the BMC password's secret reference
	site    *siteAgent
	bootURL string
	// disk is the bootable test disk the rig's image holds; image its
	// registration (signed, verified) and profileID the profile that
	// deploys it with the default steps.
	disk      *image.Disk
	image     apiimages.Image
	signer    sshsigtest.Key
	profileID string
	// qemuProfileID deploys the test disk to a QEMU machine.
	qemuProfileID string
	// ramdiskProfileID deploys without writing a disk, for machines that
	// have none (the IPMI one): boot the ramdisk, run a program there,
	// power off.
	ramdiskProfileID string
}

// deployOp stands for metal.deploy in the lifecycle's tables: run deploys
// with the rig's profile.
const deployOp rpc.Ref[apimetal.NodeInput, apimetal.MetalNode] = "metal.deploy"

// deployIn is metal.deploy's input for the node with the rig's profile.
func (r *metalRig) deployIn(nodeID string) apimetal.DeployInput {
	return apimetal.DeployInput{TenantID: metalRoot, NodeID: nodeID, ProfileID: r.profileID}
}

// pushImage registers a file as an image of the root tenant, signed by the
// rig's signer, and uploads its bytes as the answer asks.
func (r *metalRig) pushImage(name, file string) apiimages.Image {
	r.t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		r.t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	reg, err := apiimages.Register.Call(r.ctx, r.admin, apiimages.RegisterInput{TenantID: metalRoot, Name: name, Version: "1",
		Format: "raw", SHA256: hex.EncodeToString(sum[:]), SizeBytes: int64(len(b)),
		Signature: r.signer.Sign(r.t, coreimages.SignatureNamespace, file)})
	if err != nil {
		r.t.Fatalf("register %s: %v", name, err)
	}
	if reg.Upload == nil {
		return reg.Image
	}
	im, err := apiimages.UploadBytes(r.ctx, nil, r.stack.APIURL(), *reg.Upload, bytes.NewReader(b), int64(len(b)))
	if err != nil {
		r.t.Fatalf("upload %s: %v", name, err)
	}
	return im
}

// profile creates a profile of the root tenant from its document.
func (r *metalRig) profile(name, doc string) string {
	r.t.Helper()
	p, err := apiprofiles.Create.Call(r.ctx, r.admin, apiprofiles.CreateInput{TenantID: metalRoot, Name: name, Document: json.RawMessage(doc)})
	if err != nil {
		r.t.Fatalf("profile %s: %v", name, err)
	}
	return p.ID
}

// addImage builds the test disk, allows the rig's signing key in the
// fleet's allowlist (with the operator's database access, as `better-compute
// image-signers add` does), pushes the disk as a signed image and makes the
// profiles that deploy it.
func (r *metalRig) addImage() {
	r.t.Helper()
	r.disk = imagetest.Disk(r.t, r.t.TempDir())
	r.signer = sshsigtest.NewKey(r.t, "e2e-signer")
	st, err := store.Open(r.ctx, r.stack.DatabaseURL())
	if err != nil {
		r.t.Fatal(err)
	}
	defer st.Close()
	catalog, err := core.DefaultCatalog()
	if err != nil {
		r.t.Fatal(err)
	}
	signers := imagestore.New(nil, metalRoot, catalog.FullName(imagestore.ResourceType), 0)
	if err := st.InTx(r.ctx, store.ReadWrite, func(tx store.Tx) error {
		_, _, err := signers.AddSigner(r.ctx, tx, metalRoot, r.signer.AuthorizedKey)
		return err
	}); err != nil {
		r.t.Fatal(err)
	}
	r.image = r.pushImage("e2e-disk", r.disk.Image)
	if !r.image.Verified || r.image.State != "available" {
		r.t.Fatalf("the signed test disk: %+v", r.image)
	}
	r.profileID = r.profile("e2e", `{"target": "metal", "image": {"name": "e2e-disk", "version": "1"}, "requireVerifiedImage": true,
		"hostConfig": {"hostname": "{{ .node.name }}"}}`)
	// QEMU fixes a machine's boot order when it starts, so a guest reboot
	// boots the ramdisk again: the VM is power-cycled through its BMC once
	// the boot device is the disk (as Ironic reboots to the instance).
	r.qemuProfileID = r.profile("e2e-qemu", `{"target": "metal", "image": {"name": "e2e-disk", "version": "1"}, "requireVerifiedImage": true,
		"hostConfig": {"hostname": "{{ .node.name }}"}, "steps": [
		{"name": "check-image", "on": "control-plane", "action": "check-image"},
		{"name": "stage-image", "on": "site", "action": "stage-image"},
		{"name": "boot-ramdisk", "on": "site", "action": "boot-ramdisk"},
		{"name": "write-image", "on": "ramdisk", "action": "write-image"},
		{"name": "write-seed", "on": "ramdisk", "action": "write-seed"},
		{"name": "boot-from-disk", "on": "site", "action": "set-boot-device", "args": {"device": "disk"}},
		{"name": "reboot", "on": "site", "action": "power", "args": {"action": "cycle"}, "await": "rejoin"}]}`)
	r.ramdiskProfileID = r.profile("e2e-ramdisk", `{"target": "metal", "image": {"name": "e2e-disk", "version": "1"}, "steps": [
		{"name": "boot-ramdisk", "on": "site", "action": "boot-ramdisk"},
		{"name": "check", "on": "ramdisk", "action": "exec", "args": {"argv": ["true"]}},
		{"name": "power-off", "on": "site", "action": "power", "args": {"action": "off"}}]}`)
}

// siteAgent is the rig's `bcd site`, a real process a test may kill.
type siteAgent struct {
	t    *testing.T
	bin  string
	args []string
	env  []string
	log  *lockedBuffer
	cmd  *exec.Cmd
	done chan error
	runs int
}

func (a *siteAgent) start() {
	a.t.Helper()
	a.runs++
	a.cmd = exec.Command(a.bin, append(a.args, "--holder", fmt.Sprintf("e2e-metal-site-%d", a.runs))...)
	a.cmd.Env = append(os.Environ(), a.env...)
	a.cmd.Stdout, a.cmd.Stderr = a.log, a.log
	if err := a.cmd.Start(); err != nil {
		a.t.Fatal(err)
	}
	a.done = make(chan error, 1)
	cmd, done := a.cmd, a.done
	go func() { done <- cmd.Wait() }()
}

func (a *siteAgent) kill() {
	a.t.Helper()
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		a.t.Fatal(err)
	}
	<-a.done
}

const metalRoot = "root"

func newMetalRig(t *testing.T) *metalRig {
	dir := stackDir(t)
	base := imagetest.Base(t, t.TempDir())
	bin, err := bcdBinary()
	if err != nil {
		t.Fatal(err)
	}
	pgPort, err := freeport.Pick("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	s, err := devstack.Start(context.Background(), devstack.Options{Dir: dir, APIAddr: "127.0.0.1:0", AgentAddr: "127.0.0.1:0",
		PostgresPort: pgPort, TemporalAddr: "127.0.0.1:0", UIAddr: "-", Agents: -1, BCD: bin, AgentHosts: []string{qemuHost},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatalf("devstack: %v", err)
	}
	t.Cleanup(func() { s.Stop(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	t.Cleanup(cancel)
	adminToken, err := s.AdminToken()
	if err != nil {
		t.Fatal(err)
	}
	r := &metalRig{t: t, ctx: ctx, dir: dir, stack: s, admin: api.NewClient(s.APIURL(), adminToken), base: base}

	st, err := sites.Create.Call(ctx, r.admin, sites.CreateInput{TenantID: metalRoot, Kind: "shared", Name: "metal-e2e",
		Region: "local", IAMRegion: "dev-local-1"})
	if err != nil {
		t.Fatal(err)
	}
	r.siteID = st.ID
	pool, err := pools.Create.Call(ctx, r.admin, pools.CreateInput{TenantID: metalRoot, SiteID: st.ID, Name: "metal",
		Class: "metal-host", GPUModel: "H100", GPUMemoryGb: 80})
	if err != nil {
		t.Fatal(err)
	}
	r.poolID = pool.ID
	r.addImage()
	tok, err := sites.CreateToken.Call(ctx, r.admin, sites.CreateTokenInput{TenantID: metalRoot, SiteID: st.ID, Name: "metal e2e"})
	if err != nil {
		t.Fatal(err)
	}

	// The BMCs' password: random, put as a fleet secret, never written
	// anywhere else by the test.
	var pw [12]byte
	if _, err := rand.Read(pw[:]); err != nil {
		t.Fatal(err)
	}
	password := hex.EncodeToString(pw[:])
	sec, err := apisecrets.Put.Call(ctx, r.admin, apisecrets.PutInput{TenantID: metalRoot, Scope: "fleet", Name: "bmc-admin", Value: password})
	if err != nil {
		t.Fatal(err)
	}
	r.secret = sec.Ref
	r.emu, err = emulator.New(emulator.Config{Username: "admin", Password: password, MediaDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.emu.Close() })

	bootPort, err := freeport.Pick("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	r.bootURL = fmt.Sprintf("http://127.0.0.1:%d", bootPort)
	// A QEMU guest reaches the host's loopback at 10.0.2.2 (user-mode
	// networking); simulated machines' ramdisks are told the API's own URL.
	// The deployed system re-joins the agent listener there too.
	apiPort := r.stack.APIURL()[strings.LastIndex(r.stack.APIURL(), ":")+1:]
	agentPort := r.stack.AgentURL()[strings.LastIndex(r.stack.AgentURL(), ":")+1:]
	r.site = &siteAgent{t: t, bin: bin, log: &lockedBuffer{},
		args: []string{"site", "--api", s.APIURL(), "--boot-listen", fmt.Sprintf("127.0.0.1:%d", bootPort), "--boot-url", r.bootURL,
			"--machine-boot-url", fmt.Sprintf("http://%s:%d", qemuHost, bootPort),
			"--machine-api-url", "http://" + qemuHost + ":" + apiPort, "--machine-agent-endpoint", "https://" + qemuHost + ":" + agentPort,
			"--kernel", base.Kernel, "--ramdisk", base.Initrd,
			"--boot-dir", t.TempDir(), "--bmc-readback", "2s"},
		env: []string{"BCD_SITE_TOKEN=" + tok.Token}}
	r.site.start()
	t.Cleanup(func() {
		_ = r.site.cmd.Process.Kill()
		if t.Failed() || os.Getenv("BC_E2E_SITE_LOG") != "" {
			t.Logf("bcd site:\n%s", r.site.log.String())
		}
		if strings.Contains(r.site.log.String(), password) {
			t.Errorf("the BMC password is in bcd site's log")
		}
	})
	return r
}

// simMachine is a simulated machine behind its own emulated BMC, whose
// ramdisk boots run in the test process (simboot) and report to the API.
func (r *metalRig) simMachine(name string, inv func(machines.Info) *coreinv.NodeInventory) (*sim.Machine, *emulator.BMC) {
	return r.simMachineWith(name, simboot.Options{Inventory: inv})
}

// simMachineWith is simMachine with the boot hook's options o. The machine
// runs on the host but is told the addresses a QEMU guest uses: its HTTP
// client reaches qemuHost at the loopback, as QEMU's user-mode network
// does, and the installed system's session goes to the agent listener's
// own address.
func (r *metalRig) simMachineWith(name string, o simboot.Options) (*sim.Machine, *emulator.BMC) {
	r.t.Helper()
	info := machineInfo(name)
	o.APIURL, o.AgentEndpoint, o.Client = r.stack.APIURL(), r.stack.AgentURL(), natClient()
	o.RetryMin, o.RetryMax, o.WaitInterval = 50*time.Millisecond, 500*time.Millisecond, 500*time.Millisecond
	m := sim.New(sim.Config{Info: info, Hook: simboot.Hook(o)})
	bmc, err := r.emu.AddBMC(name, m)
	if err != nil {
		r.t.Fatal(err)
	}
	return m, bmc
}

// machineInfo is a machine's identity, unique per name.
func machineInfo(name string) machines.Info {
	sum := sha256.Sum256([]byte(name))
	h := hex.EncodeToString(sum[:])
	mac := fmt.Sprintf("52:54:00:%02x:%02x:%02x", h[0], h[1], h[2])
	return machines.Info{Manufacturer: "Better Compute", Model: "e2e", SerialNumber: "SN-" + name,
		UUID: fmt.Sprintf("%s-%s-%s-%s-%s", h[0:8], h[8:12], h[12:16], h[16:20], h[20:32]), MAC: mac, CPUs: 2, MemoryMiB: 512}
}

func (r *metalRig) enrollRedfish(name string, bmc *emulator.BMC) apimetal.MetalNode {
	r.t.Helper()
	n, err := apimetal.Enroll.Call(r.ctx, r.admin, apimetal.EnrollInput{TenantID: metalRoot, PoolID: r.poolID, Name: name,
		BMC: apimetal.BMCInput{Redfish: &apimetal.RedfishInput{Address: bmc.URL(), Username: "admin", PasswordSecret: r.secret,
			CAPEM: string(r.emu.CAPEM())}},
		BootMAC: bmc.Machine().Info().MAC})
	if err != nil {
		r.t.Fatalf("enroll %s: %v", name, err)
	}
	return n
}

func (r *metalRig) get(nodeID string) apinodes.NodeDetail {
	r.t.Helper()
	n, err := apinodes.Get.Call(r.ctx, r.admin, apinodes.NodeInput{TenantID: metalRoot, NodeID: nodeID})
	if err != nil {
		r.t.Fatal(err)
	}
	if n.Metal == nil {
		r.t.Fatalf("nodes.get of %s has no metal lifecycle", nodeID)
	}
	return n
}

// run begins op on the node and waits until it ends in want, returning how
// long it took.
func (r *metalRig) run(ref rpc.Ref[apimetal.NodeInput, apimetal.MetalNode], nodeID, want string, within time.Duration) time.Duration {
	r.t.Helper()
	start := time.Now()
	var err error
	if ref == deployOp {
		_, err = apimetal.Deploy.Call(r.ctx, r.admin, r.deployIn(nodeID))
	} else {
		_, err = ref.Call(r.ctx, r.admin, apimetal.NodeInput{TenantID: metalRoot, NodeID: nodeID})
	}
	if err != nil {
		r.t.Fatalf("%s: %v", ref, err)
	}
	r.await(nodeID, want, within)
	return time.Since(start)
}

// await waits until the node has no operation in flight, and fails the
// test unless it is then in want.
func (r *metalRig) await(nodeID, want string, within time.Duration) apinodes.NodeDetail {
	r.t.Helper()
	var n apinodes.NodeDetail
	start, last := time.Now(), ""
	defer func() {
		if r.t.Failed() {
			if w, err := apiworkflows.Get.Call(r.ctx, r.admin, apiworkflows.GetInput{TenantID: metalRoot, NodeID: nodeID}); err == nil {
				r.t.Logf("workflow %s of %s is %s at step %q:", w.ID, nodeID, w.State, w.Step)
				logSteps(r.t, w)
			}
		}
	}()
	testutil.Eventually(r.t, within, "the operation on "+nodeID+" to end", func() bool {
		n = r.get(nodeID)
		if step := n.Metal.Lifecycle.Step; step != last && os.Getenv("BC_E2E_SITE_LOG") != "" {
			r.t.Logf("%s: step %q at %s", nodeID, step, time.Since(start).Round(time.Millisecond))
			last = step
		}
		return n.Metal.Lifecycle.Operation == ""
	})
	if n.Metal.Lifecycle.State != want {
		r.t.Fatalf("node %s is %s, want %s (last error %+v)", nodeID, n.Metal.Lifecycle.State, want, n.Metal.Lifecycle.LastError)
	}
	return n
}

// awaitStep waits until the node's operation is at step.
func (r *metalRig) awaitStep(nodeID, step string, within time.Duration) {
	r.t.Helper()
	testutil.Eventually(r.t, within, nodeID+" at step "+step, func() bool {
		return r.get(nodeID).Metal.Lifecycle.Step == step
	})
}

// historyEvents counts the events of every run of the node's lifecycle
// workflow.
func (r *metalRig) historyEvents(nodeID string) (runs, events int) {
	r.t.Helper()
	c := r.stack.Client()
	resp, err := c.ListWorkflow(r.ctx, &workflowservice.ListWorkflowExecutionsRequest{Namespace: devstack.Namespace,
		Query: fmt.Sprintf("WorkflowId = '%s'", metal.MetalWorkflowID(nodeID))})
	if err != nil {
		r.t.Fatal(err)
	}
	for _, e := range resp.Executions {
		it := c.GetWorkflowHistory(r.ctx, e.Execution.WorkflowId, e.Execution.RunId, false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		for it.HasNext() {
			if _, err := it.Next(); err != nil {
				r.t.Fatal(err)
			}
			events++
		}
		runs++
	}
	return runs, events
}

// wholeLifecycle is every operation of a machine's life, in order, and the
// state each ends in.
var wholeLifecycle = []struct {
	name string
	ref  rpc.Ref[apimetal.NodeInput, apimetal.MetalNode]
	want string
}{
	{"manage", apimetal.Manage, "enrolling"},
	{"inspect", apimetal.Inspect, "enrolling"},
	{"provide", apimetal.Provide, "ready"},
	{"deploy", deployOp, "deployed"},
	{"undeploy", apimetal.Undeploy, "ready"},
	{"retire", apimetal.Retire, "retired"},
}

func TestMetal(t *testing.T) {
	r := newMetalRig(t)

	// The whole lifecycle of a QEMU machine behind the Redfish emulator: its
	// inventory comes from inside the VM, through QEMU's user-mode network.
	t.Run("QEMULifecycle", func(t *testing.T) {
		rt := *r
		rt.t = t
		// The disk holds the test disk (40 MiB) and the seed after it.
		m, err := qemu.New(qemu.Config{Info: machineInfo("qemu-1"), Dir: t.TempDir(), CDMode: qemu.ModeDirect, DiskMiB: 96})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				log := m.SerialLog()
				t.Logf("the VM's serial console (last %d bytes):\n%s", min(len(log), 8192), log[max(0, len(log)-8192):])
			}
			m.Close()
		})
		bmc, err := r.emu.AddBMC("qemu-1", m)
		if err != nil {
			t.Fatal(err)
		}
		rt.profileID = r.qemuProfileID
		n := rt.enrollRedfish("qemu-1", bmc)
		id := n.Node.ID
		for _, s := range wholeLifecycle {
			took := rt.run(s.ref, id, s.want, qemuWait)
			t.Logf("qemu %s: %s", s.name, took.Round(10*time.Millisecond))
			if s.name == "deploy" {
				rt.checkDeployed(id, m.DiskPath(), m.Boots())
			}
			if s.name == "inspect" {
				got := rt.get(id)
				if !got.Metal.Lifecycle.Inspected || got.HardwareKey == "" {
					t.Fatalf("inspected node %+v", got)
				}
				inv := nodeInventory(t, &rt, id)
				if len(inv.Disks) == 0 || !slices.ContainsFunc(inv.NICs, func(nic coreinv.NIC) bool {
					return strings.EqualFold(nic.MAC, m.Info().MAC)
				}) {
					t.Fatalf("the VM's inventory lacks its disk or NIC: %+v", inv)
				}
			}
		}
		runs, events := rt.historyEvents(id)
		t.Logf("qemu lifecycle: %d workflow runs, %d history events, %d VM boots", runs, events, m.Boots())
		if p := rt.get(id).Metal.Lifecycle.Power; p != "off" {
			t.Errorf("a retired machine's power is %s", p)
		}
	})
	// The same lifecycle for a machine behind Debian's fakebmc (real IPMI
	// through bmclib's ipmitool provider) whose network boots are
	// simulated: it PXE-boots the site's boot server by its MAC.
	t.Run("IPMILifecycle", func(t *testing.T) {
		rt := *r
		rt.t = t
		fake := ipmisim.Start(t)
		sec, err := apisecrets.Put.Call(r.ctx, r.admin, apisecrets.PutInput{TenantID: metalRoot, Scope: "fleet", Name: "ipmi-admin", Value: ipmisim.Password})
		if err != nil {
			t.Fatal(err)
		}
		info := machineInfo("ipmi-1")
		pxe := rt.pxeMachine(fake, info)
		// Its simulated network boots have no disk: its deploy runs a
		// program in the ramdisk and powers off.
		rt.profileID = r.ramdiskProfileID
		n, err := apimetal.Enroll.Call(r.ctx, r.admin, apimetal.EnrollInput{TenantID: metalRoot, PoolID: r.poolID, Name: "ipmi-1",
			BMC:     apimetal.BMCInput{IPMI: &apimetal.IPMIInput{Address: fake.Addr, Username: ipmisim.Username, PasswordSecret: sec.Ref}},
			BootMAC: info.MAC})
		if err != nil {
			t.Fatal(err)
		}
		id := n.Node.ID
		for _, s := range wholeLifecycle {
			took := rt.run(s.ref, id, s.want, metalWait)
			t.Logf("ipmi %s: %s", s.name, took.Round(10*time.Millisecond))
		}
		runs, events := rt.historyEvents(id)
		t.Logf("ipmi lifecycle: %d workflow runs, %d history events, %d PXE boots", runs, events, pxe.boots())
		if pxe.boots() < 4 {
			t.Errorf("%d PXE boots, want inspect, provide, deploy and undeploy's", pxe.boots())
		}
	})

	// The simulated machines behind the Redfish emulator, one per test.
	ready := func(t *testing.T, rt *metalRig, name string) (string, *sim.Machine, *emulator.BMC) {
		m, bmc := rt.simMachine(name, nil)
		id := rt.enrollRedfish(name, bmc).Node.ID
		rt.run(apimetal.Manage, id, "enrolling", metalWait)
		rt.run(apimetal.Inspect, id, "enrolling", metalWait)
		rt.run(apimetal.Provide, id, "ready", metalWait)
		return id, m, bmc
	}

	t.Run("AbortMidInspect", func(t *testing.T) {
		rt := *r
		rt.t = t
		// A machine whose boots never report: inspect waits for its ramdisk.
		m := sim.New(sim.Config{Info: machineInfo("silent-1")})
		bmc, err := r.emu.AddBMC("silent-1", m)
		if err != nil {
			t.Fatal(err)
		}
		id := rt.enrollRedfish("silent-1", bmc).Node.ID
		rt.run(apimetal.Manage, id, "enrolling", metalWait)
		if _, err := apimetal.Inspect.Call(r.ctx, r.admin, apimetal.NodeInput{TenantID: metalRoot, NodeID: id}); err != nil {
			t.Fatal(err)
		}
		rt.awaitStep(id, "await-ramdisk", metalWait)
		aborted, err := apimetal.Abort.Call(r.ctx, r.admin, apimetal.NodeInput{TenantID: metalRoot, NodeID: id})
		if err != nil {
			t.Fatal(err)
		}
		if aborted.Lifecycle.State != "failed" || aborted.Lifecycle.LastError == nil || aborted.Lifecycle.LastError.Reason != "aborted" ||
			aborted.Lifecycle.LastError.Step != "await-ramdisk" {
			t.Fatalf("aborted: %+v", aborted.Lifecycle)
		}
		testutil.Eventually(t, metalWait, "the aborted machine powered off", func() bool {
			p, _ := m.PowerState(r.ctx)
			return p == drivers.PowerOff
		})
		// recover takes it back to where the inspection started.
		rt.run(apimetal.Recover, id, "enrolling", metalWait)
		// and a transition the table refuses names what is allowed.
		_, err = apimetal.Deploy.Call(r.ctx, r.admin, r.deployIn(id))
		var ce *core.Error
		if !errorsAs(err, &ce) || ce.Code != core.CodeInvalidState {
			t.Fatalf("deploy from enrolling: %v", err)
		}
		if allowed, _ := ce.Details["allowed"].([]any); len(allowed) == 0 {
			t.Fatalf("INVALID_STATE without the allowed operations: %+v", ce.Details)
		}
	})

	t.Run("SiteAgentKilledDuringDeploy", func(t *testing.T) {
		rt := *r
		rt.t = t
		id, _, _ := ready(t, &rt, "kill-1")
		if _, err := apimetal.Deploy.Call(r.ctx, r.admin, r.deployIn(id)); err != nil {
			t.Fatal(err)
		}
		r.site.kill()
		r.site.start()
		rt.await(id, "deployed", metalWait)
	})

	t.Run("RescueUnrescue", func(t *testing.T) {
		rt := *r
		rt.t = t
		id, m, _ := ready(t, &rt, "rescue-1")
		rt.run(deployOp, id, "deployed", metalWait)
		rt.run(apimetal.Rescue, id, "rescue", metalWait)
		rt.run(apimetal.Unrescue, id, "deployed", metalWait)
		if p, _ := m.PowerState(r.ctx); p != drivers.PowerOn {
			t.Fatalf("an unrescued machine is %s", p)
		}
	})

	t.Run("Power", func(t *testing.T) {
		rt := *r
		rt.t = t
		m, bmc := rt.simMachine("power-1", nil)
		id := rt.enrollRedfish("power-1", bmc).Node.ID
		rt.run(apimetal.Manage, id, "enrolling", metalWait)
		for _, c := range []struct {
			action apimetal.PowerAction
			want   drivers.PowerState
		}{{apimetal.PowerOn, drivers.PowerOn}, {apimetal.PowerOff, drivers.PowerOff}, {apimetal.PowerCycle, drivers.PowerOn}, {apimetal.PowerReset, drivers.PowerOn}} {
			boots := len(m.Boots())
			n, err := apimetal.Power.Call(r.ctx, r.admin, apimetal.PowerInput{TenantID: metalRoot, NodeID: id, Action: c.action})
			if err != nil {
				t.Fatalf("power %s: %v", c.action, err)
			}
			if n.Lifecycle.Operation == "" && n.Lifecycle.Power != string(c.want) {
				t.Fatalf("power %s answered %s", c.action, n.Lifecycle.Power)
			}
			rt.await(id, "enrolling", metalWait)
			if p, _ := m.PowerState(r.ctx); p != c.want {
				t.Fatalf("after power %s the machine is %s", c.action, p)
			}
			if (c.action == apimetal.PowerCycle || c.action == apimetal.PowerReset) && len(m.Boots()) <= boots {
				t.Fatalf("power %s did not boot the machine again", c.action)
			}
		}
		// A BMC that acknowledges a power-off it never applies: the read-back
		// retries, then the operation fails with the driver's reason.
		bmc.SetFaults(emulator.Faults{AckNotApply: emulator.Always})
		if _, err := apimetal.Power.Call(r.ctx, r.admin, apimetal.PowerInput{TenantID: metalRoot, NodeID: id, Action: apimetal.PowerOff}); err != nil {
			t.Fatal(err)
		}
		n := rt.await(id, "failed", metalWait)
		if n.Metal.Lifecycle.LastError == nil || n.Metal.Lifecycle.LastError.Reason != "bmc" || bmc.NotApplied() == 0 {
			t.Fatalf("an unapplied power-off: %+v, %d writes not applied", n.Metal.Lifecycle.LastError, bmc.NotApplied())
		}
		bmc.SetFaults(emulator.Faults{})
		rt.run(apimetal.Recover, id, "enrolling", metalWait)
	})

	t.Run("Bulk", func(t *testing.T) {
		rt := *r
		rt.t = t
		var ids []string
		for i := range 3 {
			_, bmc := rt.simMachine(fmt.Sprintf("bulk-%d", i), nil)
			ids = append(ids, rt.enrollRedfish(fmt.Sprintf("bulk-%d", i), bmc).Node.ID)
		}
		res, err := apimetal.Bulk.Call(r.ctx, r.admin, apimetal.BulkInput{TenantID: metalRoot, PoolID: r.poolID, Operation: "manage",
			NodeIDs: append(slices.Clone(ids), "node_00000000000000000000000000"), Concurrency: 2})
		if err != nil {
			t.Fatal(err)
		}
		accepted := 0
		for _, it := range res.Results {
			if it.Accepted {
				accepted++
			} else if it.Code != string(core.CodeNotFound) {
				t.Fatalf("bulk item %+v", it)
			}
		}
		if accepted != 3 {
			t.Fatalf("bulk accepted %d of 3: %+v", accepted, res.Results)
		}
		for _, id := range ids {
			if n := rt.await(id, "enrolling", metalWait); !n.Metal.Lifecycle.Managed {
				t.Fatalf("bulk-managed node %s is not managed", id)
			}
		}
	})

	t.Run("DiscoveredAndConfirmMac", func(t *testing.T) {
		rt := *r
		rt.t = t
		// A machine nobody enrolled network-boots the site's boot server.
		info := machineInfo("stray-1")
		cfg := rt.bootConfigByMAC(info.MAC)
		if !strings.HasPrefix(cfg.Token, protocol.DiscoveryTokenPrefix) {
			t.Fatalf("an unknown MAC got %q, not the discovery config", cfg.Purpose)
		}
		cfg.APIURL = r.stack.APIURL()
		off := make(chan struct{})
		a := &ramdisk.Agent{Config: cfg, BootMAC: info.MAC, RetryMin: 50 * time.Millisecond, RetryMax: 500 * time.Millisecond,
			Machine: &ramdisk.Simulated{Document: simboot.InventoryFor(info), OnPowerOff: func() { close(off) }}}
		if err := a.Run(r.ctx); err != nil {
			t.Fatal(err)
		}
		<-off
		found, err := apimetal.ListFound.Call(r.ctx, r.admin, apimetal.DiscoveredInput{TenantID: metalRoot, SiteID: r.siteID})
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(found.Items, func(d storemetal.Discovered) bool { return d.BootMAC == info.MAC })
		if i < 0 {
			t.Fatalf("discovered %+v, no %s", found.Items, info.MAC)
		}
		// Its operator enrolls it and confirms its boot MAC: the discovered
		// machine is that node now.
		m := sim.New(sim.Config{Info: info})
		bmc, err := r.emu.AddBMC("stray-1", m)
		if err != nil {
			t.Fatal(err)
		}
		n, err := apimetal.Enroll.Call(r.ctx, r.admin, apimetal.EnrollInput{TenantID: metalRoot, PoolID: r.poolID, Name: "stray-1",
			BMC: apimetal.BMCInput{Redfish: &apimetal.RedfishInput{Address: bmc.URL(), Username: "admin", PasswordSecret: r.secret, CAPEM: string(r.emu.CAPEM())}}})
		if err != nil {
			t.Fatal(err)
		}
		confirmed, err := apimetal.ConfirmMAC.Call(r.ctx, r.admin, apimetal.ConfirmMACInput{TenantID: metalRoot, NodeID: n.Node.ID, MAC: strings.ToUpper(info.MAC)})
		if err != nil {
			t.Fatal(err)
		}
		if confirmed.BMC.BootMAC != info.MAC || confirmed.BMC.BootMACConfirmedAt == nil {
			t.Fatalf("confirmMac: %+v", confirmed.BMC)
		}
		found, err = apimetal.ListFound.Call(r.ctx, r.admin, apimetal.DiscoveredInput{TenantID: metalRoot, SiteID: r.siteID})
		if err != nil {
			t.Fatal(err)
		}
		i = slices.IndexFunc(found.Items, func(d storemetal.Discovered) bool { return d.BootMAC == info.MAC })
		if i < 0 || found.Items[i].NodeID != n.Node.ID {
			t.Fatalf("the discovered machine is not linked to %s: %+v", n.Node.ID, found.Items)
		}
	})

	// Wrong credentials: manage fails with the driver's reason, and the
	// node stays where it was, nothing half-done.
	t.Run("WrongCredentials", func(t *testing.T) {
		rt := *r
		rt.t = t
		sec, err := apisecrets.Put.Call(r.ctx, r.admin, apisecrets.PutInput{TenantID: metalRoot, Scope: "fleet", Name: "wrong-password",
			Value: "not-the-password"})
		if err != nil {
			t.Fatal(err)
		}
		m, bmc := rt.simMachine("wrong-1", nil)
		n, err := apimetal.Enroll.Call(r.ctx, r.admin, apimetal.EnrollInput{TenantID: metalRoot, PoolID: r.poolID, Name: "wrong-1",
			BMC: apimetal.BMCInput{Redfish: &apimetal.RedfishInput{Address: bmc.URL(), Username: "admin", PasswordSecret: sec.Ref, CAPEM: string(r.emu.CAPEM())}}})
		if err != nil {
			t.Fatal(err)
		}
		rt.run(apimetal.Manage, n.Node.ID, "failed", metalWait)
		e := rt.get(n.Node.ID).Metal.Lifecycle.LastError
		if e == nil || e.Reason != "bmc" || e.Step != "verify-bmc" || !strings.Contains(strings.ToLower(e.Message), "credential") {
			t.Fatalf("manage with a wrong password: %+v", e)
		}
		if p, _ := m.PowerState(r.ctx); p != drivers.PowerOff || len(m.Boots()) != 0 {
			t.Fatalf("a machine whose BMC refused the credentials was touched: %s, %d boots", p, len(m.Boots()))
		}
	})

	t.Run("SecretDeletedAndDriversList", func(t *testing.T) {
		rt := *r
		rt.t = t
		sec, err := apisecrets.Put.Call(r.ctx, r.admin, apisecrets.PutInput{TenantID: metalRoot, Scope: "fleet", Name: "short-lived",
			Value: "not-the-password"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := apisecrets.Delete.Call(r.ctx, r.admin, apisecrets.DeleteInput{TenantID: metalRoot, Scope: "fleet", Name: "short-lived"}); err != nil {
			t.Fatal(err)
		}
		_, bmc := rt.simMachine("gone-1", nil)
		_, err = apimetal.Enroll.Call(r.ctx, r.admin, apimetal.EnrollInput{TenantID: metalRoot, PoolID: r.poolID, Name: "gone-1",
			BMC: apimetal.BMCInput{Redfish: &apimetal.RedfishInput{Address: bmc.URL(), Username: "admin", PasswordSecret: sec.Ref, CAPEM: string(r.emu.CAPEM())}}})
		var ce *core.Error
		if !errorsAs(err, &ce) || ce.Code != core.CodeInvalidInput {
			t.Fatalf("enroll with a deleted secret: %v", err)
		}
		list, err := apidrivers.List.Call(r.ctx, r.admin, rpc.TenantListInput{TenantID: metalRoot})
		if err != nil {
			t.Fatal(err)
		}
		names := map[string]bool{}
		for _, d := range list.Items {
			names[d.Name] = len(d.Concerns) > 0
		}
		if !names[drivers.DriverRedfish] || !names[drivers.DriverIPMI] {
			t.Fatalf("drivers.list: %+v", list.Items)
		}
	})
	testDeploys(t, r)
}

// pxeSim is a simulated machine behind a fakebmc: when the BMC powers it
// on with its next boot from PXE, it fetches its boot config from the
// site's boot server by MAC and runs the ramdisk in process; the ramdisk's
// power-off is the BMC's.
type pxeSim struct {
	mu sync.Mutex
	n  int
}

func (p *pxeSim) boots() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

func (r *metalRig) pxeMachine(fake *ipmisim.BMC, info machines.Info) *pxeSim {
	r.t.Helper()
	p := &pxeSim{}
	ctx, cancel := context.WithCancel(r.ctx)
	r.t.Cleanup(cancel)
	stop := func() {}
	fake.OnPower(func(on bool) {
		p.mu.Lock()
		defer p.mu.Unlock()
		stop()
		stop = func() {}
		if !on {
			return
		}
		bctx, cancelBoot := context.WithCancel(ctx)
		stop = cancelBoot
		go func() {
			// The next boot's device, as the BMC holds it: a network boot
			// runs the ramdisk the boot server gives this MAC.
			boot, _ := fake.Ipmitool(bctx, "chassis", "bootparam", "get", "5")
			if !strings.Contains(boot, "PXE") {
				return
			}
			p.mu.Lock()
			p.n++
			p.mu.Unlock()
			r.runPXEBoot(bctx, fake, info)
		}()
	})
	return p
}

func (r *metalRig) runPXEBoot(ctx context.Context, fake *ipmisim.BMC, info machines.Info) {
	cfg := r.bootConfigByMAC(info.MAC)
	cfg.APIURL = r.stack.APIURL()
	a := &ramdisk.Agent{Config: cfg, BootMAC: info.MAC, RetryMin: 50 * time.Millisecond, RetryMax: 500 * time.Millisecond,
		WaitInterval: 500 * time.Millisecond,
		Machine: &ramdisk.Simulated{Document: simboot.InventoryFor(info), OnPowerOff: func() {
			_, _ = fake.Ipmitool(context.WithoutCancel(ctx), "chassis", "power", "off")
		}}}
	_ = a.Run(ctx)
}

// bootConfigByMAC is what the site's boot server gives a machine that
// network-boots with mac.
func (r *metalRig) bootConfigByMAC(mac string) protocol.RamdiskBootConfig {
	r.t.Helper()
	resp, err := http.Get(r.bootURL + "/boot/mac/" + mac + "/boot.json")
	if err != nil {
		r.t.Error(err)
		return protocol.RamdiskBootConfig{}
	}
	defer resp.Body.Close()
	var cfg protocol.RamdiskBootConfig
	if err := json.NewDecoder(resp.Body).Decode(&cfg); err != nil || resp.StatusCode != http.StatusOK {
		r.t.Errorf("boot config of %s: %d %v", mac, resp.StatusCode, err)
	}
	return cfg
}

func errorsAs(err error, target **core.Error) bool { return errors.As(err, target) }

// nodeInventory is the node's latest inventory document.
func nodeInventory(t *testing.T, r *metalRig, nodeID string) coreinv.NodeInventory {
	t.Helper()
	snap, err := apinodes.GetInventory.Call(r.ctx, r.admin, apinodes.InventoryInput{TenantID: metalRoot, NodeID: nodeID})
	if err != nil {
		t.Fatal(err)
	}
	var doc coreinv.NodeInventory
	if err := json.Unmarshal(snap.Document, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// qemuHost is the host as a QEMU guest on user-mode networking reaches it.
const qemuHost = "10.0.2.2"

// natClient is an HTTP client that reaches qemuHost at the host's
// loopback, as a QEMU guest does, for simulated machines on the host.
func natClient() *http.Client {
	var d net.Dialer
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if host, port, err := net.SplitHostPort(addr); err == nil && host == qemuHost {
			addr = net.JoinHostPort("127.0.0.1", port)
		}
		return d.DialContext(ctx, network, addr)
	}
	return &http.Client{Transport: tr}
}
