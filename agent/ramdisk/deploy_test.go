package ramdisk_test

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
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/diskfs/go-diskfs/partition/gpt"
	"github.com/diskfs/go-diskfs/partition/mbr"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/ramdisk"
	coreinv "github.com/better-compute/better-compute/core/inventory"
)

// deployMachine is a simulated machine whose disks are sparse files: vda
// (64 MiB, serial S-VDA), vdb (256 MiB) and the system disk vdc.
func deployMachine(t *testing.T) (*ramdisk.Simulated, map[string]string) {
	t.Helper()
	dir := t.TempDir()
	disks := []coreinv.Disk{
		{Name: "vdb", SizeBytes: 256 << 20, Serial: "S-VDB"},
		{Name: "vda", SizeBytes: 64 << 20, Serial: "S-VDA"},
		{Name: "vdc", SizeBytes: 16 << 20, System: true},
	}
	files := map[string]string{}
	for _, d := range disks {
		p := filepath.Join(dir, d.Name+".img")
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, d.SizeBytes); err != nil {
			t.Fatal(err)
		}
		files[d.Name] = p
	}
	inv := coreinv.NodeInventory{
		Kind: coreinv.Kind, Version: coreinv.Version,
		System: coreinv.System{Vendor: "QEMU", Product: "Standard PC", ProductUUID: "5e1c0e3a-1111-2222-3333-444455556666"},
		CPU:    coreinv.CPU{Sockets: 1, CoresPerSocket: 1, ThreadsPerCore: 1, LogicalCPUs: 1, NUMANodes: 1},
		Memory: coreinv.Memory{TotalBytes: 512 << 20},
		Disks:  disks,
		NICs:   []coreinv.NIC{{Name: "eth0", MAC: "52:54:00:12:34:56", Driver: "virtio_net"}},
		GPUs:   coreinv.GPUs{Devices: []coreinv.GPU{}},
	}
	return &ramdisk.Simulated{Document: &inv, DiskFiles: files}, files
}

// imageServer serves one image with http.ServeContent, as the site's boot
// server does, to the bearer of token; drop, when positive, is where the
// first response breaks off (the connection is cut).
type imageServer struct {
	image []byte
	token string
	drop  int
	// onServed, when set, hears how many bytes went out so far.
	onServed func(n int)

	mu     sync.Mutex
	ranges []string
}

func (s *imageServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if got := r.Header.Get("Authorization"); got != "Bearer "+s.token {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	s.mu.Lock()
	first := len(s.ranges) == 0
	s.ranges = append(s.ranges, r.Header.Get("Range"))
	s.mu.Unlock()
	cw := &cuttingWriter{ResponseWriter: w, onServed: s.onServed}
	if first && s.drop > 0 {
		cw.cutAt = s.drop
	}
	http.ServeContent(cw, r, "image.raw", time.Time{}, bytes.NewReader(s.image))
}

func (s *imageServer) Ranges() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.ranges...)
}

// cuttingWriter cuts the connection once cutAt body bytes went out.
type cuttingWriter struct {
	http.ResponseWriter
	cutAt, n int
	onServed func(int)
}

func (c *cuttingWriter) Write(p []byte) (int, error) {
	if c.cutAt > 0 && c.n+len(p) > c.cutAt {
		k, _ := c.ResponseWriter.Write(p[:c.cutAt-c.n])
		c.n += k
		c.ResponseWriter.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}
	k, err := c.ResponseWriter.Write(p)
	c.n += k
	if c.onServed != nil {
		c.onServed(c.n)
	}
	return k, err
}

func randomImage(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func writeImageStep(url string, image []byte, extra ...string) protocol.RamdiskStep {
	args := map[string]string{"url": url, "sha256": sha(image), "sizeBytes": strconv.Itoa(len(image))}
	for i := 0; i+1 < len(extra); i += 2 {
		args[extra[i]] = extra[i+1]
	}
	return protocol.RamdiskStep{Name: protocol.StepWriteImage, Args: args}
}

// deployAPI answers the report with steps, every result with nothing (a
// failed step's answer is power-off, and so is a re-report's, so a run
// always ends), and the seed request with seed.
func deployAPI(t *testing.T, seed func() (int, any), stepsToRun ...protocol.RamdiskStep) *fakeAPI {
	return &fakeAPI{t: t, answer: func(n int, path string, body map[string]json.RawMessage) (int, any) {
		switch {
		case n == 0:
			return http.StatusOK, protocol.RamdiskInstructions{NodeID: "node-1", Steps: stepsToRun}
		case path == protocol.RamdiskSeedPath:
			return seed()
		case path == protocol.RamdiskReportPath:
			// The waiting ramdisk's re-report: the run is over.
			return http.StatusOK, steps(protocol.StepPowerOff)
		case path == protocol.RamdiskResultPath:
			var r []protocol.RamdiskStepResult
			_ = json.Unmarshal(body["results"], &r)
			if len(r) == 1 && !r[0].OK {
				return http.StatusOK, steps(protocol.StepPowerOff)
			}
		}
		return http.StatusOK, steps()
	}}
}

// resultsOf are the step results the API received, in order.
func resultsOf(t *testing.T, api *fakeAPI) []protocol.RamdiskStepResult {
	var out []protocol.RamdiskStepResult
	for _, c := range api.Calls() {
		if c.Path == protocol.RamdiskResultPath {
			out = append(out, results(t, c)...)
		}
	}
	return out
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// readPrefix reads the first n bytes of a file.
func readPrefix(t *testing.T, p string, n int) []byte {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := io.ReadFull(f, b); err != nil {
		t.Fatal(err)
	}
	return b
}

const bootToken = protocol.BootTokenPrefix + "deploy-boot-token"

func TestWriteImageResumesAfterADroppedConnection(t *testing.T) {
	m, files := deployMachine(t)
	image := randomImage(t, 5<<20+12345)
	img := &imageServer{image: image, token: bootToken, drop: 2<<20 + 777}
	imgSrv := httptest.NewServer(img)
	defer imgSrv.Close()
	api := deployAPI(t, nil, writeImageStep(imgSrv.URL+"/image", image), protocol.RamdiskStep{Name: protocol.StepPowerOff})
	srv := httptest.NewServer(api)
	defer srv.Close()
	if err := agent(t, srv.URL, bootToken, m).Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	res := resultsOf(t, api)
	if len(res) != 2 || res[0].Name != protocol.StepWriteImage || !res[0].OK || !strings.Contains(res[0].Message, sha(image)) || !strings.Contains(res[0].Message, "vda") {
		t.Fatalf("results = %+v", res)
	}
	// The smallest disk that holds the image: vda, not vdb, never vdc.
	disk := readPrefix(t, files["vda"], len(image))
	if !bytes.Equal(disk[:len(image)], image) {
		t.Fatal("vda does not hold the image")
	}
	if !bytes.Equal(readPrefix(t, files["vdb"], len(image)), make([]byte, len(image))) {
		t.Error("vdb was written")
	}
	ranges := img.Ranges()
	if len(ranges) != 2 || ranges[0] != "" || !strings.HasPrefix(ranges[1], "bytes=") {
		t.Fatalf("image requests' Range = %q, want a full GET then a resume", ranges)
	}
	from, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(ranges[1], "bytes="), "-"))
	if err != nil || from <= 0 || from > img.drop {
		t.Errorf("resumed from %q, want a byte in (0, %d]", ranges[1], img.drop)
	}
}

func TestWriteImageDigestMismatchZeroesTheFirstMiBAndFails(t *testing.T) {
	m, files := deployMachine(t)
	// What a previous system left on the disk.
	if err := os.WriteFile(files["vda"], bytes.Repeat([]byte{0xaa}, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(files["vda"], 64<<20); err != nil {
		t.Fatal(err)
	}
	signed := randomImage(t, 3<<20)
	tampered := bytes.Clone(signed)
	tampered[len(tampered)/2] ^= 1
	imgSrv := httptest.NewServer(&imageServer{image: tampered, token: bootToken})
	defer imgSrv.Close()
	api := deployAPI(t, nil, writeImageStep(imgSrv.URL, signed), protocol.RamdiskStep{Name: protocol.StepReboot})
	srv := httptest.NewServer(api)
	defer srv.Close()
	rebooted := false
	m.OnReboot = func() { rebooted = true }
	if err := agent(t, srv.URL, bootToken, m).Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	res := resultsOf(t, api)
	if len(res) != 2 || res[0].OK || !strings.Contains(res[0].Message, sha(signed)) || !strings.Contains(res[0].Message, sha(tampered)) {
		t.Fatalf("write-image result = %+v, want a failure naming both digests", res)
	}
	if res[1].Name != protocol.StepPowerOff || rebooted {
		t.Errorf("after the failure: %+v, rebooted %v (the queued reboot must be dropped)", res[1], rebooted)
	}
	disk := readPrefix(t, files["vda"], 3<<20)
	if !bytes.Equal(disk[:1<<20], make([]byte, 1<<20)) {
		t.Error("the disk's first MiB is not zeroed")
	}
	if !bytes.Equal(disk[1<<20:3<<20], tampered[1<<20:]) {
		t.Error("the rest of the image is not where it was written")
	}
}

func TestWriteImageRefusesWhatItCannotWrite(t *testing.T) {
	m, _ := deployMachine(t)
	image := randomImage(t, 1<<20)
	imgSrv := httptest.NewServer(&imageServer{image: image, token: bootToken})
	defer imgSrv.Close()
	short := writeImageStep(imgSrv.URL, image)
	short.Args["sizeBytes"] = strconv.Itoa(len(image) + 4096) // the server has less
	for name, tc := range map[string]struct {
		step protocol.RamdiskStep
		want string
	}{
		"wrong token":    {writeImageStep(imgSrv.URL, image), "401"},
		"no such disk":   {writeImageStep(imgSrv.URL, image, "rootDevice", "sdz"), `rootDevice "sdz" matches no disk`},
		"system disk":    {writeImageStep(imgSrv.URL, image, "rootDevice", "vdc"), "system disk"},
		"too big":        {writeImageStep(imgSrv.URL, image, "minSizeBytes", strconv.Itoa(1<<30)), "no disk holds"},
		"short image":    {short, "ends before byte"},
		"bad digest arg": {writeImageStep(imgSrv.URL, image, "sha256", "abc"), "not a SHA-256"},
	} {
		t.Run(name, func(t *testing.T) {
			api := deployAPI(t, nil, tc.step)
			srv := httptest.NewServer(api)
			defer srv.Close()
			token := bootToken
			if name == "wrong token" {
				token = protocol.BootTokenPrefix + "another"
			}
			if err := agent(t, srv.URL, token, m).Run(context.Background()); err != nil {
				t.Fatal(err)
			}
			res := resultsOf(t, api)
			if len(res) == 0 || res[0].OK || !strings.Contains(res[0].Message, tc.want) {
				t.Fatalf("result = %+v, want a failure with %q", res, tc.want)
			}
		})
	}
}

func TestWriteImageStopsWhenTheContextEnds(t *testing.T) {
	m, files := deployMachine(t)
	m.DiskBytesPerSecond = 16 << 20
	image := randomImage(t, 32<<20)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	img := &imageServer{image: image, token: bootToken, onServed: func(n int) {
		if n >= 2<<20 {
			cancel()
		}
	}}
	imgSrv := httptest.NewServer(img)
	defer imgSrv.Close()
	api := deployAPI(t, nil, writeImageStep(imgSrv.URL, image))
	srv := httptest.NewServer(api)
	defer srv.Close()
	if err := os.WriteFile(files["vda"], bytes.Repeat([]byte{0xaa}, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(files["vda"], 64<<20); err != nil {
		t.Fatal(err)
	}
	err := agent(t, srv.URL, bootToken, m).Run(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if !bytes.Equal(readPrefix(t, files["vda"], 1<<20)[:1<<20], make([]byte, 1<<20)) {
		t.Error("the partial image's first MiB is not zeroed")
	}
}

func TestChooseDisk(t *testing.T) {
	disks := []coreinv.Disk{
		{Name: "sdb", SizeBytes: 2000, Serial: "SER-B", WWN: "0x5000b"},
		{Name: "sda", SizeBytes: 1000, Serial: "SER-A"},
		{Name: "sdc", SizeBytes: 1000},
		{Name: "nvme0n1", SizeBytes: 500, System: true},
	}
	for _, tc := range []struct {
		hint string
		need int64
		want string
	}{
		{"", 100, "sda"}, // the smallest that holds it; a tie goes by name
		{"", 1500, "sdb"},
		{"", 3000, ""},
		{"sdc", 100, "sdc"},
		{"/dev/sdb", 100, "sdb"},
		{"SER-B", 100, "sdb"},
		{"0x5000b", 100, "sdb"},
		{"sda", 1500, ""},
		{"nvme0n1", 100, ""},
		{"sdq", 100, ""},
	} {
		d, err := ramdisk.ChooseDisk(disks, tc.hint, tc.need)
		if tc.want == "" {
			if err == nil {
				t.Errorf("hint %q need %d: chose %s, want an error", tc.hint, tc.need, d.Name)
			}
			continue
		}
		if err != nil || d.Name != tc.want {
			t.Errorf("hint %q need %d: %s, %v; want %s", tc.hint, tc.need, d.Name, err, tc.want)
		}
	}
}

// partitionedImage makes a disk image of size bytes with go-diskfs: an
// MBR or a GPT with one Linux partition from 1 MiB to partEnd, a marker in
// it.
func partitionedImage(t *testing.T, kind string, size, partEnd int64) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "image.raw")
	d, err := diskfs.Create(p, size, diskfs.SectorSizeDefault)
	if err != nil {
		t.Fatal(err)
	}
	switch kind {
	case "mbr":
		err = d.Partition(&mbr.Table{LogicalSectorSize: 512, PhysicalSectorSize: 512, Partitions: []*mbr.Partition{
			{Index: 1, Bootable: true, Type: mbr.Linux, Start: 2048, Size: uint32((partEnd - 1<<20) / 512)},
		}})
	case "gpt":
		err = d.Partition(&gpt.Table{LogicalSectorSize: 512, PhysicalSectorSize: 512, ProtectiveMBR: true, Partitions: []*gpt.Partition{
			{Index: 1, Type: gpt.LinuxFilesystem, Start: 2048, End: uint64(partEnd/512) - 1, Name: "root"},
		}})
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	b := readFile(t, p)
	if kind != "" {
		copy(b[1<<20:], rootMarker)
	}
	return b
}

// rootMarker is what the image's partition starts with.
const rootMarker = "ROOTFS-MARKER"

func TestWriteImageThenWriteSeed(t *testing.T) {
	seed := protocol.RamdiskSeed{
		NodeID: "node-1", WorkflowID: "wf_1",
		MetaData:      "instance-id: node-1\nlocal-hostname: gpu-1\n",
		UserData:      "#cloud-config\nruncmd: [[touch, /deployed]]\n",
		NetworkConfig: "version: 2\nethernets: {eth0: {dhcp4: true}}\n",
	}
	for _, kind := range []string{"mbr", "gpt"} {
		t.Run(kind, func(t *testing.T) {
			m, files := deployMachine(t)
			// A 40 MiB image on a 64 MiB disk: 24 MiB free after it.
			image := partitionedImage(t, kind, 40<<20, 32<<20)
			imgSrv := httptest.NewServer(&imageServer{image: image, token: bootToken})
			defer imgSrv.Close()
			var seedAsked atomic.Int32
			api := deployAPI(t, func() (int, any) { seedAsked.Add(1); return http.StatusOK, seed },
				writeImageStep(imgSrv.URL, image, "rootDevice", "S-VDA"),
				protocol.RamdiskStep{Name: protocol.StepWriteSeed},
				protocol.RamdiskStep{Name: protocol.StepPowerOff})
			srv := httptest.NewServer(api)
			defer srv.Close()
			a := agent(t, srv.URL, bootToken, m)
			a.Config.AgentEndpoint = "10.0.2.2:7443"
			if err := a.Run(context.Background()); err != nil {
				t.Fatal(err)
			}
			res := resultsOf(t, api)
			if len(res) != 3 || !res[0].OK || !res[1].OK || res[1].Name != protocol.StepWriteSeed {
				t.Fatalf("results = %+v", res)
			}
			if seedAsked.Load() != 1 {
				t.Errorf("the seed was asked for %d times", seedAsked.Load())
			}
			for _, c := range api.Calls() {
				if c.Path == protocol.RamdiskSeedPath && string(c.Body["token"]) != `"`+bootToken+`"` {
					t.Errorf("seed request token = %s", c.Body["token"])
				}
			}
			checkSeed(t, files["vda"], kind, seed, protocol.SeedJoin{
				APIURL: srv.URL, Token: bootToken, NodeID: "node-1", AgentEndpoint: "10.0.2.2:7443",
			})
		})
	}
}

// checkSeed reads the disk back with go-diskfs (and, where installed,
// util-linux's blkid): the image's partition and marker kept, the seed
// partition at the disk's end holding the files.
func checkSeed(t *testing.T, path, kind string, seed protocol.RamdiskSeed, join protocol.SeedJoin) {
	t.Helper()
	d, err := diskfs.Open(path, diskfs.WithOpenMode(diskfs.ReadOnly))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	table, err := d.GetPartitionTable()
	if err != nil || table.Type() != kind {
		t.Fatalf("partition table %v, %v; want %s", table, err, kind)
	}
	var used []int
	var seedStart, seedSize int64
	for _, p := range table.GetPartitions() {
		if p.GetSize() == 0 {
			continue
		}
		used = append(used, p.GetIndex())
		if p.GetIndex() == 2 {
			seedStart, seedSize = p.GetStart(), p.GetSize()
		}
	}
	// The last aligned 8 MiB before the end (a GPT keeps 33 sectors there
	// for its backup).
	wantStart := int64(56 << 20)
	if kind == "gpt" {
		wantStart = 55 << 20
	}
	if fmt.Sprint(used) != "[1 2]" || seedStart != wantStart || seedSize != 8<<20 {
		t.Errorf("partitions %v; the seed at %d, %d bytes; want partitions [1 2], the seed at %d, 8 MiB", used, seedStart, seedSize, wantStart)
	}
	if b := readFile(t, path); !bytes.HasPrefix(b[1<<20:], []byte(rootMarker)) {
		t.Error("the image's partition lost its contents")
	}
	fs, err := d.GetFilesystem(2)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(fs.Label()); got != protocol.SeedLabel {
		t.Errorf("label = %q", got)
	}
	for name, want := range map[string]string{"/meta-data": seed.MetaData, "/user-data": seed.UserData, "/network-config": seed.NetworkConfig} {
		got, err := fs.ReadFile(name)
		switch {
		case want == "" && err == nil:
			t.Errorf("%s was written (%q); the seed has none", name, got)
		case want != "" && (err != nil || string(got) != want):
			t.Errorf("%s = %q, %v; want %q", name, got, err, want)
		}
	}
	b, err := fs.ReadFile("/" + protocol.SeedJoinFile)
	if err != nil {
		t.Fatal(err)
	}
	var got protocol.SeedJoin
	if err := json.Unmarshal(b, &got); err != nil || got != join {
		t.Errorf("%s = %+v, %v; want %+v", protocol.SeedJoinFile, got, err, join)
	}
	// What cloud-init's ds-identify asks: a vfat filesystem labelled CIDATA.
	if blkid, err := exec.LookPath("blkid"); err == nil {
		out, err := exec.Command(blkid, "-p", "-O", strconv.FormatInt(seedStart, 10), "-S", strconv.FormatInt(seedSize, 10), "-o", "export", path).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "LABEL="+protocol.SeedLabel) || !strings.Contains(string(out), "TYPE=vfat") {
			t.Errorf("blkid: %v: %s", err, out)
		}
		t.Logf("blkid: %s", strings.Join(strings.Fields(string(out)), " "))
	}
}

func TestWriteSeedFailsWithoutRoom(t *testing.T) {
	seed := func() (int, any) {
		return http.StatusOK, protocol.RamdiskSeed{NodeID: "node-1", MetaData: "instance-id: node-1\n"}
	}
	for name, tc := range map[string]struct {
		image []byte
		want  string
	}{
		// The image's partition runs to 62 MiB of the 64 MiB disk.
		"no free space": {partitionedImage(t, "mbr", 64<<20, 62<<20), "no free space"},
		"no table":      {randomImage(t, 1<<20), "no partition table"},
	} {
		t.Run(name, func(t *testing.T) {
			m, files := deployMachine(t)
			imgSrv := httptest.NewServer(&imageServer{image: tc.image, token: bootToken})
			defer imgSrv.Close()
			api := deployAPI(t, seed, writeImageStep(imgSrv.URL, tc.image, "rootDevice", "vda"), protocol.RamdiskStep{Name: protocol.StepWriteSeed})
			srv := httptest.NewServer(api)
			defer srv.Close()
			if err := agent(t, srv.URL, bootToken, m).Run(context.Background()); err != nil {
				t.Fatal(err)
			}
			res := resultsOf(t, api)
			if len(res) < 2 || !res[0].OK || res[1].OK || !strings.Contains(res[1].Message, tc.want) {
				t.Fatalf("results = %+v, want write-seed to fail with %q", res, tc.want)
			}
			if !bytes.Equal(readPrefix(t, files["vda"], len(tc.image))[:len(tc.image)], tc.image) {
				t.Error("a failed write-seed changed the image")
			}
		})
	}
}

func TestWriteSeedSaysWhyTheAPIRefused(t *testing.T) {
	m, _ := deployMachine(t)
	api := deployAPI(t, func() (int, any) {
		return http.StatusNotFound, map[string]any{"error": map[string]any{
			"code": "NOT_FOUND", "message": "secret user-data-prod is gone", "details": map[string]string{"reason": "secretNotFound"},
		}}
	}, protocol.RamdiskStep{Name: protocol.StepWriteSeed, Args: map[string]string{"rootDevice": "vda"}})
	srv := httptest.NewServer(api)
	defer srv.Close()
	if err := agent(t, srv.URL, bootToken, m).Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	res := resultsOf(t, api)
	if len(res) == 0 || res[0].OK || !strings.Contains(res[0].Message, "NOT_FOUND: secret user-data-prod is gone") {
		t.Fatalf("results = %+v", res)
	}
}

func TestWriteSeedWithoutADisk(t *testing.T) {
	m, _ := deployMachine(t)
	api := deployAPI(t, nil, protocol.RamdiskStep{Name: protocol.StepWriteSeed})
	srv := httptest.NewServer(api)
	defer srv.Close()
	if err := agent(t, srv.URL, bootToken, m).Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if res := resultsOf(t, api); len(res) == 0 || res[0].OK || !strings.Contains(res[0].Message, "no disk") {
		t.Fatalf("results = %+v", res)
	}
	for _, c := range api.Calls() {
		if c.Path == protocol.RamdiskSeedPath {
			t.Error("the seed was fetched with no disk to write it to")
		}
	}
}

func TestRebootPostsItsResultThenReboots(t *testing.T) {
	m, _ := deployMachine(t)
	api := deployAPI(t, nil, protocol.RamdiskStep{Name: protocol.StepReboot}, protocol.RamdiskStep{Name: protocol.StepWipeDisks})
	srv := httptest.NewServer(api)
	defer srv.Close()
	var seenAtReboot []protocol.RamdiskStepResult
	reboots := 0
	m.OnReboot = func() {
		reboots++
		seenAtReboot = resultsOf(t, api)
	}
	if err := agent(t, srv.URL, bootToken, m).Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if reboots != 1 || len(seenAtReboot) != 1 || seenAtReboot[0].Name != protocol.StepReboot || !seenAtReboot[0].OK {
		t.Fatalf("%d reboots; results the API had when the machine rebooted: %+v", reboots, seenAtReboot)
	}
	if len(resultsOf(t, api)) != 1 || len(m.Wiped()) != 0 {
		t.Error("the ramdisk went on after rebooting")
	}
}

func TestExecStep(t *testing.T) {
	echo, err := exec.LookPath("echo")
	if err != nil {
		t.Skip("no echo")
	}
	m, _ := deployMachine(t)
	argv := func(a ...string) string { b, _ := json.Marshal(a); return string(b) }
	for name, tc := range map[string]struct {
		args map[string]string
		ok   bool
		want string
	}{
		"output":    {map[string]string{"argv": argv(echo, "hello", "$HOME;", "no shell")}, true, "hello $HOME; no shell"},
		"exit code": {map[string]string{"argv": argv("false")}, false, "exit status 1"},
		"timeout":   {map[string]string{"argv": argv("sleep", "30"), "timeoutSeconds": "1"}, false, "timed out"},
		"no argv":   {map[string]string{"argv": "echo hi"}, false, "not a non-empty JSON list"},
		"bounded":   {map[string]string{"argv": argv("head", "-c", "100000", "/dev/zero")}, true, ""},
	} {
		t.Run(name, func(t *testing.T) {
			api := deployAPI(t, nil, protocol.RamdiskStep{Name: protocol.StepExec, Args: tc.args})
			srv := httptest.NewServer(api)
			defer srv.Close()
			if err := agent(t, srv.URL, bootToken, m).Run(context.Background()); err != nil {
				t.Fatal(err)
			}
			res := resultsOf(t, api)
			if len(res) == 0 || res[0].OK != tc.ok || !strings.Contains(res[0].Message, tc.want) || len(res[0].Message) > 5<<10 {
				t.Fatalf("result = %.300v", res)
			}
		})
	}
}

func TestWaitHonoursPollMs(t *testing.T) {
	m, _ := deployMachine(t)
	var reports atomic.Int32
	api := &fakeAPI{t: t, answer: func(n int, path string, _ map[string]json.RawMessage) (int, any) {
		if path != protocol.RamdiskReportPath {
			return http.StatusOK, steps()
		}
		if reports.Add(1) < 4 {
			// Nothing to do yet; come back soon.
			return http.StatusOK, protocol.RamdiskInstructions{NodeID: "node-1", Steps: []protocol.RamdiskStep{}, PollMs: 1}
		}
		return http.StatusOK, steps(protocol.StepPowerOff)
	}}
	srv := httptest.NewServer(api)
	defer srv.Close()
	a := agent(t, srv.URL, bootToken, m)
	// Without PollMs the ramdisk would wait an hour between reports.
	a.WaitInterval = time.Hour
	if err := a.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if reports.Load() != 4 {
		t.Errorf("%d reports, want 4", reports.Load())
	}
}

// BenchmarkWriteImage measures write-image from a local HTTP server into a
// file disk (hashing included).
func BenchmarkWriteImage(b *testing.B) {
	image := randomImage(b, 64<<20)
	imgSrv := httptest.NewServer(&imageServer{image: image, token: bootToken})
	defer imgSrv.Close()
	dir := b.TempDir()
	disk := filepath.Join(dir, "vda.img")
	if err := os.WriteFile(disk, nil, 0o600); err != nil {
		b.Fatal(err)
	}
	if err := os.Truncate(disk, 128<<20); err != nil {
		b.Fatal(err)
	}
	inv := coreinv.NodeInventory{Kind: coreinv.Kind, Version: coreinv.Version,
		System: coreinv.System{ProductUUID: "5e1c0e3a-1111-2222-3333-444455556666"},
		CPU:    coreinv.CPU{Sockets: 1, CoresPerSocket: 1, ThreadsPerCore: 1, LogicalCPUs: 1, NUMANodes: 1},
		Memory: coreinv.Memory{TotalBytes: 1 << 30}, Disks: []coreinv.Disk{{Name: "vda", SizeBytes: 128 << 20}},
		GPUs: coreinv.GPUs{Devices: []coreinv.GPU{}}}
	m := &ramdisk.Simulated{Document: &inv, DiskFiles: map[string]string{"vda": disk}}
	api := &fakeAPI{t: b, answer: func(n int, path string, _ map[string]json.RawMessage) (int, any) {
		if n == 0 {
			return http.StatusOK, protocol.RamdiskInstructions{NodeID: "n", Steps: []protocol.RamdiskStep{writeImageStep(imgSrv.URL, image), {Name: protocol.StepPowerOff}}}
		}
		return http.StatusOK, steps()
	}}
	srv := httptest.NewServer(api)
	defer srv.Close()
	b.SetBytes(int64(len(image)))
	b.ResetTimer()
	for range b.N {
		a := &ramdisk.Agent{Config: protocol.RamdiskBootConfig{APIURL: srv.URL, Token: bootToken}, Machine: m}
		api.mu.Lock()
		api.calls = nil
		api.mu.Unlock()
		if err := a.Run(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	for _, c := range api.Calls() {
		if c.Path == protocol.RamdiskResultPath {
			if r := results(b, c); !r[0].OK {
				b.Fatalf("result %+v", r)
			}
		}
	}
}
