package runtime_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/join"
	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/runtime"
	"github.com/better-compute/better-compute/agent/runtime/testimage"
	"github.com/better-compute/better-compute/agent/session"
	"github.com/better-compute/better-compute/internal/nodeca"
	"github.com/better-compute/better-compute/internal/testutil"
)

// requireRunc skips without root or runc (Debian package runc), and fails
// without the tools .ci/run installs with it.
func requireRunc(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the container runtime needs root (namespaces, cgroups, the bridge)")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("no runc (Debian package runc)")
	}
	for _, tool := range []string{"unsquashfs", "mksquashfs", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("no %s (Debian packages squashfs-tools, iproute2): %v", tool, err)
		}
	}
}

// imageServer is the agent listener's two instance paths over mutual TLS
// (a node CA of its own, HTTP/2): the image bytes and the user data of each
// instance, answered, as the gateway does, only to the node certificate of
// the node the instance is placed on.
type imageServer struct {
	*httptest.Server
	ca       *nodeca.CA
	nodeID   string
	mux      *http.ServeMux
	mu       sync.Mutex
	images   map[string][]byte // by instance id
	userData map[string][]byte
	gets     map[string]int
}

func newImageServer(t *testing.T) *imageServer {
	ca, err := nodeca.LoadOrGenerate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := &imageServer{ca: ca, nodeID: randID(t, "node_"), images: map[string][]byte{}, userData: map[string][]byte{}, gets: map[string]int{}}
	mux := http.NewServeMux()
	s.mux = mux
	mux.HandleFunc(protocol.InstanceImagePath, func(w http.ResponseWriter, r *http.Request) {
		if !s.fromNode(w, r) {
			return
		}
		id := strings.TrimPrefix(r.URL.Path, protocol.InstanceImagePath)
		s.mu.Lock()
		b, ok := s.images[id]
		s.gets[r.URL.Path]++
		s.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(b)
	})
	mux.HandleFunc(protocol.InstanceUserDataPath, func(w http.ResponseWriter, r *http.Request) {
		if !s.fromNode(w, r) {
			return
		}
		id := strings.TrimPrefix(r.URL.Path, protocol.InstanceUserDataPath)
		s.mu.Lock()
		b, ok := s.userData[id]
		s.gets[r.URL.Path]++
		s.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(b)
	})
	cert, err := ca.ServerCertificate([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s.Server = httptest.NewUnstartedServer(mux)
	s.EnableHTTP2 = true
	s.TLS = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool()}
	s.StartTLS()
	t.Cleanup(s.Close)
	return s
}

// handle serves another path of the agent listener.
func (s *imageServer) handle(path string, h http.HandlerFunc) { s.mux.HandleFunc(path, h) }

// fromNode answers 403 unless the client certificate is the node's.
func (s *imageServer) fromNode(w http.ResponseWriter, r *http.Request) bool {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 || r.ProtoMajor != 2 {
		http.Error(w, "no client certificate over HTTP/2", http.StatusForbidden)
		return false
	}
	if id, err := nodeca.NodeID(r.TLS.PeerCertificates[0]); err != nil || id != s.nodeID {
		http.Error(w, "not this instance's node", http.StatusForbidden)
		return false
	}
	return true
}

// client is the node's mutual-TLS client, as bcd builds it from its
// identity (session.NewHTTPClient).
func (s *imageServer) client(t *testing.T) *http.Client {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: s.nodeID}}, key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, _, err := s.ca.SignNode(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr}), s.nodeID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		t.Fatal(err)
	}
	return session.NewHTTPClient(join.Identity{NodeID: s.nodeID, AgentEndpoint: s.URL, Certificate: pair, CAPool: s.ca.Pool()})
}

func (s *imageServer) serve(id string, image, userData []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.images[id] = image
	if userData != nil {
		s.userData[id] = userData
	}
}

func (s *imageServer) count(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gets[path]
}

func randInt(t *testing.T, n int64) int64 {
	v, err := rand.Int(rand.Reader, big.NewInt(n))
	if err != nil {
		t.Fatal(err)
	}
	return v.Int64()
}

func randID(t *testing.T, prefix string) string {
	b := make([]byte, 5)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return prefix + hex.EncodeToString(b)
}

// harness is one Runtime over a state directory, a bridge and a subnet of
// its own (tests run beside other packages' on one machine).
type harness struct {
	t       *testing.T
	srv     *imageServer
	opts    runtime.Options
	rt      *runtime.Runtime
	cancel  context.CancelFunc
	done    chan error
	frames  chan protocol.Instances
	endSess context.CancelFunc
}

func newHarness(t *testing.T, srv *imageServer) *harness {
	bridge := randID(t, "bct")
	subnet := fmt.Sprintf("10.215.%d.1/24", 1+randInt(t, 250))
	h := &harness{t: t, srv: srv, opts: runtime.Options{
		StateDir: t.TempDir(), Endpoint: srv.URL, Client: srv.client(t), Bridge: bridge, Subnet: subnet,
		StopGrace: 2 * time.Second, ResyncEvery: -1, Logger: testLogger(),
	}}
	t.Cleanup(func() {
		h.stop()
		// Whatever the test left: its instances, then the bridge.
		h.start()
		h.rt.OnSpec(1<<40, nodespec.Spec{})
		testutil.Eventually(t, 30*time.Second, "every instance removed", func() bool { return len(h.rt.Statuses()) == 0 && h.instanceDirs() == 0 })
		h.stop()
		_ = exec.Command("ip", "link", "del", bridge).Run()
	})
	h.start()
	return h
}

func testLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func (h *harness) instanceDirs() int {
	ents, _ := os.ReadDir(filepath.Join(h.opts.StateDir, "instances"))
	return len(ents)
}

// start runs a fresh Runtime over the harness's state directory, with a
// session that records its frames.
func (h *harness) start() {
	rt, err := runtime.New(h.opts)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.rt, h.cancel, h.done = rt, cancel, make(chan error, 1)
	go func() { h.done <- rt.Run(ctx) }()
	h.frames = make(chan protocol.Instances, 256)
	sessCtx, endSess := context.WithCancel(ctx)
	h.endSess = endSess
	frames := h.frames
	go rt.OnSession(sessCtx, func(f any) error {
		select {
		case frames <- f.(protocol.Instances):
		default:
		}
		return nil
	})
}

func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.endSess()
	h.cancel()
	if err := <-h.done; err != nil {
		h.t.Errorf("Run: %v", err)
	}
	h.cancel = nil
}

// wait answers the status once id reports state at generation.
func (h *harness) wait(id string, gen int64, state string, within time.Duration) protocol.InstanceStatus {
	h.t.Helper()
	var st protocol.InstanceStatus
	testutil.EventuallyNil(h.t, within, func() error {
		s, ok := h.rt.Status(id)
		st = s
		if ok && s.Generation == gen && s.State == state {
			return nil
		}
		return fmt.Errorf("waiting for %s %s at generation %d; now %+v", id, state, gen, s)
	})
	return st
}

func buildTestImage(t *testing.T) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "image.squashfs")
	if err := testimage.Build(context.Background(), "", out); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func containerInstance(id string, gen int64, desired string, vcpu int, mib int64, image []byte) nodespec.Instance {
	return nodespec.Instance{ID: id, Generation: gen, Runtime: runtime.KindContainer, Desired: desired, VCPU: vcpu, MemoryMiB: mib,
		Image: nodespec.InstanceImage{ID: "img_test", Format: "raw", SHA256: digest(image), SizeBytes: int64(len(image))}}
}

func cgroupFile(controller, id, file string) string {
	return filepath.Join("/sys/fs/cgroup", controller, runtime.CgroupPath(id), file)
}

func readInt(t *testing.T, path string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// page GETs the test image's page at the instance's address from the host.
func page(addr string) (string, error) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + ":" + strconv.Itoa(testimage.Port) + "/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func waitPage(t *testing.T, addr, want string) {
	t.Helper()
	testutil.EventuallyNil(t, 15*time.Second, func() error {
		p, err := page(addr)
		if err != nil {
			return err
		}
		if !strings.Contains(p, want) {
			return fmt.Errorf("page %q lacks %q", p, want)
		}
		return nil
	})
}

func runcList(t *testing.T, stateDir string) []string {
	t.Helper()
	out, err := exec.Command("runc", "--root", filepath.Join(stateDir, "runc"), "list", "-q").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(out))
}

func p50(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// TestContainerLifecycle drives one container through the spec: start
// (the page answers at its address with its host name and user data),
// resize, stop, start, a restarted Runtime that finds it again, removal.
func TestContainerLifecycle(t *testing.T) {
	requireRunc(t)
	srv := newImageServer(t)
	image := buildTestImage(t)
	id := randID(t, "inst_")
	srv.serve(id, image, []byte("hello from the user data\nsecond line\n"))
	h := newHarness(t, srv)

	in := containerInstance(id, 1, protocol.InstanceRunning, 1, 64, image)
	in.UserData = true
	begin := time.Now()
	h.rt.OnSpec(1, nodespec.Spec{Instances: []nodespec.Instance{in}})
	st := h.wait(id, 1, protocol.InstanceRunning, 30*time.Second)
	t.Logf("first create → running (image fetch and unpack included): %s", time.Since(begin).Round(time.Millisecond))
	if st.Address == "" || st.VCPU != 1 || st.MemoryMiB != 64 || st.StartedAt == 0 {
		t.Fatalf("running status %+v", st)
	}
	addr := st.Address
	waitPage(t, addr, testimage.Marker+strings.ReplaceAll(id, "_", "-")+"\nuser-data: hello from the user data\n")

	seed := filepath.Join(h.opts.StateDir, "instances", id, "rootfs", runtime.SeedDir, "user-data")
	if fi, err := os.Stat(seed); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("user-data seed: %v, mode %v", err, fi.Mode())
	}
	checks := []struct {
		controller, file string
		want             int64
	}{
		{"memory", "memory.limit_in_bytes", 64 << 20},
		{"cpu", "cpu.cfs_quota_us", 100000},
		{"cpu", "cpu.cfs_period_us", 100000},
		{"pids", "pids.max", runtime.DefaultPidsLimit},
	}
	for _, c := range checks {
		if got := readInt(t, cgroupFile(c.controller, id, c.file)); got != c.want {
			t.Errorf("%s: %d, want %d", c.file, got, c.want)
		}
	}
	if n := srv.count(protocol.InstanceImagePath + id); n != 1 {
		t.Errorf("image fetched %d times", n)
	}

	t.Run("resize", func(t *testing.T) {
		in := containerInstance(id, 2, protocol.InstanceRunning, 2, 128, image)
		h.rt.OnSpec(2, nodespec.Spec{Instances: []nodespec.Instance{in}})
		st := h.wait(id, 2, protocol.InstanceRunning, 15*time.Second)
		if st.VCPU != 2 || st.MemoryMiB != 128 {
			t.Fatalf("resized status %+v", st)
		}
		if got := readInt(t, cgroupFile("memory", id, "memory.limit_in_bytes")); got != 128<<20 {
			t.Errorf("memory.limit_in_bytes %d after the resize", got)
		}
		if got := readInt(t, cgroupFile("cpu", id, "cpu.cfs_quota_us")); got != 200000 {
			t.Errorf("cpu.cfs_quota_us %d after the resize", got)
		}
	})

	pidOf := func() int64 { return readInt(t, filepath.Join(h.opts.StateDir, "instances", id, "bundle", "pid")) }
	t.Run("stop", func(t *testing.T) {
		pid := pidOf()
		h.rt.OnSpec(3, nodespec.Spec{Instances: []nodespec.Instance{containerInstance(id, 3, protocol.InstanceStopped, 2, 128, image)}})
		st := h.wait(id, 3, protocol.InstanceStopped, 15*time.Second)
		if st.Address != addr {
			t.Errorf("a stopped container's address %q, want %q", st.Address, addr)
		}
		// Its parent (the node's init) reaps it.
		testutil.Eventually(t, 5*time.Second, "the container's process gone", func() bool {
			_, err := os.Stat(filepath.Join("/proc", strconv.FormatInt(pid, 10)))
			return os.IsNotExist(err)
		})
		if _, err := os.Stat(cgroupFile("memory", id, "")); err == nil {
			t.Error("the memory cgroup is still there")
		}
		if l := runcList(t, h.opts.StateDir); len(l) != 0 {
			t.Errorf("runc lists %v", l)
		}
	})

	t.Run("start again", func(t *testing.T) {
		// A crash half-way through the network's setup: the next start
		// rebuilds it, with the kept address.
		if out, err := exec.Command("ip", "netns", "del", "bc-"+id).CombinedOutput(); err != nil {
			t.Fatalf("ip netns del: %v: %s", err, out)
		}
		h.rt.OnSpec(4, nodespec.Spec{Instances: []nodespec.Instance{containerInstance(id, 4, protocol.InstanceRunning, 2, 128, image)}})
		st := h.wait(id, 4, protocol.InstanceRunning, 15*time.Second)
		if st.Address != addr {
			t.Errorf("address %q after a restart, want %q", st.Address, addr)
		}
		if got := readInt(t, cgroupFile("cpu", id, "cpu.cfs_quota_us")); got != 200000 {
			t.Errorf("cpu.cfs_quota_us %d after the start (config.json keeps the resize)", got)
		}
		waitPage(t, addr, "user-data: \n") // the spec no longer says it has user data
		if n := srv.count(protocol.InstanceImagePath + id); n != 1 {
			t.Errorf("image fetched %d times", n)
		}
	})

	t.Run("a restarted runtime finds it again", func(t *testing.T) {
		before, _ := h.rt.Status(id)
		pid := pidOf()
		h.stop()
		h.start()
		spec := nodespec.Spec{Instances: []nodespec.Instance{containerInstance(id, 4, protocol.InstanceRunning, 2, 128, image)}}
		h.rt.OnSpec(4, spec)
		st := h.wait(id, 4, protocol.InstanceRunning, 15*time.Second)
		if st != before {
			t.Errorf("status after the restart %+v, before %+v", st, before)
		}
		if got := pidOf(); got != pid {
			t.Errorf("pid %d, was %d: the container was started again", got, pid)
		}
		if l := runcList(t, h.opts.StateDir); len(l) != 1 || l[0] != id {
			t.Errorf("runc lists %v", l)
		}
	})

	t.Run("timing", func(t *testing.T) {
		var runs []time.Duration
		for gen := int64(5); gen < 15; gen += 2 {
			h.rt.OnSpec(gen, nodespec.Spec{Instances: []nodespec.Instance{containerInstance(id, gen, protocol.InstanceStopped, 2, 128, image)}})
			h.wait(id, gen, protocol.InstanceStopped, 15*time.Second)
			begin := time.Now()
			h.rt.OnSpec(gen+1, nodespec.Spec{Instances: []nodespec.Instance{containerInstance(id, gen+1, protocol.InstanceRunning, 2, 128, image)}})
			h.wait(id, gen+1, protocol.InstanceRunning, 15*time.Second)
			runs = append(runs, time.Since(begin))
		}
		t.Logf("container start (bundle kept) → running, %d runs: p50 %s, all %v", len(runs), p50(runs).Round(time.Millisecond), runs)
	})

	t.Run("remove", func(t *testing.T) {
		dir := filepath.Join(h.opts.StateDir, "instances", id)
		h.rt.OnSpec(20, nodespec.Spec{})
		testutil.Eventually(t, 15*time.Second, "the instance removed", func() bool {
			_, ok := h.rt.Status(id)
			_, err := os.Stat(dir)
			return !ok && os.IsNotExist(err)
		})
		if l := runcList(t, h.opts.StateDir); len(l) != 0 {
			t.Errorf("runc lists %v", l)
		}
		if _, err := os.Stat("/run/netns/bc-" + id); err == nil {
			t.Error("the network namespace is still there")
		}
		out, _ := exec.Command("ip", "-o", "link", "show", "master", h.opts.Bridge).Output()
		if strings.TrimSpace(string(out)) != "" {
			t.Errorf("the bridge still has ports: %s", out)
		}
		// The address is free again: the next instance gets it.
		next := randID(t, "inst_")
		srv.serve(next, image, nil)
		h.rt.OnSpec(21, nodespec.Spec{Instances: []nodespec.Instance{containerInstance(next, 1, protocol.InstanceRunning, 1, 64, image)}})
		if st := h.wait(next, 1, protocol.InstanceRunning, 30*time.Second); st.Address != addr {
			t.Errorf("the next instance got %s, want the freed %s", st.Address, addr)
		}
	})
}

// TestSessionReports: a session gets the Full report first, then changes.
func TestSessionReports(t *testing.T) {
	requireRunc(t)
	srv := newImageServer(t)
	image := buildTestImage(t)
	id := randID(t, "inst_")
	srv.serve(id, image, nil)
	h := newHarness(t, srv)
	first := <-h.frames
	if !first.Full || first.Type != protocol.FrameInstances || len(first.Statuses) != 0 {
		t.Fatalf("first frame %+v", first)
	}
	h.rt.OnSpec(1, nodespec.Spec{Instances: []nodespec.Instance{containerInstance(id, 1, protocol.InstanceRunning, 1, 32, image)}})
	// Changes come one instance a frame; a session that lags gets the last
	// state of each (creating may be folded into running).
	var states []string
	for len(states) == 0 || states[len(states)-1] != protocol.InstanceRunning {
		f := <-h.frames
		if f.Full || len(f.Statuses) != 1 || f.Statuses[0].ID != id {
			t.Fatalf("change frame %+v", f)
		}
		states = append(states, f.Statuses[0].State)
	}
	if s := strings.Join(states, ","); s != "creating,running" && s != "running" {
		t.Errorf("reported %v", states)
	}
	// A new session: the Full report holds the instance.
	h.endSess()
	frames := make(chan protocol.Instances, 16)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go h.rt.OnSession(ctx, func(f any) error { frames <- f.(protocol.Instances); return nil })
	full := <-frames
	if !full.Full || len(full.Statuses) != 1 || full.Statuses[0].State != protocol.InstanceRunning {
		t.Errorf("full report %+v", full)
	}
	// A removal is reported by a Full report that lacks the instance.
	h.rt.OnSpec(2, nodespec.Spec{})
	for f := range frames {
		if f.Full {
			if len(f.Statuses) != 0 {
				t.Errorf("the Full report after the removal holds %+v", f.Statuses)
			}
			break
		}
	}
}

// TestBadInstancesFail: what cannot run fails with the reason and keeps
// nothing of it.
func TestBadInstancesFail(t *testing.T) {
	requireRunc(t)
	srv := newImageServer(t)
	image := buildTestImage(t)
	h := newHarness(t, srv)
	tampered := append([]byte(nil), image...)
	tampered[len(tampered)-1] ^= 0xff
	cases := []struct {
		name string
		in   func(id string) nodespec.Instance
		want string
	}{
		{"sha256 mismatch", func(id string) nodespec.Instance {
			srv.serve(id, tampered, nil)
			return containerInstance(id, 1, protocol.InstanceRunning, 1, 64, image)
		}, "sha256 mismatch"},
		{"not a filesystem", func(id string) nodespec.Instance {
			junk := []byte(strings.Repeat("not an image ", 200))
			srv.serve(id, junk, nil)
			return containerInstance(id, 1, protocol.InstanceRunning, 1, 64, junk)
		}, "neither a squashfs nor an ext2/3/4"},
		{"unknown runtime", func(id string) nodespec.Instance {
			in := containerInstance(id, 1, protocol.InstanceRunning, 1, 64, image)
			in.Runtime = "lxc"
			return in
		}, "neither container, gvisor nor vm"},
		{"no image", func(id string) nodespec.Instance {
			// An image no instance cached: the gateway has none to serve.
			return containerInstance(id, 1, protocol.InstanceRunning, 1, 64, []byte(id))
		}, "HTTP 404"},
		{"limits too small", func(id string) nodespec.Instance {
			return containerInstance(id, 1, protocol.InstanceRunning, 0, 64, image)
		}, "below 1 vCPU"},
	}
	var spec nodespec.Spec
	ids := map[string]string{}
	for _, c := range cases {
		id := randID(t, "inst_")
		ids[c.name] = id
		spec.Instances = append(spec.Instances, c.in(id))
	}
	h.rt.OnSpec(1, spec)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := h.wait(ids[c.name], 1, protocol.InstanceFailed, 15*time.Second)
			if !strings.Contains(st.Error, c.want) {
				t.Errorf("error %q lacks %q", st.Error, c.want)
			}
		})
	}
	t.Run("the next spec tries again", func(t *testing.T) {
		id := ids["sha256 mismatch"]
		srv.serve(id, image, nil)
		h.rt.OnSpec(1, spec)
		h.wait(id, 1, protocol.InstanceRunning, 15*time.Second)
	})
	spec.Instances = spec.Instances[1:]
	h.rt.OnSpec(2, spec)
	testutil.Eventually(t, 15*time.Second, "the fixed instance removed", func() bool {
		_, ok := h.rt.Status(ids["sha256 mismatch"])
		return !ok
	})
	cached, _ := os.ReadDir(filepath.Join(h.opts.StateDir, "images", "sha256"))
	for _, e := range cached {
		if e.Name() == digest(tampered) || strings.HasPrefix(e.Name(), ".") {
			t.Errorf("the cache kept %s", e.Name())
		}
	}
	if l := runcList(t, h.opts.StateDir); len(l) != 0 {
		t.Errorf("runc lists %v", l)
	}
}

// TestExt4Image: a raw image holding ext4 (loop-mounted read-only and
// copied) runs as the squashfs one does, here with a Command.
func TestExt4Image(t *testing.T) {
	requireRunc(t)
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("no mkfs.ext4 (Debian package e2fsprogs)")
	}
	srv := newImageServer(t)
	squash := filepath.Join(t.TempDir(), "image.squashfs")
	if err := os.WriteFile(squash, buildTestImage(t), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs")
	if out, err := exec.Command("unsquashfs", "-no-progress", "-quiet", "-d", rootfs, squash).CombinedOutput(); err != nil {
		t.Fatalf("unsquashfs: %v: %s", err, out)
	}
	ext4 := filepath.Join(dir, "image.ext4")
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-d", rootfs, ext4, "16M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	image, err := os.ReadFile(ext4)
	if err != nil {
		t.Fatal(err)
	}
	id := randID(t, "inst_")
	srv.serve(id, image, nil)
	h := newHarness(t, srv)
	in := containerInstance(id, 1, protocol.InstanceRunning, 1, 64, image)
	in.Command = []string{"/bin/sh", "-c", "mkdir -p /run/w && echo ext4-rootfs > /run/w/index.html && exec httpd -f -p 8080 -h /run/w"}
	h.rt.OnSpec(1, nodespec.Spec{Instances: []nodespec.Instance{in}})
	st := h.wait(id, 1, protocol.InstanceRunning, 30*time.Second)
	waitPage(t, st.Address, "ext4-rootfs")
}
