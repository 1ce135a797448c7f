package reservations

import "testing"

// A handoff that finds the queue full returns at once and drops the id
// without keeping it pending, so this process's own scan may take it; an id
// already on its way is not queued twice.
func TestOweNeverBlocksAndDropsToTheScan(t *testing.T) {
	s := NewStarter(nil, nil, "q", nil, StarterOptions{Queue: 1})
	s.Owe("ten_a", "rsv_a")
	s.Owe("ten_a", "rsv_a") // a replay while the first is queued
	s.Owe("ten_a", "rsv_b") // the queue is full
	if n := len(s.owed); n != 1 {
		t.Fatalf("%d ids queued, want 1", n)
	}
	if s.claim("rsv_a") {
		t.Fatal("the queued id is not pending")
	}
	if !s.claim("rsv_b") {
		t.Fatal("the dropped id stayed pending: the scan would skip it")
	}
}
