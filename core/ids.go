package core

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"regexp"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
)

// crockford is Crockford's base32 alphabet in lower case, as ids use it.
const crockford = "0123456789abcdefghjkmnpqrstvwxyz"

var idEncoding = base32.NewEncoding(crockford).WithPadding(base32.NoPadding)

// idBody matches a generated (26) or derived (52) id body.
var idBody = regexp.MustCompile(`^[0-9a-hjkmnp-tv-z]{26,52}$`)

// NewID returns prefix_<ULID>, the ULID in lower-case Crockford base32.
func NewID(prefix string) string {
	return prefix + "_" + strings.ToLower(ulid.MustNew(ulid.Timestamp(time.Now()), rand.Reader).String())
}

// DerivedID returns the id of a request-derived row: the prefix and the
// lower-case base32 of SHA-256 over the tenant, the caller's identity and the
// idempotency key, so a retry finds the same row.
func DerivedID(prefix, tenantID, identityID, idempotencyKey string) string {
	h := sha256.New()
	for _, part := range []string{tenantID, identityID, idempotencyKey} {
		h.Write([]byte(part))
		h.Write([]byte{0}) // separator: ("ab","c") and ("a","bc") differ
	}
	return prefix + "_" + idEncoding.EncodeToString(h.Sum(nil))
}

// ValidID reports whether id is prefix_ followed by a generated or derived body.
func ValidID(prefix, id string) bool {
	body, ok := strings.CutPrefix(id, prefix+"_")
	return ok && idBody.MatchString(body)
}
