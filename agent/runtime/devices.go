package runtime

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/better-compute/better-compute/agent/commands"
	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/agent/protocol"
)

// An instance's GPUs are exposed through CDI as a hold reservation's are
// (agent/commands/cdi.go): a spec named after the instance whose devices
// are "<instanceId>-<i>", and the device nodes that exist on the node in
// the OCI config. A device id is the GPU's UUID; the driver's
// /proc/driver/nvidia/gpus/*/information maps it to its minor number.

func (r *Runtime) cdiSpecPath(id string) string { return commands.CDISpecPath(r.o.CDIDir, id) }

// nvidiaMinors maps GPU UUIDs (lower case) to their device minors.
func nvidiaMinors() map[string]int {
	out := map[string]int{}
	infos, _ := filepath.Glob("/proc/driver/nvidia/gpus/*/information")
	for _, p := range infos {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		var uuid string
		minor := -1
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if !ok {
				continue
			}
			v = strings.TrimSpace(v)
			switch strings.TrimSpace(k) {
			case "GPU UUID":
				uuid = strings.ToLower(v)
			case "Device Minor":
				fmt.Sscan(v, &minor)
			}
		}
		f.Close()
		if uuid != "" && minor >= 0 {
			out[uuid] = minor
		}
	}
	return out
}

// exposeDevices writes the instance's CDI spec and answers the device
// nodes to add to its OCI config: none for an instance without GPUs, and
// none with simulated GPUs, which have no device nodes.
func (r *Runtime) exposeDevices(in nodespec.Instance) ([]specs.LinuxDevice, error) {
	path := r.cdiSpecPath(in.ID)
	if len(in.Devices) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		return nil, nil
	}
	minors := nvidiaMinors()
	var gpus []int
	for _, d := range in.Devices {
		if m, ok := minors[strings.ToLower(d)]; ok {
			gpus = append(gpus, m)
		}
	}
	spec := commands.BuildCDISpec(in.ID, protocol.DefaultCDIKind, gpus)
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(r.o.CDIDir, 0o755); err != nil {
		return nil, err
	}
	if err := writeFileAtomic(path, b, 0o644); err != nil {
		return nil, err
	}
	var nodes []string
	for _, d := range spec.Devices {
		for _, n := range d.ContainerEdits.DeviceNodes {
			nodes = append(nodes, n.Path)
		}
	}
	for _, n := range spec.ContainerEdits.DeviceNodes {
		nodes = append(nodes, n.Path)
	}
	var devs []specs.LinuxDevice
	for _, n := range nodes {
		var st unix.Stat_t
		if err := unix.Stat(n, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
			continue // not on this node (simulated GPUs)
		}
		mode := os.FileMode(0o666)
		uid, gid := uint32(0), uint32(0)
		devs = append(devs, specs.LinuxDevice{Path: n, Type: "c", Major: int64(unix.Major(st.Rdev)), Minor: int64(unix.Minor(st.Rdev)),
			FileMode: &mode, UID: &uid, GID: &gid})
	}
	return devs, nil
}
