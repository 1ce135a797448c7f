package dofake

import (
	"encoding/json"
	"fmt"
	"strings"
)

// DriftRule makes the provider change a resource behind its owner's back:
// every read (GET by id, listings) of a resource of Kind (and ID, any of
// the kind when empty) first rewrites Field to Value, then answers it. A
// client that "fixes" the field sees it rewritten on its next read: the
// loop a drift-loop breaker must stop.
//
// Fields: KindDatabases "size", "num_nodes", "version", "tags",
// "storage_size_mib"; KindApps "spec.<key>" (a top-level key of the app's
// spec); KindFunctionsNamespaces "label"; KindDedicatedInferences
// "enable_public_endpoint" and "scale" (its first accelerator's).
type DriftRule struct {
	Kind  string `json:"kind"`
	ID    string `json:"id,omitempty"`
	Field string `json:"field"`
	Value any    `json:"value"`

	raw []byte // Value as JSON
}

// Drift adds a rule; a rule whose kind, field or value type the fake does
// not know is refused and nothing changes.
func (f *Fake) Drift(rule DriftRule) error {
	rule, err := rule.normalized()
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.drift = append(f.st.drift, rule)
	return nil
}

// normalized checks the rule by applying it to an empty resource of its
// kind, and keeps its value as JSON.
func (rule DriftRule) normalized() (DriftRule, error) {
	raw, err := json.Marshal(rule.Value)
	if err != nil {
		return rule, fmt.Errorf("dofake: drift value: %w", err)
	}
	rule.raw = raw
	var empty any
	switch rule.Kind {
	case KindDatabases:
		empty = &cluster{}
	case KindApps:
		empty = &app{spec: map[string]any{}}
	case KindFunctionsNamespaces:
		empty = &namespace{}
	case KindDedicatedInferences:
		empty = &inference{}
	default:
		return rule, fmt.Errorf("dofake: drift of kind %q is not modelled", rule.Kind)
	}
	return rule, rewrite(empty, rule.Field, raw)
}

// DriftRules answers the rules in force.
func (f *Fake) DriftRules() []DriftRule {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]DriftRule{}, f.st.drift...)
}

// ClearDrift removes every drift rule.
func (f *Fake) ClearDrift() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.drift = nil
}

// drifted applies the drift rules of kind to the resource id (target) at
// a read.
func (st *state) drifted(kind, id string, target any) {
	for _, r := range st.drift {
		if r.Kind != kind || (r.ID != "" && r.ID != id) {
			continue
		}
		if rewrite(target, r.Field, r.raw) == nil {
			st.driftRewrites++
		}
	}
}

// rewrite sets field of target to the JSON value raw.
func rewrite(target any, field string, raw []byte) error {
	var dst any
	switch t := target.(type) {
	case *cluster:
		switch field {
		case "size":
			dst = &t.size
		case "num_nodes":
			dst = &t.numNodes
		case "version":
			dst = &t.version
		case "tags":
			dst = &t.tags
		case "storage_size_mib":
			dst = &t.storageMiB
		}
	case *app:
		if key, ok := strings.CutPrefix(field, "spec."); ok && key != "" {
			var v any
			if err := json.Unmarshal(raw, &v); err != nil {
				return fmt.Errorf("dofake: drift of %s: %w", field, err)
			}
			t.spec[key] = v
			return nil
		}
	case *namespace:
		if field == "label" {
			dst = &t.label
		}
	case *inference:
		switch field {
		case "enable_public_endpoint":
			dst = &t.spec.EnablePublicEndpoint
		case "scale":
			var scale uint64
			if err := json.Unmarshal(raw, &scale); err != nil {
				return fmt.Errorf("dofake: drift of %s: %w", field, err)
			}
			// An endpoint without a model has nothing to rescale.
			if len(t.spec.ModelDeployments) > 0 && len(t.spec.ModelDeployments[0].Accelerators) > 0 {
				t.spec.ModelDeployments[0].Accelerators[0].Scale = scale
			}
			return nil
		}
	}
	if dst == nil {
		return fmt.Errorf("dofake: drift cannot rewrite the field %q", field)
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return fmt.Errorf("dofake: drift of %s: %w", field, err)
	}
	return nil
}
