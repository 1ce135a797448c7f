package store

import (
	"encoding/base64"
	"encoding/json"

	"github.com/better-compute/better-compute/core"
)

// Paging: every list reads its rows in one stable order, after a cursor
// that holds the sort key of the last row the previous page read. The key
// is the caller's own row's, so a cursor tells nothing of other tenants;
// it is opaque to callers (base64url of JSON) but not signed: a forged key
// only moves where the caller's own list resumes.

// Page limits.
const (
	// DefaultPageLimit is a page's size when the caller names none.
	DefaultPageLimit = 100
	// MaxPageLimit is the largest page a caller may ask for.
	MaxPageLimit = 500
)

// Key is the sort key of one listed row. Lists use the fields their order
// needs: (At, ID) for most, Seq for sequences. At is epoch milliseconds,
// the precision answers carry, and lists order by their timestamp cut to
// milliseconds (MsOf), so a key compares exactly with the row it came from.
type Key struct {
	At  int64  `json:"t,omitempty"`
	Seq int64  `json:"s,omitempty"`
	ID  string `json:"i,omitempty"`
}

// PageQuery is which page of a list to read.
type PageQuery struct {
	// Limit is the page's size, at most MaxPageLimit.
	Limit int
	// After is the last key the previous page read; nil on the first page.
	After *Key
}

// Fetch is how many rows a list reads: one more than the page, so the page
// knows whether another follows.
func (q PageQuery) Fetch() int { return q.Limit + 1 }

// First reports whether this is the first page (no cursor).
func (q PageQuery) First() bool { return q.After == nil }

// AfterKey is the cursor's key, the zero key on the first page.
func (q PageQuery) AfterKey() Key {
	if q.After == nil {
		return Key{}
	}
	return *q.After
}

// EncodeCursor is the opaque cursor of k.
func EncodeCursor(k Key) string {
	raw, err := json.Marshal(k)
	if err != nil {
		panic(err) // a struct of strings and integers always marshals
	}
	return base64.RawURLEncoding.EncodeToString(raw)
}

// DecodeCursor reads a cursor EncodeCursor wrote; anything else is
// INVALID_INPUT naming the field cursor.
func DecodeCursor(cursor string) (Key, error) {
	bad := func(err error) error {
		return core.Wrap(core.CodeInvalidInput, err, "cursor is not a cursor this list answered").
			WithDetails(map[string]any{"field": "cursor", "reason": "malformed"})
	}
	raw, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil {
		return Key{}, bad(err)
	}
	var k Key
	if err := json.Unmarshal(raw, &k); err != nil {
		return Key{}, bad(err)
	}
	if k == (Key{}) {
		return Key{}, bad(nil)
	}
	return k, nil
}

// MsOf is the SQL of a timestamp column cut to epoch milliseconds, as a
// bigint: lists order by it so their keys are the createdAt they answer.
func MsOf(col string) string {
	return "(floor(extract(epoch FROM " + col + ") * 1000)::bigint)"
}
