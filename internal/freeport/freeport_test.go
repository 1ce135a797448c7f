package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestPickNDistinctListenablePortsBelowEphemeralRange(t *testing.T) {
	ports, err := PickN("127.0.0.1", 8)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Fatalf("port %d returned twice in %v", p, ports)
		}
		seen[p] = true
		if p < Lowest || p >= ephemeralLow() {
			t.Errorf("port %d outside [%d, %d)", p, Lowest, ephemeralLow())
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Errorf("port %d: %v", p, err)
			continue
		}
		ln.Close()
	}
}
