// Package secrets holds the rules of secret names and references that the
// API, the store and the agents' gateway share: a secret is named by
// secret://<tenant>/<name>, and only that reference is ever written into a
// row, an event, a log line or a workflow history.
package secrets

import (
	"regexp"
	"strings"

	"github.com/better-compute/better-compute/core"
)

// Scheme starts every secret reference.
const Scheme = "secret://"

// NamePattern is a secret's name: lower-case letters, digits, '.', '_' and
// '-', 1 to 64 characters, starting and ending with a letter or digit, so a
// name is safe in a URL path, a file name and a Kubernetes object name.
const NamePattern = `^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$`

// MaxNameLength is the longest name NamePattern admits.
const MaxNameLength = 64

// MaxValueLength bounds a secret's value, in characters (64 Ki); a BMC
// password, a TLS key or a kubeconfig fit, a disk image does not.
const MaxValueLength = 64 << 10

// tenantPattern is the grammar of tenant ids (the envelope's): no '/', so
// the first '/' after the scheme ends the tenant.
var (
	nameRE   = regexp.MustCompile(NamePattern)
	tenantRE = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)
)

// Scopes of a secret: a tenant's own, or the platform's (kept in the root
// tenant and decided on the fleet).
const (
	ScopeTenant = "tenant"
	ScopeFleet  = "fleet"
)

// ValidName reports whether name is a secret's name.
func ValidName(name string) bool { return nameRE.MatchString(name) }

// Ref is the reference of the secret name of tenantID.
func Ref(tenantID, name string) string { return Scheme + tenantID + "/" + name }

// ParseRef splits a reference into its tenant and name. Anything else than
// exactly secret://<tenant>/<name>, with a tenant id and a name of their
// grammars, is INVALID_INPUT.
func ParseRef(ref string) (tenantID, name string, err error) {
	rest, ok := strings.CutPrefix(ref, Scheme)
	if !ok {
		return "", "", invalidRef("it does not start with " + Scheme)
	}
	tenantID, name, ok = strings.Cut(rest, "/")
	switch {
	case !ok:
		return "", "", invalidRef("it has no /<name>")
	case !tenantRE.MatchString(tenantID):
		return "", "", invalidRef("its tenant is not a tenant id")
	case !ValidName(name):
		return "", "", invalidRef("its name does not match " + NamePattern)
	}
	return tenantID, name, nil
}

// invalidRef never echoes the reference: a caller may have pasted a value
// where a reference belongs.
func invalidRef(why string) error {
	return core.Errorf(core.CodeInvalidInput, "not a secret reference (secret://<tenant>/<name>): %s", why).
		WithDetails(map[string]any{"reason": "secretRef"})
}
