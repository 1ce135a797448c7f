// Package images holds the rules of images that the API, the store, the
// profiles and the agents share: an image is a signed, content-addressed
// artifact named name@version, in one of three formats, with the SHA-256
// of its bytes; it is private to its tenant or public (visible fleet-wide,
// once promoted, and then immutable), and verified once its signature
// checks out against a signer allowlist of its tenant or of the fleet.
package images

import "regexp"

// Formats of an image's bytes.
const (
	FormatRaw   = "raw"
	FormatQCOW2 = "qcow2"
	FormatISO   = "iso"
	// FormatBinary is a plain executable: a release's bcd build
	// (docs/rollouts.md).
	FormatBinary = "binary"
)

// Formats lists every format.
var Formats = []string{FormatRaw, FormatQCOW2, FormatISO, FormatBinary}

// Visibilities of an image (the IAM attribute visibility).
const (
	Private = "private"
	Public  = "public"
)

// States of an image: pending until its bytes are uploaded and match its
// digest, then available. An image is never deployable while pending.
const (
	StatePending   = "pending"
	StateAvailable = "available"
)

// NamePattern is an image's name (a DNS-label-like word with dots);
// VersionPattern its version (semver-like, or a date).
const (
	NamePattern    = `^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$`
	VersionPattern = `^[A-Za-z0-9]([A-Za-z0-9._+-]{0,62}[A-Za-z0-9])?$`
	// SHA256Pattern is a digest as the API takes it: 64 lower-case hex
	// characters.
	SHA256Pattern = `^[0-9a-f]{64}$`
)

var (
	nameRE    = regexp.MustCompile(NamePattern)
	versionRE = regexp.MustCompile(VersionPattern)
	sha256RE  = regexp.MustCompile(SHA256Pattern)
)

// ValidName, ValidVersion and ValidSHA256 check the three grammars.
func ValidName(s string) bool    { return nameRE.MatchString(s) }
func ValidVersion(s string) bool { return versionRE.MatchString(s) }
func ValidSHA256(s string) bool  { return sha256RE.MatchString(s) }

// SignatureNamespace is the SSH signature namespace images are signed in
// (`ssh-keygen -Y sign -n better-compute-image`): a signature made for
// another purpose (git commits, files) never verifies as an image's.
const SignatureNamespace = "better-compute-image"

// Image is an image as the domain reads it.
type Image struct {
	ID         string `json:"id"`
	TenantID   string `json:"tenantId"`
	Name       string `json:"name"`
	Version    string `json:"version"`
	Format     string `json:"format"`
	SHA256     string `json:"sha256"`
	SizeBytes  int64  `json:"sizeBytes"`
	Visibility string `json:"visibility"`
	State      string `json:"state"`
	// Verified: the signature checked out against an allowed signer
	// (SignerFingerprint names it).
	Verified          bool   `json:"verified"`
	SignerFingerprint string `json:"signerFingerprint,omitempty"`
	Description       string `json:"description,omitempty"`
	// CreatedAt, UploadedAt and PromotedAt are in epoch milliseconds.
	CreatedAt  int64  `json:"createdAt"`
	UploadedAt *int64 `json:"uploadedAt,omitempty"`
	PromotedAt *int64 `json:"promotedAt,omitempty"`
}

// Ref names an image in a profile: by id, or by name and version (the
// caller's own image, else a public one of that name and version).
type Ref struct {
	ID      string `json:"id,omitempty"`
	Name    string `json:"name,omitempty"`
	Version string `json:"version,omitempty"`
}

// Deployable says whether an image may be written to a machine: its bytes
// are there (and verified when verifiedOnly).
func (i Image) Deployable(verifiedOnly bool) bool {
	return i.State == StateAvailable && (!verifiedOnly || i.Verified)
}
