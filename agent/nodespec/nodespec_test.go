package nodespec

import (
	"testing"
)

func TestApplyKeepsTheNewestGenerationAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil || s.Observed() != 0 {
		t.Fatalf("a fresh store: %v, %d", err, s.Observed())
	}
	spec := Spec{Labels: map[string]string{"zone": "a"}, Taints: []Taint{{Key: "gpu", Effect: "NoSchedule"}}, Cordoned: true}
	if g, err := s.Apply(3, spec); err != nil || g != 3 {
		t.Fatalf("apply 3 = %d, %v", g, err)
	}
	if g, err := s.Apply(2, Spec{}); err != nil || g != 3 {
		t.Fatalf("an older generation = %d, %v; want 3 kept", g, err)
	}
	again, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	g, got := again.Current()
	if g != 3 || got.Labels["zone"] != "a" || !got.Cordoned || len(got.Taints) != 1 {
		t.Fatalf("after a restart: %d %+v", g, got)
	}
}
