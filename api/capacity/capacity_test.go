package capacity

import (
	"reflect"
	"testing"

	"github.com/better-compute/better-compute/core"
	domain "github.com/better-compute/better-compute/store/capacity"
)

// The schemas' bounds are the domain's constants, which tags cannot name.
func TestBoundsAreTheDomains(t *testing.T) {
	props := func(typ reflect.Type) map[string]any {
		s, err := core.SchemaFor(typ)
		if err != nil {
			t.Fatal(err)
		}
		return s.Document()["properties"].(map[string]any)
	}
	maxOf := func(p map[string]any, name string) any { return p[name].(map[string]any)["maximum"] }
	preview := props(reflect.TypeFor[PreviewInput]())
	if got := maxOf(preview, "duration"); got != float64(domain.MaxPreviewDurationSeconds) {
		t.Errorf("duration maximum %v, want %d", got, domain.MaxPreviewDurationSeconds)
	}
	if got := maxOf(preview, "start"); got != float64(domain.MaxPreviewStart) {
		t.Errorf("start maximum %v, want %d", got, int64(domain.MaxPreviewStart))
	}
	if got := maxOf(props(reflect.TypeFor[TimelineInput]()), "buckets"); got != float64(domain.MaxTimelineBuckets) {
		t.Errorf("buckets maximum %v, want %d", got, domain.MaxTimelineBuckets)
	}
}
