package runtime

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// The instance network: one Linux bridge with the subnet's gateway
// address, and per container a network namespace (ip netns, so it outlives
// a stopped container and keeps its address) holding one end of a veth
// pair whose other end is on the bridge. Everything goes through iproute2's
// `ip`, which every node has.

// netnsName is the named network namespace of a container.
func netnsName(id string) string { return "bc-" + id }

// netnsPath is where ip netns keeps it, for the OCI config.
func netnsPath(id string) string { return filepath.Join("/run/netns", netnsName(id)) }

// hostVeth is the bridge end of a container's veth pair: a hash of the
// bridge and the id, since link names have 15 characters at most.
func (r *Runtime) hostVeth(id string) string { return "bcv" + r.linkHash(id) }

func (r *Runtime) peerVeth(id string) string { return "bcp" + r.linkHash(id) }

func (r *Runtime) linkHash(id string) string {
	h := sha256.Sum256([]byte(r.o.Bridge + "/" + id))
	return hex.EncodeToString(h[:])[:11]
}

// ip runs iproute2's ip with args.
func ip(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// ipExists is ip with "File exists" (the thing is already there) an answer.
func ipExists(ctx context.Context, args ...string) error {
	if err := ip(ctx, args...); err != nil && !strings.Contains(err.Error(), "File exists") && !strings.Contains(err.Error(), "already assigned") {
		return err
	}
	return nil
}

func linkExists(ctx context.Context, name string) bool {
	return exec.CommandContext(ctx, "ip", "link", "show", "dev", name).Run() == nil
}

// ensureBridge makes the bridge with the gateway address, up.
func (r *Runtime) ensureBridge(ctx context.Context) error {
	if !linkExists(ctx, r.o.Bridge) {
		if err := ipExists(ctx, "link", "add", r.o.Bridge, "type", "bridge"); err != nil {
			return err
		}
	}
	gw := netip.PrefixFrom(r.gw, r.prefix.Bits()).String()
	if err := ipExists(ctx, "addr", "add", gw, "dev", r.o.Bridge); err != nil {
		return err
	}
	return ip(ctx, "link", "set", r.o.Bridge, "up")
}

// address answers id's address, allocating the lowest free one of the
// subnet the first time and keeping it in the instance's directory.
func (r *Runtime) address(id string) (netip.Addr, error) {
	r.netMu.Lock()
	defer r.netMu.Unlock()
	if a, err := r.readAddress(id); err == nil {
		return netip.ParseAddr(a)
	}
	used := map[netip.Addr]bool{r.gw: true}
	ents, err := os.ReadDir(r.instancesDir())
	if err != nil {
		return netip.Addr{}, err
	}
	for _, e := range ents {
		if a, err := r.readAddress(e.Name()); err == nil {
			if p, err := netip.ParseAddr(a); err == nil {
				used[p] = true
			}
		}
	}
	last := lastAddr(r.prefix)
	for a := r.prefix.Addr().Next(); a.IsValid() && a.Less(last); a = a.Next() {
		if !used[a] {
			if err := writeFileAtomic(filepath.Join(r.instanceDir(id), "address"), []byte(a.String()+"\n"), 0o600); err != nil {
				return netip.Addr{}, err
			}
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no free address left in %s", r.prefix)
}

func (r *Runtime) readAddress(id string) (string, error) {
	b, err := os.ReadFile(filepath.Join(r.instanceDir(id), "address"))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// lastAddr is the prefix's broadcast address.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) | host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// ensureNetwork gives the container id its namespace, veth pair and
// address; it is idempotent, and rebuilds a half-made one.
func (r *Runtime) ensureNetwork(ctx context.Context, id string) (netip.Addr, error) {
	addr, err := r.address(id)
	if err != nil {
		return netip.Addr{}, err
	}
	r.netMu.Lock()
	defer r.netMu.Unlock()
	if err := r.ensureBridge(ctx); err != nil {
		return netip.Addr{}, err
	}
	ns, host, peer := netnsName(id), r.hostVeth(id), r.peerVeth(id)
	_, nsErr := os.Stat(netnsPath(id))
	if nsErr != nil || !linkExists(ctx, host) {
		// Missing or half made (a crash between two steps): start over.
		_ = ip(ctx, "netns", "del", ns)
		_ = ip(ctx, "link", "del", host)
		steps := [][]string{
			{"netns", "add", ns},
			{"link", "add", host, "type", "veth", "peer", "name", peer},
			{"link", "set", peer, "netns", ns},
			{"-n", ns, "link", "set", peer, "name", "eth0"},
		}
		for _, s := range steps {
			if err := ip(ctx, s...); err != nil {
				return netip.Addr{}, err
			}
		}
	}
	steps := [][]string{
		{"-n", ns, "addr", "add", netip.PrefixFrom(addr, r.prefix.Bits()).String(), "dev", "eth0"},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "link", "set", "eth0", "up"},
		{"-n", ns, "route", "replace", "default", "via", r.gw.String()},
		{"link", "set", host, "master", r.o.Bridge},
		{"link", "set", host, "up"},
	}
	for _, s := range steps {
		if err := ipExists(ctx, s...); err != nil {
			return netip.Addr{}, err
		}
	}
	return addr, nil
}

// freeNetwork deletes id's namespace and veth pair; the address is freed
// with the instance's directory.
func (r *Runtime) freeNetwork(id string) error {
	r.netMu.Lock()
	defer r.netMu.Unlock()
	ctx := context.Background()
	if _, err := os.Stat(netnsPath(id)); err == nil {
		if err := ip(ctx, "netns", "del", netnsName(id)); err != nil {
			return err
		}
	}
	if linkExists(ctx, r.hostVeth(id)) {
		// Deleting the namespace deletes the pair, not always at once.
		if err := ip(ctx, "link", "del", r.hostVeth(id)); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
			return err
		}
	}
	return nil
}
