// Package pools holds a pool's pure rules: its policy type, what the
// policy's schema cannot say (cross-field rules, durations, keyed ratios),
// the fields that depend on the pool's class, and an offer's quota.
package pools

import (
	"encoding/json"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/invopop/jsonschema"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/gpu"
)

// Policy is a pool's policy. Its struct tags are its schema: unknown keys
// are refused at every level, ranges and patterns are checked before the
// handler runs. Validate checks the rest.
type Policy struct {
	// Acceptance names the checks a machine passes before it serves.
	Acceptance []string `json:"acceptance,omitempty" jsonschema:"maxItems=32,pattern=^[a-z][a-z0-9-]{0\\,63}$"`
	// Overcommit is a ratio (≥ 1) per scalar resource, e.g. {"vcpu": 2}.
	Overcommit map[string]float64 `json:"overcommit,omitempty"`
	// LostAfter is how long a silent node stays before it is lost (a Go
	// duration such as "5m").
	LostAfter string `json:"lostAfter,omitempty"`
	// DisruptionBudget is the share of the pool that may be disrupted at
	// once, in [0, 1]; DefaultDisruptionBudget when not given.
	DisruptionBudget *float64   `json:"disruptionBudget,omitempty" jsonschema:"minimum=0,maximum=1"`
	Admission        *Admission `json:"admission,omitempty"`
	// MaxPending bounds the pool's pending requests.
	MaxPending      *int   `json:"maxPending,omitempty" jsonschema:"minimum=0,maximum=1000000"`
	HardwareProfile string `json:"hardwareProfile,omitempty" jsonschema:"pattern=^[A-Za-z0-9][A-Za-z0-9._:/-]{0\\,127}$"`
	// Sharing.Replicas is the replica count of timeslice and mps pools.
	Sharing *Sharing `json:"sharing,omitempty"`
	// MigLayout is the MIG layout of mig pools.
	MigLayout  string `json:"migLayout,omitempty" jsonschema:"pattern=^[a-z0-9][a-z0-9.\\,_+-]{0\\,63}$"`
	TenantRoot bool   `json:"tenantRoot,omitempty"`
	// RequireVerifiedImages admits only images whose signature checked out
	// against an allowed signer to be deployed on the pool's machines.
	RequireVerifiedImages bool `json:"requireVerifiedImages,omitempty"`
}

// Admission is a pool policy's admission section.
type Admission struct {
	BudgetCheck *bool `json:"budgetCheck,omitempty"`
}

// Sharing is a pool policy's sharing section. Replicas is not required by
// the schema, so that an unknown key in the section is reported as such;
// Validate requires it.
type Sharing struct {
	Replicas int `json:"replicas" jsonschema:"minimum=2,maximum=64"`
}

// DefaultDisruptionBudget is a pool's disruption budget when its policy
// gives none.
const DefaultDisruptionBudget = 0.05

// resourceNamePattern names a scalar resource (overcommit, quota).
var resourceNamePattern = regexp.MustCompile(`^[a-z][A-Za-z0-9]{0,31}$`)

// maxResources bounds the resources an overcommit or a quota names. The
// keys are checked here, not by the schema, so a bad key is reported by
// its own name.
const maxResources = 32

// BadField is INVALID_INPUT on field for reason.
func BadField(field, reason, format string, args ...any) error {
	return core.Errorf(core.CodeInvalidInput, format, args...).WithDetails(map[string]any{"field": field, "reason": reason})
}

// Validate checks what a policy's schema cannot say for a pool with the
// given sharing, and fills its defaults. p may be nil (no policy).
func Validate(p *Policy, sharing string) (Policy, error) {
	var out Policy
	if p != nil {
		out = *p
	}
	if len(out.Overcommit) > maxResources {
		return out, BadField("policy.overcommit", "maxItems", "policy.overcommit has at most %d resources", maxResources)
	}
	for r, ratio := range out.Overcommit {
		if !resourceNamePattern.MatchString(r) {
			return out, BadField("policy.overcommit", "pattern", "overcommit resource %q must match %s", r, resourceNamePattern)
		}
		if ratio < 1 || ratio > 100 {
			return out, BadField("policy.overcommit", "range", "overcommit ratio of %s must be in [1, 100]", r)
		}
	}
	if out.LostAfter != "" {
		d, err := time.ParseDuration(out.LostAfter)
		if err != nil || d < time.Second || d > 7*24*time.Hour {
			return out, BadField("policy.lostAfter", "range", "policy.lostAfter must be a duration from 1s to 168h, such as \"5m\"")
		}
	}
	if out.DisruptionBudget == nil {
		b := DefaultDisruptionBudget
		out.DisruptionBudget = &b
	}
	if out.Sharing != nil {
		if sharing != "timeslice" && sharing != "mps" {
			return out, BadField("policy.sharing.replicas", "sharing", "policy.sharing.replicas is for timeslice and mps pools, not %s", sharing)
		}
		if out.Sharing.Replicas == 0 {
			return out, BadField("policy.sharing.replicas", "required", "policy.sharing needs replicas")
		}
	}
	if out.MigLayout != "" && sharing != "mig" {
		return out, BadField("policy.migLayout", "sharing", "policy.migLayout is for mig pools, not %s", sharing)
	}
	return out, nil
}

// CheckGPUModel refuses a gpuModel that is not a model family of the GPU
// catalog (the schema only checks its form).
func CheckGPUModel(model string) error {
	if !slices.Contains(gpu.Default().Families(), model) {
		return core.Errorf(core.CodeInvalidInput, "gpuModel %q is not a GPU model family of the catalog", model).
			WithDetails(map[string]any{"field": "gpuModel", "reason": "enum"})
	}
	return nil
}

// CheckClass checks that providerAccountId is given for provider pools,
// and only for them.
func CheckClass(class, providerAccountID string) error {
	switch {
	case class == "provider" && providerAccountID == "":
		return BadField("providerAccountId", "required", "a provider pool needs providerAccountId")
	case class != "provider" && providerAccountID != "":
		return BadField("providerAccountId", "class", "providerAccountId is for provider pools only, not %s", class)
	}
	return nil
}

// MaxQuota bounds one resource's quota.
const MaxQuota = 1 << 40

// Quota maps resource names to the integer amount granted; a resource the
// quota does not name grants zero. Its schema bounds each amount; Check
// checks the names.
type Quota map[string]int64

// JSONSchemaExtend bounds each amount, where a tag cannot reach.
func (Quota) JSONSchemaExtend(s *jsonschema.Schema) {
	if s.AdditionalProperties != nil {
		s.AdditionalProperties.Minimum = json.Number("0")
		s.AdditionalProperties.Maximum = json.Number(strconv.FormatInt(MaxQuota, 10))
	}
}

// Check refuses a quota naming too many resources, or a bad name.
func (q Quota) Check() error {
	if len(q) > maxResources {
		return BadField("quota", "maxItems", "quota names at most %d resources", maxResources)
	}
	for r := range q {
		if !resourceNamePattern.MatchString(r) {
			return BadField("quota."+r, "pattern", "quota resource %q must match %s", r, resourceNamePattern)
		}
	}
	return nil
}
