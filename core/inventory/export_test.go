package inventory

import (
	"encoding/json"
)

// CanonicalJSON renders a value as canonical JSON: object keys sorted, no
// insignificant white space, no HTML escaping, numbers as written.
func CanonicalJSON(v any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	tree, err := decodeTree(raw)
	if err != nil {
		return nil, err
	}
	return encodeTree(tree)
}
