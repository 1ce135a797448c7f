package cloudresources

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// References are the spec fields that name objects outside the resource,
// as paths into the spec: dot-separated property names, "*" for every
// element of an array ("rules.*.type", "services.*.github").
type References struct {
	// AccountWide fields reach objects of the whole provider account (a
	// VPC, a registry, linked repositories, a cluster by name): a create on
	// a shared account refuses them.
	AccountWide []Reference `json:"accountWide,omitempty"`
	// Instances fields name instances of the tenant by their ids.
	Instances []Reference `json:"instances,omitempty"`
	// Networks fields name networks of the tenant by their ids.
	Networks []Reference `json:"networks,omitempty"`
}

// Reference is one path; a field whose value is one of Except does not
// count (a firewall rule of type ip_addr names no account object).
type Reference struct {
	Path   string   `json:"path"`
	Except []string `json:"except,omitempty"`
}

// AccountWide names the fields of spec that reach account-wide objects, as
// Validate names fields (spec.rules.1.type), sorted and deduplicated; none
// for a spec that is not a JSON object.
func (m *Manifest) AccountWide(spec json.RawMessage) []string {
	var out []string
	for _, ref := range m.References.AccountWide {
		for _, hit := range ref.find(spec) {
			out = append(out, specField(hit.at...))
		}
	}
	return sortedUnique(out)
}

// Instances are the instance ids spec names, sorted and deduplicated.
func (m *Manifest) Instances(spec json.RawMessage) []string {
	return namedIDs(m.References.Instances, spec)
}

// Networks are the network ids spec names, sorted and deduplicated.
func (m *Manifest) Networks(spec json.RawMessage) []string {
	return namedIDs(m.References.Networks, spec)
}

func namedIDs(refs []Reference, spec json.RawMessage) []string {
	var out []string
	for _, ref := range refs {
		for _, hit := range ref.find(spec) {
			if s, ok := hit.value.(string); ok && s != "" {
				out = append(out, s)
			}
		}
	}
	return sortedUnique(out)
}

func sortedUnique(s []string) []string {
	slices.Sort(s)
	return slices.Compact(s)
}

type referenceHit struct {
	at    []string
	value any
}

// find answers the fields of spec at the reference's path that are
// present, not null, and whose value is not excepted.
func (ref Reference) find(spec json.RawMessage) []referenceHit {
	var doc any
	if json.Unmarshal(spec, &doc) != nil {
		return nil
	}
	var hits []referenceHit
	walkPath(doc, strings.Split(ref.Path, "."), nil, func(at []string, v any) {
		if v == nil {
			return
		}
		if s, ok := v.(string); ok && slices.Contains(ref.Except, s) {
			return
		}
		hits = append(hits, referenceHit{at: slices.Clone(at), value: v})
	})
	return hits
}

func walkPath(v any, segs, at []string, visit func([]string, any)) {
	if len(segs) == 0 {
		visit(at, v)
		return
	}
	if segs[0] == "*" {
		list, _ := v.([]any)
		for i, item := range list {
			walkPath(item, segs[1:], append(at, strconv.Itoa(i)), visit)
		}
		return
	}
	obj, _ := v.(map[string]any)
	if next, ok := obj[segs[0]]; ok {
		walkPath(next, segs[1:], append(at, segs[0]), visit)
	}
}

// checkReferences checks that every reference path exists in the spec
// schema doc (following local $refs and allOf, anyOf, oneOf branches).
func checkReferences(refs References, doc map[string]any) error {
	groups := map[string][]Reference{"accountWide": refs.AccountWide, "instances": refs.Instances, "networks": refs.Networks}
	for group, list := range groups {
		for _, ref := range list {
			if ref.Path == "" || !schemaHasPath(doc, doc, strings.Split(ref.Path, "."), 0) {
				return fmt.Errorf("references.%s: path %q is not in the spec schema", group, ref.Path)
			}
		}
	}
	return nil
}

// maxSchemaDepth bounds $ref chasing, so a recursive schema cannot loop.
const maxSchemaDepth = 32

func schemaHasPath(root, node map[string]any, segs []string, depth int) bool {
	if depth > maxSchemaDepth || node == nil {
		return false
	}
	if len(segs) == 0 {
		return true
	}
	if ref, ok := node["$ref"].(string); ok {
		if target := localDef(root, ref); target != nil && schemaHasPath(root, target, segs, depth+1) {
			return true
		}
	}
	for _, key := range []string{"allOf", "anyOf", "oneOf"} {
		branches, _ := node[key].([]any)
		for _, b := range branches {
			if sub, ok := b.(map[string]any); ok && schemaHasPath(root, sub, segs, depth+1) {
				return true
			}
		}
	}
	if segs[0] == "*" {
		items, _ := node["items"].(map[string]any)
		return items != nil && schemaHasPath(root, items, segs[1:], depth+1)
	}
	props, _ := node["properties"].(map[string]any)
	sub, _ := props[segs[0]].(map[string]any)
	return sub != nil && schemaHasPath(root, sub, segs[1:], depth+1)
}

// localDef resolves "#/$defs/name" (or "#/definitions/name") within root.
func localDef(root map[string]any, ref string) map[string]any {
	for _, prefix := range []string{"#/$defs/", "#/definitions/"} {
		if name, ok := strings.CutPrefix(ref, prefix); ok {
			defs, _ := root[strings.TrimSuffix(strings.TrimPrefix(prefix, "#/"), "/")].(map[string]any)
			sub, _ := defs[name].(map[string]any)
			return sub
		}
	}
	return nil
}
