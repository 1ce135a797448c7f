package machines_test

import (
	"testing"

	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/drivers/machines"
)

func TestChooseBoot(t *testing.T) {
	order := []drivers.BootDevice{drivers.BootCD, drivers.BootDisk, drivers.BootPXE}
	cases := []struct {
		name     string
		ov       machines.Override
		order    []drivers.BootDevice
		cd       bool
		want     drivers.BootDevice
		consumed bool
	}{
		{"order, first entry", machines.Override{}, order, true, drivers.BootCD, false},
		{"order skips an empty CD", machines.Override{}, order, false, drivers.BootDisk, false},
		{"default order", machines.Override{}, nil, false, drivers.BootDisk, false},
		{"once override", machines.Override{Target: drivers.BootPXE}, order, true, drivers.BootPXE, true},
		{"persistent override", machines.Override{Target: drivers.BootPXE, Persistent: true}, order, true, drivers.BootPXE, false},
		{"override to an empty CD falls through", machines.Override{Target: drivers.BootCD}, []drivers.BootDevice{drivers.BootPXE}, false, drivers.BootPXE, true},
	}
	for _, c := range cases {
		got, consumed := machines.ChooseBoot(c.ov, c.order, c.cd)
		if got != c.want || consumed != c.consumed {
			t.Errorf("%s: got %s consumed=%v, want %s consumed=%v", c.name, got, consumed, c.want, c.consumed)
		}
	}
}

func TestRingKeepsTheTail(t *testing.T) {
	r := machines.NewRing(8)
	_, _ = r.Write([]byte("hello "))
	_, _ = r.Write([]byte("world"))
	if got := string(r.Bytes()); got != "lo world" {
		t.Fatalf("ring = %q", got)
	}
	if r.Written() != 11 {
		t.Fatalf("written = %d", r.Written())
	}
}
