// Package runtime runs a node's VPS instances (docs/instance-runtime.md):
// it converges on the NodeSpec's instance list, in the background and one
// step at a time per instance, with runc containers (runtime "container"),
// gVisor sandboxes (runtime "gvisor", runsc) and QEMU VMs (runtime "vm"), and reports each instance's observed state
// in instances frames.
package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"sync"
	"time"

	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/agent/protocol"
)

// Runtimes of nodespec.Instance.
const (
	KindContainer = "container"
	KindGVisor    = "gvisor"
	KindVM        = "vm"
)

// Defaults of Options.
const (
	DefaultBridge     = "bcbr0"
	DefaultSubnet     = "10.213.0.1/16"
	DefaultStopGrace  = 10 * time.Second
	DefaultPidsLimit  = 4096
	DefaultResyncEach = 15 * time.Second
	// cpuPeriod is the CFS period a container's quota is counted in (µs).
	cpuPeriod = 100000
)

// idPattern keeps an instance id a safe file, runc and netns name.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// Options configures a Runtime.
type Options struct {
	// StateDir is the agent's state directory: instances live under
	// <StateDir>/instances/<id>, images under <StateDir>/images, runc's
	// state under <StateDir>/runc.
	StateDir string
	// Endpoint is the agent listener's base URL (the identity's
	// AgentEndpoint) and Client the node's mutual-TLS client
	// (session.NewHTTPClient): images and user data come from there.
	Endpoint string
	Client   *http.Client
	// Bridge and Subnet are the node's instance network: the bridge gets
	// the subnet's address (the gateway), each container one of the rest
	// (DefaultBridge, DefaultSubnet).
	Bridge string
	Subnet string
	// StopGrace is how long a stop waits after SIGTERM (a VM: after the
	// ACPI power-down) before it kills (DefaultStopGrace).
	StopGrace time.Duration
	// PidsLimit bounds a container's processes (DefaultPidsLimit).
	PidsLimit int64
	// CDIDir is where an instance's CDI spec is written (its GPUs);
	// empty: <StateDir>/cdi.
	CDIDir string
	// ResyncEvery is how often the runtime looks at every instance again,
	// to notice a container or VM that stopped by itself
	// (DefaultResyncEach); negative: never.
	ResyncEvery time.Duration
	// Runc, Runsc and QEMU name the binaries ("runc", "runsc",
	// "qemu-system-x86_64").
	Runc, Runsc, QEMU, QEMUImg string
	Logger                     *slog.Logger
	// Now is the clock (time.Now).
	Now func() time.Time
}

// Runtime converges the node's instances on the spec. Create it with New,
// run it with Run; OnSpec and OnSession are the agent session's hooks.
type Runtime struct {
	o      Options
	log    *slog.Logger
	prefix netip.Prefix
	gw     netip.Addr

	netMu   sync.Mutex // the bridge and address allocation
	imageMu sync.Mutex // one fetch per image digest
	images  map[string]*sync.Mutex

	mu        sync.Mutex
	ctx       context.Context
	specKnown bool
	// generation is the spec's the runtime converges on.
	generation int64
	// retry marks the instances a spec came for since their last step: a
	// failed one is tried again then, not on a resync.
	retry    map[string]bool
	desired  map[string]nodespec.Instance
	workers  map[string]chan struct{}
	statuses map[string]protocol.InstanceStatus
	sessions map[*reporter]bool
	wg       sync.WaitGroup
	vols     *volumeState // volumes.go
}

// New checks o and answers a Runtime; nothing runs until Run.
func New(o Options) (*Runtime, error) {
	if o.StateDir == "" {
		return nil, errors.New("runtime: no state directory")
	}
	if o.Bridge == "" {
		o.Bridge = DefaultBridge
	}
	if len(o.Bridge) > 15 {
		return nil, fmt.Errorf("runtime: bridge name %q is longer than 15 characters", o.Bridge)
	}
	if o.Subnet == "" {
		o.Subnet = DefaultSubnet
	}
	pfx, err := netip.ParsePrefix(o.Subnet)
	if err != nil || !pfx.Addr().Is4() || pfx.Bits() > 30 {
		return nil, fmt.Errorf("runtime: subnet %q is not an IPv4 gateway/prefix of at most /30", o.Subnet)
	}
	if o.StopGrace <= 0 {
		o.StopGrace = DefaultStopGrace
	}
	if o.PidsLimit <= 0 {
		o.PidsLimit = DefaultPidsLimit
	}
	if o.ResyncEvery == 0 {
		o.ResyncEvery = DefaultResyncEach
	}
	if o.CDIDir == "" {
		o.CDIDir = filepath.Join(o.StateDir, "cdi")
	}
	if o.Runc == "" {
		o.Runc = "runc"
	}
	if o.Runsc == "" {
		o.Runsc = "runsc"
	}
	if o.QEMU == "" {
		o.QEMU = "qemu-system-x86_64"
	}
	if o.QEMUImg == "" {
		o.QEMUImg = "qemu-img"
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Runtime{o: o, log: o.Logger.With("component", "runtime"), prefix: pfx.Masked(), gw: pfx.Addr(),
		images: map[string]*sync.Mutex{}, desired: map[string]nodespec.Instance{}, workers: map[string]chan struct{}{},
		statuses: map[string]protocol.InstanceStatus{}, sessions: map[*reporter]bool{}, retry: map[string]bool{}}, nil
}

func (r *Runtime) instancesDir() string         { return filepath.Join(r.o.StateDir, "instances") }
func (r *Runtime) instanceDir(id string) string { return filepath.Join(r.instancesDir(), id) }

// Run converges from the spec kept in the state directory (nodespec.File),
// then on each OnSpec, until ctx ends; it waits for the instance workers
// to finish their step before it returns. Instances keep running.
func (r *Runtime) Run(ctx context.Context) error {
	for _, d := range []string{r.instancesDir(), filepath.Join(r.o.StateDir, "images"), r.runcRoot(), r.runscRoot(), r.snapshotsDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("runtime: %w", err)
		}
	}
	r.mu.Lock()
	r.ctx = ctx
	r.mu.Unlock()
	// Downloads a crash cut short.
	if stale, err := filepath.Glob(filepath.Join(r.o.StateDir, "images", "sha256", ".fetch-*")); err == nil {
		for _, p := range stale {
			_ = os.Remove(p)
		}
	}
	if gen, spec, err := readKeptSpec(r.o.StateDir); err != nil {
		r.log.Error("runtime: the kept node spec", "error", err)
	} else if gen > 0 {
		r.OnSpec(gen, spec)
	}
	// A spec given before Run converges now.
	r.kickAll()
	var tick <-chan time.Time
	if r.o.ResyncEvery > 0 {
		t := time.NewTicker(r.o.ResyncEvery)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			r.wg.Wait()
			return nil
		case <-tick:
			r.kickAll()
		}
	}
}

// readKeptSpec reads the spec nodespec.Store kept (generation 0: none).
func readKeptSpec(dir string) (int64, nodespec.Spec, error) {
	var rec struct {
		Generation int64         `json:"generation"`
		Spec       nodespec.Spec `json:"spec"`
	}
	b, err := os.ReadFile(filepath.Join(dir, nodespec.File))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nodespec.Spec{}, nil
	}
	if err != nil {
		return 0, nodespec.Spec{}, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return 0, nodespec.Spec{}, fmt.Errorf("%s: %w", nodespec.File, err)
	}
	return rec.Generation, rec.Spec, nil
}

// OnSpec takes the instance list of an applied spec (session.Options.OnSpec):
// it never blocks; each instance converges in its own worker. A spec older
// than the one held changes nothing.
func (r *Runtime) OnSpec(generation int64, spec nodespec.Spec) {
	r.mu.Lock()
	if r.specKnown && generation < r.generation {
		r.mu.Unlock()
		return
	}
	r.specKnown, r.generation = true, generation
	r.desired = make(map[string]nodespec.Instance, len(spec.Instances))
	for _, in := range spec.Instances {
		r.desired[in.ID] = in
		r.retry[in.ID] = true
	}
	r.setVolumesLocked(spec.Volumes)
	r.mu.Unlock()
	r.kickAll()
}

// reporter is one session's outbox: changes wait in pending (the last
// of each instance) and full asks for a Full report instead (an instance
// was removed), so a slow session never holds up the runtime.
type reporter struct {
	wake    chan struct{}
	pending map[string]protocol.InstanceStatus
	full    bool
}

// OnSession reports every instance (a Full instances frame) on a welcomed
// session, then the changes on it until ctx ends (session.Options.OnSession).
func (r *Runtime) OnSession(ctx context.Context, send func(frame any) error) {
	rep := &reporter{wake: make(chan struct{}, 1), pending: map[string]protocol.InstanceStatus{}, full: true}
	r.mu.Lock()
	r.sessions[rep] = true
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.sessions, rep)
		r.mu.Unlock()
	}()
	for {
		r.mu.Lock()
		frame := protocol.Instances{Type: protocol.FrameInstances, Full: rep.full}
		if rep.full {
			frame.Statuses = r.sortedStatusesLocked()
		} else {
			for _, st := range rep.pending {
				frame.Statuses = append(frame.Statuses, st)
			}
			sort.Slice(frame.Statuses, func(i, j int) bool { return frame.Statuses[i].ID < frame.Statuses[j].ID })
		}
		rep.full, rep.pending = false, map[string]protocol.InstanceStatus{}
		r.mu.Unlock()
		if frame.Full || len(frame.Statuses) > 0 {
			if err := send(frame); err != nil {
				r.log.Warn("runtime: an instances report", "full", frame.Full, "error", err)
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-rep.wake:
		}
	}
}

// notifyLocked hands a change to every session: st, or (nil) a Full report.
func (r *Runtime) notifyLocked(st *protocol.InstanceStatus) {
	for rep := range r.sessions {
		if st == nil {
			rep.full = true
		} else {
			rep.pending[st.ID] = *st
		}
		select {
		case rep.wake <- struct{}{}:
		default:
		}
	}
}

// Statuses answers what the runtime observed of every instance, by id.
func (r *Runtime) Statuses() []protocol.InstanceStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sortedStatusesLocked()
}

// Status answers one instance's observed state.
func (r *Runtime) Status(id string) (protocol.InstanceStatus, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.statuses[id]
	return s, ok
}

func (r *Runtime) sortedStatusesLocked() []protocol.InstanceStatus {
	out := make([]protocol.InstanceStatus, 0, len(r.statuses))
	for _, s := range r.statuses {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// setStatus records s and reports it when it changed.
func (r *Runtime) setStatus(s protocol.InstanceStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.statuses[s.ID]; ok && old == s {
		return
	}
	r.statuses[s.ID] = s
	r.notifyLocked(&s)
}

// dropStatus forgets a removed instance: sessions get a Full report,
// which lacks it.
func (r *Runtime) dropStatus(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.statuses[id]; !ok {
		return
	}
	delete(r.statuses, id)
	r.notifyLocked(nil)
}

// kickAll wakes the worker of every instance desired or held on disk.
func (r *Runtime) kickAll() {
	ids := map[string]bool{}
	r.mu.Lock()
	known := r.specKnown
	for id := range r.desired {
		ids[id] = true
	}
	r.mu.Unlock()
	if known {
		// What the disk holds and the spec lacks is removed by its worker.
		if ents, err := os.ReadDir(r.instancesDir()); err == nil {
			for _, e := range ents {
				if e.IsDir() && idPattern.MatchString(e.Name()) {
					ids[e.Name()] = true
				}
			}
		}
	}
	for id := range ids {
		r.kick(id)
	}
	r.kickVolumes()
}

// kick wakes id's worker, starting it if it has none: one worker per
// instance serializes its steps.
func (r *Runtime) kick(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx == nil || r.ctx.Err() != nil {
		return
	}
	ch, ok := r.workers[id]
	if !ok {
		ch = make(chan struct{}, 1)
		r.workers[id] = ch
		r.wg.Add(1)
		go r.work(r.ctx, id, ch)
	}
	select {
	case ch <- struct{}{}:
	default:
	}
}

// work converges id on each kick; it ends once the instance is removed.
func (r *Runtime) work(ctx context.Context, id string, kicks chan struct{}) {
	defer r.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-kicks:
		}
		r.mu.Lock()
		in, want := r.desired[id]
		r.mu.Unlock()
		if !want {
			if err := r.remove(ctx, id); err != nil {
				r.log.Error("runtime: removing an instance", "instance", id, "error", err)
				continue
			}
			r.dropStatus(id)
			r.kickVolumes() // a volume it mounted may go now
			r.mu.Lock()
			// A spec that brought it back while it was removed keeps the
			// worker; otherwise it ends here.
			if _, back := r.desired[id]; !back || ctx.Err() != nil {
				delete(r.workers, id)
				r.mu.Unlock()
				return
			}
			r.mu.Unlock()
			select {
			case kicks <- struct{}{}:
			default:
			}
			continue
		}
		r.converge(ctx, in)
	}
}

// converge brings one desired instance to its spec and records the state.
func (r *Runtime) converge(ctx context.Context, in nodespec.Instance) {
	st, err := r.convergeOnce(ctx, in)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		r.log.Error("runtime: an instance failed", "instance", in.ID, "generation", in.Generation, "error", err)
		st = protocol.InstanceStatus{ID: in.ID, Generation: in.Generation, State: protocol.InstanceFailed, Error: err.Error()}
		if a, aerr := r.readAddress(in.ID); aerr == nil {
			st.Address = a
		}
	}
	r.setStatus(st)
	if st.State == protocol.InstanceRunning && len(in.Snapshots) > 0 {
		r.takeSnapshots(ctx, in)
	}
}

func (r *Runtime) convergeOnce(ctx context.Context, in nodespec.Instance) (protocol.InstanceStatus, error) {
	if !idPattern.MatchString(in.ID) {
		return protocol.InstanceStatus{}, fmt.Errorf("instance id %q is not a safe name", in.ID)
	}
	if in.Desired != protocol.InstanceRunning && in.Desired != protocol.InstanceStopped {
		return protocol.InstanceStatus{}, fmt.Errorf("desired state %q is neither running nor stopped", in.Desired)
	}
	if in.VCPU < 1 || in.MemoryMiB < 16 {
		return protocol.InstanceStatus{}, fmt.Errorf("limits %d vCPU, %d MiB are below 1 vCPU, 16 MiB", in.VCPU, in.MemoryMiB)
	}
	// A failure stays failed until the next spec: a resync does not fetch
	// a bad image again and again.
	r.mu.Lock()
	retry := r.retry[in.ID]
	delete(r.retry, in.ID)
	r.mu.Unlock()
	if old, ok := r.Status(in.ID); ok && !retry && old.State == protocol.InstanceFailed && old.Generation == in.Generation && r.sameKept(in) {
		return old, nil
	}
	if err := os.MkdirAll(r.instanceDir(in.ID), 0o700); err != nil {
		return protocol.InstanceStatus{}, err
	}
	prev, _ := r.readKept(in.ID)
	if prev != nil && prev.Runtime != in.Runtime {
		// A changed runtime: the old container or VM goes first.
		if err := r.removeRuntime(ctx, prev.ID, prev.Runtime, false); err != nil {
			return protocol.InstanceStatus{}, err
		}
	}
	if err := r.keep(in); err != nil {
		return protocol.InstanceStatus{}, err
	}
	switch in.Runtime {
	case KindContainer, KindGVisor:
		return r.convergeContainer(ctx, in)
	case KindVM:
		return r.convergeVM(ctx, in)
	default:
		return protocol.InstanceStatus{}, fmt.Errorf("runtime %q is neither container, gvisor nor vm", in.Runtime)
	}
}

// keep records the instance's spec in its directory: a restarted agent, or
// a removal after the instance left the spec, knows what it was.
func (r *Runtime) keep(in nodespec.Instance) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(r.instanceDir(in.ID), "instance.json"), b, 0o600)
}

func (r *Runtime) readKept(id string) (*nodespec.Instance, error) {
	b, err := os.ReadFile(filepath.Join(r.instanceDir(id), "instance.json"))
	if err != nil {
		return nil, err
	}
	var in nodespec.Instance
	if err := json.Unmarshal(b, &in); err != nil {
		return nil, err
	}
	return &in, nil
}

func (r *Runtime) sameKept(in nodespec.Instance) bool {
	k, err := r.readKept(in.ID)
	if err != nil {
		return false
	}
	a, _ := json.Marshal(k)
	b, _ := json.Marshal(in)
	return string(a) == string(b)
}

// remove deletes an instance that left the spec: its container or VM, its
// files and its network.
func (r *Runtime) remove(ctx context.Context, id string) error {
	dir := r.instanceDir(id)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	kind := KindContainer
	if k, err := r.readKept(id); err == nil {
		kind = k.Runtime
	}
	if err := r.removeRuntime(ctx, id, kind, true); err != nil {
		return err
	}
	if err := r.freeNetwork(id); err != nil {
		return err
	}
	_ = os.Remove(r.cdiSpecPath(id))
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	r.log.Info("runtime: instance removed", "instance", id)
	return nil
}

// removeRuntime stops and deletes id's container or VM (purge: its rootfs
// or disk too).
func (r *Runtime) removeRuntime(ctx context.Context, id, kind string, purge bool) error {
	switch kind {
	case KindVM:
		return r.stopVM(ctx, id)
	default:
		if err := r.stopContainer(ctx, r.oci(kind), id); err != nil {
			return err
		}
		if !purge {
			return os.RemoveAll(filepath.Join(r.instanceDir(id), "bundle"))
		}
		return nil
	}
}

func (r *Runtime) epochMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// writeFileAtomic writes b to path through a temporary file and a rename.
func writeFileAtomic(path string, b []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
