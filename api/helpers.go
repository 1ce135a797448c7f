package api

import (
	"encoding/base32"
	"encoding/json"
	"errors"
	"time"

	"github.com/better-compute/better-compute/core"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// badField is INVALID_INPUT on field for reason: what a handler checks
// beyond its input's schema.
func badField(field, reason, format string, args ...any) error {
	return core.Errorf(core.CodeInvalidInput, format, args...).WithDetails(map[string]any{"field": field, "reason": reason})
}

// exactKeys refuses an object key at path (or in its sections) that keys
// does not name exactly. A value that is not an object is left to Decode.
func exactKeys(raw json.RawMessage, path string, keys map[string]map[string]bool) error {
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil {
		return nil
	}
	for k, v := range obj {
		if !keys[path][k] {
			return badField(path+"."+k, "unknown", "%s has no field %q", path, k)
		}
		if _, section := keys[path+"."+k]; section {
			if err := exactKeys(v, path+"."+k, keys); err != nil {
				return err
			}
		}
	}
	return nil
}

func msPtr(t *time.Time) *int64 {
	if t == nil {
		return nil
	}
	ms := t.UnixMilli()
	return &ms
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// collectStrings reads a one-column text result.
func collectStrings(rows pgx.Rows, err error) ([]string, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// tokenEncoding is lower-case base32 (RFC 4648 alphabet), no padding: the
// form of the secrets and name suffixes this package makes.
var tokenEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)
