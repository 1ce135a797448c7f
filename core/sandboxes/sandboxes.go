// Package sandboxes holds the sandbox domain's closed sets: templates'
// runtimes and TTL actions, a sandbox's states as stored and as answered,
// and the bounds of its lifetime.
package sandboxes

import (
	pathpkg "path"
	"strings"
)

// Catalog types the domain decides on.
const (
	ResourceType         = "sandbox"
	TemplateResourceType = "sandbox-template"
	SnapshotResourceType = "sandbox-snapshot"
)

// Runtime is what runs a template's sandboxes.
type Runtime string

// Runtimes. gvisor and runc need a container flavor, vm a VM flavor.
const (
	RuntimeGVisor Runtime = "gvisor"
	RuntimeRunc   Runtime = "runc"
	RuntimeVM     Runtime = "vm"
)

// Enum implements core.Enumerated.
func (Runtime) Enum() []string {
	return []string{string(RuntimeGVisor), string(RuntimeRunc), string(RuntimeVM)}
}

// FlavorRuntime is the flavor runtime (store/flavors) a template runtime needs.
func (r Runtime) FlavorRuntime() string {
	if r == RuntimeVM {
		return "vm"
	}
	return "container"
}

// TTLAction is what happens at a sandbox's deadline.
type TTLAction string

// TTL actions.
const (
	TTLDelete   TTLAction = "delete"
	TTLSnapshot TTLAction = "snapshot"
)

// Enum implements core.Enumerated.
func (TTLAction) Enum() []string { return []string{string(TTLDelete), string(TTLSnapshot)} }

// Stored states of a sandbox row.
const (
	StoredDraft    = "draft"
	StoredDenied   = "denied"
	StoredFailed   = "failed"
	StoredLive     = "live"
	StoredDeleting = "deleting"
	StoredDeleted  = "deleted"
)

// State is a sandbox's state as the API answers it: a live sandbox is
// named by its workload's state.
type State string

// States answered.
const (
	Starting State = "starting"
	Running  State = "running"
	Stopped  State = "stopped"
	Failed   State = "failed"
	Deleting State = "deleting"
	Deleted  State = "deleted"
)

// Enum implements core.Enumerated.
func (State) Enum() []string {
	return []string{string(Starting), string(Running), string(Stopped), string(Failed), string(Deleting), string(Deleted)}
}

// Answered is the state of a sandbox stored as stored whose workload is
// in instanceState.
func Answered(stored, instanceState string) State {
	switch stored {
	case StoredDeleting:
		return Deleting
	case StoredDeleted:
		return Deleted
	case StoredFailed:
		return Failed
	}
	switch instanceState {
	case "running":
		return Running
	case "stopped", "stopping":
		return Stopped
	case "failed":
		return Failed
	case "deleting", "deleted":
		return Deleting
	}
	return Starting
}

// End reasons: why a sandbox ended.
const (
	EndDeleted      = "deleted"      // sandboxes.delete
	EndTTL          = "ttl"          // its deadline passed
	EndWorkloadGone = "workloadGone" // its workload ended by itself (a node lost, a failure)
)

// Bounds of a template's TTLs, in seconds: at least one second, at most
// 24 hours (E2B's longest paid lifetime); a sandbox meant to live longer
// is an instance.
const (
	MinTTLSeconds = 1
	MaxTTLSeconds = 86400
)

// MaxWarmPoolSize bounds a template's warm pool.
const MaxWarmPoolSize = 64

// VolumeResourceType is the catalog type a sandbox volume is decided on.
const VolumeResourceType = "sandbox-volume"

// Bounds of a volume's size, in GiB: a volume is a sparse image file on
// one host's disk, so its bound is the host's, not a block device's.
const (
	MinVolumeGiB = 1
	MaxVolumeGiB = 1024
)

// Stored states of a volume row: draft, denied and failed are its
// admission's; creating, resizing and deleting wait for the volume's node
// to observe the NodeSpec generation that carries the change.
const (
	VolumeDraft    = "draft"
	VolumeDenied   = "denied"
	VolumeFailed   = "failed"
	VolumeCreating = "creating"
	VolumeResizing = "resizing"
	VolumeReady    = "ready"
	VolumeDeleting = "deleting"
)

// VolumeState is a volume's state as the API answers it.
type VolumeState string

// Volume states answered.
const (
	VolumeStateCreating VolumeState = VolumeCreating
	VolumeStateResizing VolumeState = VolumeResizing
	VolumeStateReady    VolumeState = VolumeReady
	VolumeStateDeleting VolumeState = VolumeDeleting
	VolumeStateDeleted  VolumeState = "deleted"
	VolumeStateFailed   VolumeState = VolumeFailed
)

// Enum implements core.Enumerated.
func (VolumeState) Enum() []string {
	return []string{string(VolumeStateCreating), string(VolumeStateResizing), string(VolumeStateReady),
		string(VolumeStateDeleting), string(VolumeStateDeleted), string(VolumeStateFailed)}
}

// AnsweredVolume is the state of a volume stored as stored whose change
// the node has (observed) or has not yet applied.
func AnsweredVolume(stored string, observed bool) VolumeState {
	switch {
	case stored == VolumeDeleting && observed:
		return VolumeStateDeleted
	case (stored == VolumeCreating || stored == VolumeResizing) && observed:
		return VolumeStateReady
	}
	return VolumeState(stored)
}

// MountPathRefused says why path may not be a volume's mount point in a
// sandbox ("" when it may): an absolute, clean path, not the root and
// not under the kernel's filesystems, which the runtime mounts itself.
func MountPathRefused(path string) string {
	switch {
	case !strings.HasPrefix(path, "/"):
		return "notAbsolute"
	case pathpkg.Clean(path) != path:
		return "notClean"
	case path == "/":
		return "root"
	}
	for _, p := range []string{"/proc", "/sys", "/dev"} {
		if path == p || strings.HasPrefix(path, p+"/") {
			return "reserved"
		}
	}
	return ""
}
