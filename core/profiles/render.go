package profiles

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/better-compute/better-compute/core/provisioning"
	"github.com/better-compute/better-compute/core/secrets"
	"github.com/better-compute/better-compute/drivers"
)

// Target is what a profile is rendered for: one node and the image the
// profile resolved to. Its JSON form (Data) is the templates' data:
// {{ .node.name }}, {{ .image.version }}, {{ (index .node.disks 0).name }}.
type Target struct {
	// Kind is metal or vps.
	Kind  string                 `json:"kind"`
	Node  Node                   `json:"node"`
	Image *provisioning.ImageRef `json:"image,omitempty"`
	// PoolRequiresVerifiedImages: the node's pool admits verified images
	// only (core/pools.Policy.RequireVerifiedImages).
	PoolRequiresVerifiedImages bool `json:"-"`
}

// Node is a target node's facts.
type Node struct {
	ID       string            `json:"id"`
	Name     string            `json:"name"`
	PoolID   string            `json:"poolId"`
	SiteID   string            `json:"siteId"`
	BootMAC  string            `json:"bootMac"`
	Hostname string            `json:"hostname"`
	Labels   map[string]string `json:"labels"`
	Disks    []Disk            `json:"disks"`
	NICs     []NIC             `json:"nics"`
	// DriverBindings are the node's (concern → driver).
	DriverBindings map[string]string `json:"driverBindings"`
}

// Disk is one of a node's disks, from its latest inventory.
type Disk struct {
	Name      string `json:"name"`
	Model     string `json:"model"`
	Serial    string `json:"serial"`
	WWN       string `json:"wwn"`
	SizeBytes int64  `json:"sizeBytes"`
	SizeGiB   int64  `json:"sizeGiB"`
}

// NIC is one of a node's physical network interfaces.
type NIC struct {
	Name string `json:"name"`
	MAC  string `json:"mac"`
}

// Data is the templates' data: the target as its JSON form reads, as maps
// (so missingkey=error refuses a misspelt field) with numbers kept whole.
func (t Target) Data() (map[string]any, error) {
	if t.Node.Labels == nil {
		t.Node.Labels = map[string]string{}
	}
	if t.Node.DriverBindings == nil {
		t.Node.DriverBindings = map[string]string{}
	}
	if t.Node.Disks == nil {
		t.Node.Disks = []Disk{}
	}
	if t.Node.NICs == nil {
		t.Node.NICs = []NIC{}
	}
	raw, err := json.Marshal(t)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var data map[string]any
	return data, dec.Decode(&data)
}

// Rendered is a profile expanded for one target: the workflow's steps and
// the context they share.
type Rendered struct {
	Steps   []provisioning.Step  `json:"steps"`
	Context provisioning.Context `json:"context"`
}

// hostnameRE is an RFC 1123 host name: dot-separated DNS labels.
var hostnameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$`)

// maxHostname bounds a rendered host name (DNS's bound).
const maxHostname = 253

// Render expands doc for t: the templates rendered against t's data, the
// steps' defaults filled, and everything checked. It answers every
// problem found; a rendering with problems is not to be run. The context's
// profile id and version are the caller's to fill.
func Render(doc Document, t Target) (Rendered, []Problem) {
	var out Rendered
	problems := Check(doc)
	add := func(field, reason, format string, args ...any) {
		problems = append(problems, Problem{Field: field, Reason: reason, Message: fmt.Sprintf(format, args...)})
	}
	if doc.Target != t.Kind {
		add("target", ReasonTargetMismatch, "the profile is for %s targets, the node is a %s target", doc.Target, t.Kind)
	}
	for _, concern := range slices.Sorted(maps.Keys(doc.Bindings)) {
		want, have := doc.Bindings[concern], t.Node.DriverBindings[concern]
		if drivers.CheckBinding(concern, want) == "" && doc.Target == TargetMetal && have != want {
			if have == "" {
				have = "no driver"
			}
			add("bindings."+concern, ReasonBindingMismatch, "the profile needs %s bound to %s; node %s binds %s", concern, want, t.Node.ID, have)
		}
	}
	data, err := t.Data()
	if err != nil {
		add("", "internal", "the target's data: %v", err)
		return out, problems
	}
	ctx := provisioning.Context{
		Target:          doc.Target,
		Image:           t.Image,
		RequireVerified: doc.RequireVerifiedImage || t.PoolRequiresVerifiedImages,
		RootDevice:      doc.HostConfig.RootDevice,
		Acceptance:      doc.Acceptance,
	}
	if doc.UserDataIsSecret() {
		ctx.UserDataSecret = doc.UserData
	} else {
		ctx.UserData = doc.UserData
	}
	if doc.HostConfig.Hostname != "" {
		h, err := Expand("hostConfig.hostname", doc.HostConfig.Hostname, data)
		switch {
		case err != nil:
			add("hostConfig.hostname", ReasonTemplate, "%v", err)
		case len(h) > maxHostname || !hostnameRE.MatchString(h):
			add("hostConfig.hostname", provisioning.ReasonPattern, "hostConfig.hostname renders to %q, not a host name (lower-case DNS labels joined by dots)", h)
		default:
			ctx.Hostname = h
		}
	}
	for _, k := range slices.Sorted(maps.Keys(doc.HostConfig.MetaData)) {
		v, err := Expand("hostConfig.metaData."+k, doc.HostConfig.MetaData[k], data)
		if err != nil {
			add("hostConfig.metaData."+k, ReasonTemplate, "%v", err)
			continue
		}
		if ctx.MetaData == nil {
			ctx.MetaData = map[string]string{}
		}
		ctx.MetaData[k] = v
	}
	steps, stepProblems := renderSteps(doc, data)
	problems = append(problems, stepProblems...)
	out.Steps, out.Context = steps, ctx
	return out, dedupe(problems)
}

// Check is what can be checked of a document without a target: the
// bindings against the driver catalog, the user data's reference, every
// template's syntax, the steps as far as their arguments are not templates,
// and the acceptance checks.
func Check(doc Document) []Problem {
	var problems []Problem
	add := func(field, reason, format string, args ...any) {
		problems = append(problems, Problem{Field: field, Reason: reason, Message: fmt.Sprintf(format, args...)})
	}
	for _, concern := range slices.Sorted(maps.Keys(doc.Bindings)) {
		if doc.Target != TargetMetal {
			add("bindings."+concern, ReasonBinding, "driver bindings are for metal targets")
			continue
		}
		if why := drivers.CheckBinding(concern, doc.Bindings[concern]); why != "" {
			add("bindings."+concern, ReasonBinding, "%s", why)
		}
	}
	if doc.UserDataIsSecret() {
		if _, _, err := secrets.ParseRef(doc.UserData); err != nil {
			add("userData", ReasonSecretRef, "userData is inline cloud-init text or a secret://<tenant>/<name> reference: this reference is not one")
		}
	}
	if _, err := parse("hostConfig.hostname", doc.HostConfig.Hostname); err != nil {
		add("hostConfig.hostname", ReasonTemplate, "%v", err)
	}
	for _, k := range slices.Sorted(maps.Keys(doc.HostConfig.MetaData)) {
		if _, err := parse("hostConfig.metaData."+k, doc.HostConfig.MetaData[k]); err != nil {
			add("hostConfig.metaData."+k, ReasonTemplate, "%v", err)
		}
	}
	for i, s := range doc.Steps {
		walkStrings(fmt.Sprintf("steps[%d].args", i), s.Args, func(field, text string) {
			if _, err := parse(field, text); err != nil {
				add(field, ReasonTemplate, "%v", err)
			}
		})
	}
	// The steps with their templates unexpanded: a templated argument's
	// value is known only for a target, so its value problems wait.
	for _, p := range provisioning.ValidateSteps(specSteps(doc)) {
		if !templated(doc, p.Field) {
			problems = append(problems, p)
		}
	}
	for i, c := range doc.Acceptance {
		if why := checkAcceptance(c); why != "" {
			add(fmt.Sprintf("acceptance[%d].value", i), provisioning.ReasonArgType, "%s", why)
		}
	}
	return problems
}

// renderSteps expands the steps' argument templates and fills their
// defaults (none: DefaultMetalSteps for a metal profile).
func renderSteps(doc Document, data map[string]any) ([]provisioning.Step, []Problem) {
	if len(doc.Steps) == 0 {
		if doc.Target == TargetMetal {
			return provisioning.DefaultMetalSteps(), nil
		}
		return []provisioning.Step{}, nil
	}
	var problems []Problem
	steps := specSteps(doc)
	for i := range steps {
		at := fmt.Sprintf("steps[%d].args", i)
		steps[i].Args = expandArgs(at, steps[i].Args, data, func(field string, err error) {
			problems = append(problems, Problem{Field: field, Reason: ReasonTemplate, Message: err.Error()})
		}).(map[string]any)
		steps[i] = provisioning.WithDefaults(steps[i])
	}
	if len(problems) > 0 {
		// Value checks of arguments that did not render would only repeat them.
		return steps, problems
	}
	return steps, provisioning.ValidateSteps(steps)
}

// specSteps are the document's steps as provisioning.Steps, arguments as
// written (copied, so expanding them leaves the document alone).
func specSteps(doc Document) []provisioning.Step {
	steps := make([]provisioning.Step, len(doc.Steps))
	for i, s := range doc.Steps {
		steps[i] = provisioning.Step{Name: s.Name, On: s.On, Action: s.Action, Await: s.Await, TimeoutSeconds: s.TimeoutSeconds}
		if s.Args != nil {
			steps[i].Args = copyValue(s.Args).(map[string]any)
		}
		if s.Retry != nil {
			steps[i].Retry = *s.Retry
		}
	}
	return steps
}

// expandArgs renders every string in v (maps and lists walked).
func expandArgs(field string, v any, data map[string]any, fail func(string, error)) any {
	switch x := v.(type) {
	case string:
		s, err := Expand(field, x, data)
		if err != nil {
			fail(field, err)
			return x
		}
		return s
	case map[string]any:
		if x == nil {
			return map[string]any(nil)
		}
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = expandArgs(field+"."+k, e, data, fail)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = expandArgs(fmt.Sprintf("%s[%d]", field, i), e, data, fail)
		}
		return out
	}
	return v
}

func copyValue(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = copyValue(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = copyValue(e)
		}
		return out
	}
	return v
}

// walkStrings calls fn on every string in v with its field path.
func walkStrings(field string, v any, fn func(field, text string)) {
	switch x := v.(type) {
	case string:
		fn(field, x)
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(x)) {
			walkStrings(field+"."+k, x[k], fn)
		}
	case []any:
		for i, e := range x {
			walkStrings(fmt.Sprintf("%s[%d]", field, i), e, fn)
		}
	}
}

// templated says whether the argument a problem names holds a template
// (somewhere in its value), so only a target can tell its value.
func templated(doc Document, field string) bool {
	var i int
	var name string
	if _, err := fmt.Sscanf(field, "steps[%d].args.%s", &i, &name); err != nil || i < 0 || i >= len(doc.Steps) {
		return false
	}
	name, _, _ = strings.Cut(name, ".")
	found := false
	walkStrings("", doc.Steps[i].Args[name], func(_, text string) { found = found || strings.Contains(text, "{{") })
	return found
}

// checkAcceptance checks a check's value for its kind.
func checkAcceptance(c provisioning.Check) string {
	if c.Kind == provisioning.CheckGPUModel {
		if s, ok := c.Value.(string); !ok || s == "" {
			return "gpuModel's value is a GPU model (a string)"
		}
		return ""
	}
	n, ok := c.Value.(float64)
	if !ok || n < 0 || n != float64(int64(n)) {
		return c.Kind + "'s value is a whole number, 0 or more"
	}
	return ""
}

func dedupe(ps []Problem) []Problem {
	var out []Problem
	for _, p := range ps {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}
