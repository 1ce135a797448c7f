// Package nodes holds a node's state axes as typed constants, the
// schedulability predicate and the rules of labels and taints. It is pure: no I/O.
package nodes

import (
	"regexp"
	"strings"

	"github.com/better-compute/better-compute/core"
)

// ProvisionState is where a node is in its provisioning lifecycle.
type ProvisionState string

// The provision states.
const (
	Adopting      ProvisionState = "adopting"
	Adopted       ProvisionState = "adopted"
	Enrolling     ProvisionState = "enrolling"
	Inspecting    ProvisionState = "inspecting"
	Commissioning ProvisionState = "commissioning"
	Ready         ProvisionState = "ready"
	Deploying     ProvisionState = "deploying"
	Deployed      ProvisionState = "deployed"
	Releasing     ProvisionState = "releasing"
	Rescue        ProvisionState = "rescue"
	Failed        ProvisionState = "failed"
	Retiring      ProvisionState = "retiring"
	Retired       ProvisionState = "retired"
)

// ProvisionStates lists every provision state, in lifecycle order.
var ProvisionStates = []ProvisionState{Adopting, Adopted, Enrolling, Inspecting, Commissioning, Ready,
	Deploying, Deployed, Releasing, Rescue, Failed, Retiring, Retired}

// Enum lists every provision state, so an input field of this type takes
// only these.
func (ProvisionState) Enum() []string { return names(ProvisionStates) }

// Power is what the BMC says of the node's power.
type Power string

// The power states.
const (
	PowerOn      Power = "on"
	PowerOff     Power = "off"
	PowerUnknown Power = "unknown"
)

// Powers lists every power state.
var Powers = []Power{PowerOn, PowerOff, PowerUnknown}

// Connectivity is whether the control plane reaches the node.
type Connectivity string

// The connectivity states.
const (
	Connected    Connectivity = "connected"
	Disconnected Connectivity = "disconnected"
	Unreachable  Connectivity = "unreachable"
	Lost         Connectivity = "lost"
)

// Connectivities lists every connectivity state.
var Connectivities = []Connectivity{Connected, Disconnected, Unreachable, Lost}

// Enum lists every connectivity state, so an input field of this type takes
// only these.
func (Connectivity) Enum() []string { return names(Connectivities) }

func names[T ~string](values []T) []string {
	out := make([]string, len(values))
	for i, v := range values {
		out[i] = string(v)
	}
	return out
}

// Role is what a node is for.
type Role string

// The roles.
const (
	RoleUnassigned Role = "unassigned"
	RoleHost       Role = "host"
	RoleDedicated  Role = "dedicated"
	RoleSite       Role = "site"
)

// Roles lists every role.
var Roles = []Role{RoleUnassigned, RoleHost, RoleDedicated, RoleSite}

// Trust is who controls the machine.
type Trust string

// The trust levels.
const (
	TrustPlatform         Trust = "platform"
	TrustTenantOwned      Trust = "tenant-owned"
	TrustTenantControlled Trust = "tenant-controlled"
)

// Trusts lists every trust level.
var Trusts = []Trust{TrustPlatform, TrustTenantOwned, TrustTenantControlled}

// Adapter names how the control plane reaches a node.
type Adapter string

// The adapters.
const (
	AdapterBCD         Adapter = "bcd/v1"
	AdapterProviderAPI Adapter = "provider-api/v1"
)

// Adapters lists every adapter.
var Adapters = []Adapter{AdapterBCD, AdapterProviderAPI}

// Taint effects.
const (
	EffectNoSchedule       = "NoSchedule"
	EffectPreferNoSchedule = "PreferNoSchedule"
	EffectNoExecute        = "NoExecute"
)

// TaintEffects lists every taint effect.
var TaintEffects = []string{EffectNoSchedule, EffectPreferNoSchedule, EffectNoExecute}

// NodeView is what the schedulability predicate reads of a node.
type NodeView struct {
	ProvisionState     ProvisionState
	Role               Role
	Maintenance        bool
	Cordoned           bool
	Connectivity       Connectivity
	NoScheduleReasons  []string
	ObservedGeneration int64
	Trust              Trust
	// OwnerTenant is the tenant that owns the machine; it matters only for
	// tenant-owned trust.
	OwnerTenant string
}

// Reasons Schedulable gives, one per failing clause.
const (
	ReasonProvisionState     = "ProvisionState"
	ReasonRole               = "Role"
	ReasonMaintenance        = "Maintenance"
	ReasonCordoned           = "Cordoned"
	ReasonConnectivity       = "Connectivity"
	ReasonNoScheduleReasons  = "NoScheduleReasons"
	ReasonObservedGeneration = "ObservedGeneration"
	ReasonTrust              = "Trust"
)

// Schedulable reports whether a node may be scheduled on, and why not: one
// reason per failing clause, in the spec's order. A node is schedulable only
// when its provisionState is adopted or deployed, its role is host, it is
// neither in maintenance nor cordoned, connectivity is connected, its
// noScheduleReasons list is empty, observedGeneration is at least 1, and
// its trust is platform, or tenant-owned in a pool its owner owns
// (poolOwnerTenant is the owner of the pool the node serves).
func Schedulable(n NodeView, poolOwnerTenant string) (bool, []string) {
	reasons := []string{}
	if n.ProvisionState != Adopted && n.ProvisionState != Deployed {
		reasons = append(reasons, ReasonProvisionState)
	}
	if n.Role != RoleHost {
		reasons = append(reasons, ReasonRole)
	}
	if n.Maintenance {
		reasons = append(reasons, ReasonMaintenance)
	}
	if n.Cordoned {
		reasons = append(reasons, ReasonCordoned)
	}
	if n.Connectivity != Connected {
		reasons = append(reasons, ReasonConnectivity)
	}
	if len(n.NoScheduleReasons) > 0 {
		reasons = append(reasons, ReasonNoScheduleReasons)
	}
	if n.ObservedGeneration < 1 {
		reasons = append(reasons, ReasonObservedGeneration)
	}
	switch {
	case n.Trust == TrustPlatform:
	case n.Trust == TrustTenantOwned && n.OwnerTenant != "" && n.OwnerTenant == poolOwnerTenant:
	default:
		reasons = append(reasons, ReasonTrust)
	}
	return len(reasons) == 0, reasons
}

// A node's bounds.
const (
	MaxLabels = 64
	MaxTaints = 32
)

// Kubernetes label syntax: a key is an optional DNS-subdomain prefix and
// "/", then a name of at most 63 characters; a value is empty or a name.
var (
	labelNamePattern   = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	labelPrefixPattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// CheckLabelKey validates a Kubernetes-style label or taint key; field
// names the input in the error.
func CheckLabelKey(field, key string) error {
	prefix, name, hasPrefix := strings.Cut(key, "/")
	if !hasPrefix {
		name, prefix = prefix, ""
	}
	if hasPrefix && (prefix == "" || len(prefix) > 253 || !labelPrefixPattern.MatchString(prefix)) {
		return badField(field, "pattern", "key %q: the prefix must be a DNS subdomain of at most 253 characters", key)
	}
	if len(name) > 63 || !labelNamePattern.MatchString(name) {
		return badField(field, "pattern", "key %q: the name must be 1-63 characters, alphanumerics with -, _ or . inside", key)
	}
	return nil
}

// CheckLabelValue validates a label's or taint's value.
func CheckLabelValue(field, key, value string) error {
	if value != "" && (len(value) > 63 || !labelNamePattern.MatchString(value)) {
		return badField(field, "pattern", "value of %q must be empty or 1-63 characters, alphanumerics with -, _ or . inside", key)
	}
	return nil
}

func badField(field, reason, format string, args ...any) error {
	return core.Errorf(core.CodeInvalidInput, format, args...).WithDetails(map[string]any{"field": field, "reason": reason})
}
