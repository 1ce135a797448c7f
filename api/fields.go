package api

import (
	"encoding/json"

	"github.com/better-compute/better-compute/core"
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
