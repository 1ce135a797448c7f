// Package profiles holds the rules of provisioning profiles: the profile
// document (a JSON Schema checks it, unknown fields refused), the
// templates its step arguments and host configuration hold, and its
// rendering for one target into the steps and context a provisioning
// workflow runs (core/provisioning). It reads no database: store/profiles
// resolves the image and the user data's secret and hands the facts in.
package profiles

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	validator "github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/message"

	"github.com/better-compute/better-compute/core/images"
	"github.com/better-compute/better-compute/core/provisioning"
)

// Targets of a profile.
const (
	TargetMetal = "metal"
	TargetVPS   = "vps"
)

// MaxDocumentBytes bounds a profile document as the API takes it.
const MaxDocumentBytes = 256 << 10

// Problem is one thing wrong with a profile (provisioning.Problem); its
// Field is a path in the document ("steps[2].args.device").
type Problem = provisioning.Problem

// Reasons of a document's problems beyond the schema's keywords and the
// steps' (provisioning.Reason*).
const (
	ReasonUnknown          = "unknown"
	ReasonTemplate         = "template"
	ReasonBinding          = "binding"
	ReasonBindingMismatch  = "bindingMismatch"
	ReasonTargetMismatch   = "targetMismatch"
	ReasonSecretRef        = "secretRef"
	ReasonNotFound         = "notFound"
	ReasonImageNotVerified = "imageNotVerified"
	ReasonImageNotAvail    = "imageNotAvailable"
)

// Document is a profile version's document.
type Document struct {
	Target string     `json:"target"`
	Image  images.Ref `json:"image"`
	// RequireVerifiedImage admits only an image whose signature checked out.
	RequireVerifiedImage bool `json:"requireVerifiedImage,omitempty"`
	// Bindings maps a BMC concern (power, boot, virtualMedia…) to the
	// driver a metal target must have bound for it.
	Bindings map[string]string `json:"bindings,omitempty"`
	// UserData is inline cloud-init user data, or a secret://<tenant>/<name>
	// reference to it. It is no template: cloud-init has templates of its
	// own ("## template: jinja") whose braces ours would take.
	UserData   string     `json:"userData,omitempty"`
	HostConfig HostConfig `json:"hostConfig,omitzero"`
	// Steps are the workflow's; none is provisioning.DefaultMetalSteps().
	Steps      []StepSpec           `json:"steps,omitempty"`
	Acceptance []provisioning.Check `json:"acceptance,omitempty"`
}

// HostConfig is the installed system's configuration. Hostname and the
// values of MetaData are templates.
type HostConfig struct {
	Hostname   string                   `json:"hostname,omitempty"`
	MetaData   map[string]string        `json:"metaData,omitempty"`
	RootDevice *provisioning.RootDevice `json:"rootDevice,omitempty"`
}

// StepSpec is a step as a profile writes it: its args' string values are
// templates; a timeout or retry left out is the action's default.
type StepSpec struct {
	Name           string              `json:"name"`
	On             provisioning.Runner `json:"on"`
	Action         string              `json:"action"`
	Args           map[string]any      `json:"args,omitempty"`
	Await          string              `json:"await,omitempty"`
	TimeoutSeconds int                 `json:"timeoutSeconds,omitempty"`
	Retry          *provisioning.Retry `json:"retry,omitempty"`
}

// UserDataIsSecret says whether the document's user data is a secret
// reference rather than inline text.
func (d Document) UserDataIsSecret() bool { return strings.HasPrefix(d.UserData, "secret://") }

//go:embed profile.schema.json
var schemaJSON []byte

// Schema is the profile document's JSON Schema (draft 2020-12).
func Schema() json.RawMessage { return slices.Clone(schemaJSON) }

// compiled is the schema compiled once; it is read-only after init.
var compiled = func() *validator.Schema {
	doc, err := validator.UnmarshalJSON(bytes.NewReader(schemaJSON))
	if err != nil {
		panic(fmt.Sprintf("profiles: the embedded schema: %v", err))
	}
	c := validator.NewCompiler()
	c.DefaultDraft(validator.Draft2020)
	if err := c.AddResource("profile.schema.json", doc); err != nil {
		panic(fmt.Sprintf("profiles: the embedded schema: %v", err))
	}
	s, err := c.Compile("profile.schema.json")
	if err != nil {
		panic(fmt.Sprintf("profiles: the embedded schema: %v", err))
	}
	return s
}()

// Parse checks a document against the schema and decodes it. Problems
// name every field the schema refuses; a document with problems decodes
// to nothing.
func Parse(raw []byte) (Document, []Problem) {
	if len(raw) > MaxDocumentBytes {
		return Document{}, []Problem{{Field: "", Reason: "maxBytes", Message: fmt.Sprintf("a profile document has at most %d bytes", MaxDocumentBytes)}}
	}
	v, err := validator.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return Document{}, []Problem{{Field: "", Reason: "type", Message: "the profile document is not valid JSON"}}
	}
	if err := compiled.Validate(v); err != nil {
		ve, ok := err.(*validator.ValidationError)
		if !ok {
			return Document{}, []Problem{{Field: "", Reason: "invalid", Message: err.Error()}}
		}
		var out []Problem
		collect(ve, &out)
		slices.SortStableFunc(out, func(a, b Problem) int { return strings.Compare(a.Field, b.Field) })
		return Document{}, slices.CompactFunc(out, func(a, b Problem) bool { return a == b })
	}
	var d Document
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return Document{}, []Problem{{Field: "", Reason: "type", Message: "the profile document does not decode: " + err.Error()}}
	}
	return d, nil
}

var printer = message.NewPrinter(message.MatchLanguage("en"))

// collect flattens the validator's error tree into problems.
func collect(e *validator.ValidationError, out *[]Problem) {
	if len(e.Causes) > 0 {
		for _, c := range e.Causes {
			collect(c, out)
		}
		return
	}
	at := e.InstanceLocation
	switch k := e.ErrorKind.(type) {
	case *kind.Required:
		for _, m := range k.Missing {
			f := fieldPath(append(slices.Clone(at), m))
			*out = append(*out, Problem{Field: f, Reason: provisioning.ReasonRequired, Message: f + " is required"})
		}
	case *kind.AdditionalProperties:
		for _, name := range k.Properties {
			f := fieldPath(append(slices.Clone(at), name))
			*out = append(*out, Problem{Field: f, Reason: ReasonUnknown, Message: f + " is not a field of a profile"})
		}
	default:
		f := fieldPath(at)
		name := f
		if name == "" {
			name = "the document"
		}
		*out = append(*out, Problem{Field: f, Reason: reasonOf(e.ErrorKind), Message: name + ": " + e.ErrorKind.LocalizedString(printer)})
	}
}

// fieldPath writes a JSON pointer's parts as the problems name fields:
// steps[2].args.device.
func fieldPath(parts []string) string {
	var b strings.Builder
	for _, p := range parts {
		if _, err := strconv.Atoi(p); err == nil {
			b.WriteString("[" + p + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(p)
	}
	return b.String()
}

func reasonOf(k validator.ErrorKind) string {
	switch k.(type) {
	case *kind.Type:
		return "type"
	case *kind.Enum, *kind.Const:
		return provisioning.ReasonEnum
	case *kind.Minimum, *kind.Maximum:
		return provisioning.ReasonRange
	}
	if p := k.KeywordPath(); len(p) > 0 {
		return p[len(p)-1]
	}
	return "invalid"
}
