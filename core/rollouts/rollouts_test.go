package rollouts

import (
	"slices"
	"testing"
)

func TestPlan(t *testing.T) {
	for _, c := range []struct {
		name   string
		n      int
		canary int
		waves  []Wave
		want   []int
	}{
		{"canary then halves", 10, 1, []Wave{{Percent: 50}, {Percent: 50}}, []int{1, 5, 4}},
		{"no waves", 4, 0, nil, []int{4}},
		{"leftover joins the last", 10, 2, []Wave{{Count: 3}}, []int{2, 8}},
		{"canary past the selection", 2, 5, []Wave{{Percent: 100}}, []int{2}},
		{"empty", 0, 1, []Wave{{Percent: 100}}, nil},
		{"10000 nodes", 10000, 10, []Wave{{Percent: 1}, {Percent: 10}, {Percent: 25}, {Percent: 100}}, []int{10, 100, 1000, 2500, 6390}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Plan(c.n, c.canary, c.waves); !slices.Equal(got, c.want) {
				t.Fatalf("Plan(%d, %d, %v) = %v, want %v", c.n, c.canary, c.waves, got, c.want)
			}
		})
	}
}
