package commands

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/better-compute/better-compute/agent/protocol"
)

// CDI (the Container Device Interface, github.com/cncf-tags/container-device-interface)
// specs: cdi.expose writes one per hold reservation, naming each of its GPUs
// as the device "<reservationId>-<i>" of the kind (nvidia.com/gpu by
// default), so a container runtime can inject
// "nvidia.com/gpu=<reservationId>-0"; cdi.withdraw removes it.

// CDIVersion is the version of the CDI spec format written.
const CDIVersion = "0.6.0"

// DefaultCDIKind is the kind of a spec whose args name none.
const DefaultCDIKind = protocol.DefaultCDIKind

// commonDeviceNodes are the device nodes every NVIDIA GPU container needs.
var commonDeviceNodes = []string{"/dev/nvidiactl", "/dev/nvidia-uvm"}

var (
	// reservationIDPattern keeps the id a safe file-name component.
	reservationIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)
	// cdiKindPattern is the CDI grammar of a kind, vendor/class.
	cdiKindPattern = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?/[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$`)
)

// CDISpec is a CDI spec, the part of the format written here.
type CDISpec struct {
	Version        string            `json:"cdiVersion"`
	Kind           string            `json:"kind"`
	Devices        []CDIDevice       `json:"devices"`
	ContainerEdits CDIContainerEdits `json:"containerEdits"`
}

// CDIDevice is one named device of a spec.
type CDIDevice struct {
	Name           string            `json:"name"`
	ContainerEdits CDIContainerEdits `json:"containerEdits"`
}

// CDIContainerEdits are the edits a device (or every device) makes.
type CDIContainerEdits struct {
	DeviceNodes []CDIDeviceNode `json:"deviceNodes,omitempty"`
}

// CDIDeviceNode is a device node to create in the container.
type CDIDeviceNode struct {
	Path string `json:"path"`
}

type cdiExposeArgs struct {
	ReservationID string            `json:"reservationId"`
	Devices       []json.RawMessage `json:"devices"`
	Kind          string            `json:"kind"`
}

type cdiWithdrawArgs struct {
	ReservationID string `json:"reservationId"`
}

func (e *Executor) cdiDir() string {
	if e.CDIDir != "" {
		return e.CDIDir
	}
	return DefaultCDIDir
}

// CDISpecPath is where cdi.expose writes the spec of a reservation.
func CDISpecPath(dir, reservationID string) string {
	return filepath.Join(dir, "better-compute-"+reservationID+".json")
}

// gpuIndex reads a device of cdi.expose's args: a GPU index, as a number or
// a decimal string.
func gpuIndex(raw json.RawMessage) (int, error) {
	var n int
	if err := json.Unmarshal(raw, &n); err != nil {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return 0, fmt.Errorf("device %s is not a GPU index", raw)
		}
		if n, err = strconv.Atoi(strings.TrimSpace(s)); err != nil {
			return 0, fmt.Errorf("device %q is not a GPU index", s)
		}
	}
	if n < 0 || n > 1023 {
		return 0, fmt.Errorf("GPU index %d is out of range", n)
	}
	return n, nil
}

// BuildCDISpec is the spec cdi.expose writes for a reservation's GPUs.
func BuildCDISpec(reservationID, kind string, gpus []int) CDISpec {
	if kind == "" {
		kind = DefaultCDIKind
	}
	spec := CDISpec{Version: CDIVersion, Kind: kind, Devices: make([]CDIDevice, len(gpus))}
	for i, g := range gpus {
		spec.Devices[i] = CDIDevice{Name: protocol.CDIDeviceName(reservationID, i), ContainerEdits: CDIContainerEdits{
			DeviceNodes: []CDIDeviceNode{{Path: "/dev/nvidia" + strconv.Itoa(g)}}}}
	}
	for _, p := range commonDeviceNodes {
		spec.ContainerEdits.DeviceNodes = append(spec.ContainerEdits.DeviceNodes, CDIDeviceNode{Path: p})
	}
	return spec
}

func checkReservationID(id string) error {
	if !reservationIDPattern.MatchString(id) {
		return fmt.Errorf("bad args: reservationId %q", id)
	}
	return nil
}

// expose writes the reservation's spec atomically, mode 0644.
func (e *Executor) expose(a cdiExposeArgs) error {
	if err := checkReservationID(a.ReservationID); err != nil {
		return err
	}
	if a.Kind != "" && !cdiKindPattern.MatchString(a.Kind) {
		return fmt.Errorf("bad args: %q is not a CDI kind", a.Kind)
	}
	if len(a.Devices) == 0 {
		return errors.New("bad args: no devices")
	}
	gpus := make([]int, len(a.Devices))
	for i, d := range a.Devices {
		g, err := gpuIndex(d)
		if err != nil {
			return fmt.Errorf("bad args: %w", err)
		}
		gpus[i] = g
	}
	raw, err := json.MarshalIndent(BuildCDISpec(a.ReservationID, a.Kind, gpus), "", "  ")
	if err != nil {
		return err
	}
	dir := e.cdiDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return writeFileAtomic(dir, filepath.Base(CDISpecPath(dir, a.ReservationID)), append(raw, '\n'), 0o644)
}

// withdraw removes the reservation's spec; none is success.
func (e *Executor) withdraw(a cdiWithdrawArgs) error {
	if err := checkReservationID(a.ReservationID); err != nil {
		return err
	}
	dir := e.cdiDir()
	err := os.Remove(CDISpecPath(dir, a.ReservationID))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return syncDir(dir)
}
