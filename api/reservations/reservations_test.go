package reservations

import (
	"reflect"
	"slices"
	"testing"

	"github.com/better-compute/better-compute/core"
	states "github.com/better-compute/better-compute/core/reservations"
	"github.com/better-compute/better-compute/store/capacity"
)

// The schema's enum of states is core/reservations.States, written out
// because a struct tag cannot name a Go value.
func TestListStatesAreTheLifecycles(t *testing.T) {
	s, err := core.SchemaFor(reflect.TypeFor[ListInput]())
	if err != nil {
		t.Fatal(err)
	}
	f, _ := s.Field("state")
	var want []string
	for _, st := range states.States {
		want = append(want, string(st))
	}
	if !slices.Equal(f.Enum, want) {
		t.Fatalf("state enum = %v, want %v", f.Enum, want)
	}
}

// The schemas' bounds on start and duration are the capacity domain's.
func TestWindowBoundsAreTheCapacityDomains(t *testing.T) {
	for _, typ := range []reflect.Type{reflect.TypeFor[CreateInput](), reflect.TypeFor[ExtendInput]()} {
		s, err := core.SchemaFor(typ)
		if err != nil {
			t.Fatal(err)
		}
		doc := s.Document()["properties"].(map[string]any)
		if got := doc["duration"].(map[string]any)["maximum"]; got != float64(capacity.MaxPreviewDurationSeconds) {
			t.Errorf("%s: duration maximum %v, want %d", typ, got, capacity.MaxPreviewDurationSeconds)
		}
		if start, ok := doc["start"].(map[string]any); ok && start["maximum"] != float64(capacity.MaxPreviewStart) {
			t.Errorf("%s: start maximum %v, want %d", typ, start["maximum"], int64(capacity.MaxPreviewStart))
		}
	}
}
