package site

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
)

// PurposeDiscover is the purpose in the boot configuration a machine
// without a registered boot gets: its ramdisk reports to
// protocol.RamdiskDiscoverPath with the site's discovery token.
const PurposeDiscover = "discover"

// Images builds a boot's pieces from the site's kernel and base
// initramfs (agent/ramdisk/image does the work).
type Images interface {
	// Kernel is the kernel image's path.
	Kernel() string
	// Cmdline is the kernel command line of a ramdisk boot.
	Cmdline() string
	// Initrd writes the base initramfs followed by cfg's appendix (the
	// boot's /etc/bcd/boot.json) to out.
	Initrd(cfg protocol.RamdiskBootConfig, out string) error
	// ISO writes a bootable CD of the kernel, initrd and command line to
	// out.
	ISO(ctx context.Context, initrd, out string) error
}

// BootOptions configures the site agent's boot server, which serves the
// ramdisk to the site's machines and BMCs.
type BootOptions struct {
	// Listen is the boot server's address (e.g. 127.0.0.1:0, :8081); ""
	// runs no boot server, and ramdisk boots fail as unsupported.
	Listen string
	// URL is how machines and BMCs reach the boot server, e.g.
	// http://10.0.0.2:8081; default http://<the listening address>.
	URL string
	// MachineURL is how a booted machine's ramdisk reaches the boot server
	// for its image, when that differs from URL, which BMCs use too (for
	// QEMU's user-mode network, http://10.0.2.2:PORT); default URL.
	MachineURL string
	// MachineAPIURL is how a booted ramdisk reaches the API (for QEMU's
	// user-mode network, http://10.0.2.2:PORT); default Options.APIURL.
	MachineAPIURL string
	// Images builds the boots' pieces; nil serves only the discovery
	// configuration.
	Images Images
	// Dir caches the boots' pieces and the staged images (images/); default
	// a temporary directory removed when Run returns. With a directory
	// that stays, an agent restarted goes on serving the images staged
	// before to the boots open before.
	Dir string
	// MachineAgentEndpoint is the agent listener as the site's machines
	// reach it, written into every boot's configuration (a deploy's seed
	// re-joins against it); "" leaves it to the endpoint the join answers.
	MachineAgentEndpoint string
	// QemuImg is qemu-img's path, which converts qcow2 images to raw; ""
	// looks it up on $PATH.
	QemuImg string
}

// bootIDPattern bounds what a boot id may be: it becomes a directory name.
var bootIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// bootSpec is what the activity registers.
type bootSpec struct {
	id, nodeID, mac, via string
	cfg                  protocol.RamdiskBootConfig
	// expires is when the API stops honouring the boot's token (zero:
	// not said); the boot is not served past it.
	expires time.Time
}

// boot is one registered boot and its built pieces.
type boot struct {
	bootSpec
	initrd string
	iso    string
}

// discovery is the discovery pieces of one lease term.
type discovery struct {
	cfg    protocol.RamdiskBootConfig
	initrd string
}

// bootServer serves the boots' pieces while the agent holds the lease;
// between terms it answers nothing. Registrations outlive a term (the
// machine may still be fetching them) and end with EndBoot or the process.
type bootServer struct {
	url, apiURL   string
	agentEndpoint string
	// machineURL is the boot server as the machines' ramdisks reach it;
	// "" is url.
	machineURL string
	images     Images
	dir        string
	log        *slog.Logger
	cache      *imageCache

	mu     sync.Mutex
	term   *term
	boots  map[string]*boot
	byMAC  map[string]*boot
	disc   *discovery
	discMu sync.Mutex // serialises fetching the discovery token
}

func newBootServer(o BootOptions, url, apiURL, dir string, log *slog.Logger) *bootServer {
	return &bootServer{url: strings.TrimRight(url, "/"), machineURL: strings.TrimRight(o.MachineURL, "/"), apiURL: apiURL, agentEndpoint: o.MachineAgentEndpoint,
		images: o.Images, dir: dir, log: log, cache: newImageCache(dir, o.QemuImg),
		boots: map[string]*boot{}, byMAC: map[string]*boot{}}
}

func (bs *bootServer) canBoot() bool { return bs.images != nil }

func (bs *bootServer) isoURL(id string) string { return bs.url + "/boot/" + id + "/ramdisk.iso" }

// startTerm and endTerm gate serving with the lease.
func (bs *bootServer) startTerm(t *term) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	bs.term, bs.disc = t, nil
}

func (bs *bootServer) endTerm() {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	bs.term, bs.disc = nil, nil
}

func (bs *bootServer) serving() *term {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	return bs.term
}

func (bs *bootServer) lookup(id string) *boot {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	return bs.boots[id]
}

// register builds the boot's pieces (the initrd with the boot's
// configuration; for virtual media the ISO) and serves them.
func (bs *bootServer) register(ctx context.Context, t *term, spec bootSpec) (*boot, error) {
	if !usableBootID(spec.id) {
		return nil, fmt.Errorf("site: boot id %q is not a usable name", spec.id)
	}
	spec.mac = normalizeMAC(spec.mac)
	spec.cfg.APIURL = bs.apiURL
	spec.cfg.AgentEndpoint = bs.agentEndpoint
	b := &boot{bootSpec: spec}
	dir := filepath.Join(bs.dir, spec.id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("site: %w", err)
	}
	if err := writeTokenRecord(dir, spec); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("site: keep the boot's token digest: %w", err)
	}
	b.initrd = filepath.Join(dir, "initrd.img")
	if err := bs.images.Initrd(spec.cfg, b.initrd); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("site: build the boot's initrd: %w", err)
	}
	if spec.via == ViaVirtualMedia {
		b.iso = filepath.Join(dir, "ramdisk.iso")
		started := time.Now()
		if err := bs.images.ISO(ctx, b.initrd, b.iso); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("site: build the boot's ISO: %w", err)
		}
		bs.log.Info("built a boot's ISO", "boot", spec.id, "node", spec.nodeID, "took", time.Since(started).String())
	}
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if old := bs.boots[spec.id]; old != nil && old.mac != "" {
		delete(bs.byMAC, old.mac)
	}
	bs.pruneLocked(time.Now())
	bs.boots[spec.id] = b
	if b.mac != "" {
		bs.byMAC[b.mac] = b
	}
	bs.log.Info("serving a ramdisk boot", "boot", spec.id, "node", spec.nodeID, "via", spec.via, "mac", b.mac)
	return b, nil
}

// pruneLocked forgets the boots whose tokens expired: their EndBoot may
// have gone to another agent.
func (bs *bootServer) pruneLocked(now time.Time) {
	for id, b := range bs.boots {
		if b.expired(now) {
			delete(bs.boots, id)
			if b.mac != "" && bs.byMAC[b.mac] == b {
				delete(bs.byMAC, b.mac)
			}
			os.RemoveAll(filepath.Join(bs.dir, id))
		}
	}
}

func (b *boot) expired(now time.Time) bool { return !b.expires.IsZero() && !now.Before(b.expires) }

// usableBootID says whether a boot id may name the boot's directory (the
// image cache's is not one).
func usableBootID(id string) bool { return bootIDPattern.MatchString(id) && id != imagesDir }

// unregister stops serving a boot and removes its pieces, also those a
// process before this one left (its token's digest among them).
func (bs *bootServer) unregister(id string) {
	bs.mu.Lock()
	b := bs.boots[id]
	delete(bs.boots, id)
	if b != nil && b.mac != "" && bs.byMAC[b.mac] == b {
		delete(bs.byMAC, b.mac)
	}
	bs.mu.Unlock()
	if usableBootID(id) {
		os.RemoveAll(filepath.Join(bs.dir, id))
	}
	if b != nil {
		bs.log.Info("stopped serving a ramdisk boot", "boot", id)
	}
}

// discoveryPieces fetches the site's discovery token once per term.
func (bs *bootServer) discoveryPieces(ctx context.Context, t *term, withInitrd bool) (*discovery, error) {
	bs.discMu.Lock()
	defer bs.discMu.Unlock()
	bs.mu.Lock()
	d := bs.disc
	bs.mu.Unlock()
	if d == nil {
		var got protocol.SiteDiscoveryTokenResult
		if err := t.post(ctx, protocol.SiteDiscoveryTokenPath, t.auth(), &got); err != nil {
			return nil, err
		}
		if got.Token == "" {
			return nil, errors.New("site: the API answered no discovery token")
		}
		d = &discovery{cfg: protocol.RamdiskBootConfig{APIURL: bs.apiURL, Token: got.Token, Purpose: PurposeDiscover}}
	}
	if withInitrd && d.initrd == "" && bs.images != nil {
		p := filepath.Join(bs.dir, fmt.Sprintf("discovery-%d", t.epoch), "initrd.img")
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return nil, err
		}
		if err := bs.images.Initrd(d.cfg, p); err != nil {
			return nil, err
		}
		d = &discovery{cfg: d.cfg, initrd: p}
	}
	bs.mu.Lock()
	if bs.term == t {
		bs.disc = d
	}
	bs.mu.Unlock()
	return d, nil
}

// normalizeMAC is the lower-case, colon-separated form of a MAC, as iPXE's
// ${net0/mac} writes it; "" when it is not a MAC.
func normalizeMAC(s string) string {
	hw, err := net.ParseMAC(strings.ReplaceAll(strings.TrimSpace(s), "-", ":"))
	if err != nil {
		return ""
	}
	return hw.String()
}

// handler is the boot server's HTTP API (GET only).
func (bs *bootServer) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /boot/{id}/ramdisk.iso", func(w http.ResponseWriter, r *http.Request) {
		b := bs.servedBoot(r.PathValue("id"))
		if b == nil || b.iso == "" {
			http.NotFound(w, r)
			return
		}
		serveFile(w, r, b.iso, "application/x-iso9660-image")
	})
	mux.HandleFunc("GET /boot/{id}/boot.json", func(w http.ResponseWriter, r *http.Request) {
		if b := bs.servedBoot(r.PathValue("id")); b != nil {
			writeConfig(w, b.cfg)
			return
		}
		http.NotFound(w, r)
	})
	mux.HandleFunc("GET /boot/{id}/vmlinuz", func(w http.ResponseWriter, r *http.Request) {
		if bs.servedBoot(r.PathValue("id")) == nil || bs.images == nil {
			http.NotFound(w, r)
			return
		}
		serveFile(w, r, bs.images.Kernel(), "application/octet-stream")
	})
	mux.HandleFunc("GET /boot/{id}/initrd.img", func(w http.ResponseWriter, r *http.Request) {
		b := bs.servedBoot(r.PathValue("id"))
		if b == nil {
			http.NotFound(w, r)
			return
		}
		serveFile(w, r, b.initrd, "application/octet-stream")
	})
	mux.HandleFunc("GET /boot/mac/{mac}/{piece}", bs.serveMAC)
	mux.HandleFunc("GET /images/{node}/{sha}", bs.serveImage)
	// What dnsmasq hands iPXE: chain to the machine's own script, by MAC.
	mux.HandleFunc("GET /boot/ipxe", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "#!ipxe\nchain %s/boot/mac/${net0/mac}/ipxe\n", bs.url)
	})
	return mux
}

// servedBoot is a registered boot, while the agent holds the lease.
func (bs *bootServer) servedBoot(id string) *boot {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if bs.term == nil {
		return nil
	}
	if b := bs.boots[id]; b != nil && !b.expired(time.Now()) {
		return b
	}
	return nil
}

// serveMAC answers a network-booting machine by its MAC: its registered
// boot's pieces, or the discovery ramdisk's when none is registered.
func (bs *bootServer) serveMAC(w http.ResponseWriter, r *http.Request) {
	mac := normalizeMAC(r.PathValue("mac"))
	piece := r.PathValue("piece")
	if mac == "" {
		http.NotFound(w, r)
		return
	}
	bs.mu.Lock()
	t, b := bs.term, bs.byMAC[mac]
	bs.mu.Unlock()
	if b != nil && b.expired(time.Now()) {
		b = nil
	}
	if t == nil {
		http.Error(w, "this site agent does not serve the site now", http.StatusServiceUnavailable)
		return
	}
	var (
		cfg    protocol.RamdiskBootConfig
		initrd string
	)
	if b != nil {
		cfg, initrd = b.cfg, b.initrd
	} else {
		d, err := bs.discoveryPieces(r.Context(), t, piece == "initrd.img")
		if err != nil {
			bs.log.Warn("could not serve the discovery ramdisk", "mac", mac, "error", err.Error())
			http.Error(w, "the discovery ramdisk is not available", http.StatusServiceUnavailable)
			return
		}
		cfg, initrd = d.cfg, d.initrd
	}
	switch piece {
	case "boot.json":
		writeConfig(w, cfg)
	case "ipxe":
		if bs.images == nil {
			http.NotFound(w, r)
			return
		}
		base := bs.url + "/boot/mac/" + mac
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "#!ipxe\nkernel %s/vmlinuz %s\ninitrd %s/initrd.img\nboot\n", base, bs.images.Cmdline(), base)
	case "vmlinuz":
		if bs.images == nil {
			http.NotFound(w, r)
			return
		}
		serveFile(w, r, bs.images.Kernel(), "application/octet-stream")
	case "initrd.img":
		if initrd == "" {
			http.NotFound(w, r)
			return
		}
		serveFile(w, r, initrd, "application/octet-stream")
	default:
		http.NotFound(w, r)
	}
}

func writeConfig(w http.ResponseWriter, cfg protocol.RamdiskBootConfig) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(cfg)
}

// serveFile serves a piece with ranges (BMCs fetch ISOs in chunks).
func serveFile(w http.ResponseWriter, r *http.Request, path, contentType string) {
	f, err := os.Open(path)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.IsDir() {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Cache-Control", "no-store")
	http.ServeContent(w, r, "", st.ModTime(), f)
}
