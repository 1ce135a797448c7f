package store_test

import (
	"encoding/json"
	"testing"

	"github.com/better-compute/better-compute/store"
)

func TestLSN(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want store.LSN
		out  string
	}{
		{"0/0", 0, "0/0"},
		{"16/B374D848", 0x16_B374D848, "16/B374D848"},
		{"16/b374d848", 0x16_B374D848, "16/B374D848"},
		{"FFFFFFFF/FFFFFFFF", ^store.LSN(0), "FFFFFFFF/FFFFFFFF"},
		{"0/0001", 1, "0/1"},
	} {
		got, err := store.ParseLSN(tc.in)
		if err != nil || got != tc.want || got.String() != tc.out {
			t.Fatalf("store.ParseLSN(%q) = %v (%s), %v", tc.in, uint64(got), got, err)
		}
	}
	for _, bad := range []string{"", "0", "/0", "0/", "1/2/3", "100000000/0", "0/100000000", "g/0", " 0/0", "-1/0", "0x1/0"} {
		if _, err := store.ParseLSN(bad); err == nil {
			t.Fatalf("store.ParseLSN(%q) succeeded", bad)
		}
	}
	// Numeric, not textual, order.
	a, _ := store.ParseLSN("9/FFFFFFFF")
	b, _ := store.ParseLSN("10/0")
	if !(a < b) || !("9/FFFFFFFF" > "10/0") {
		t.Fatal("LSN order")
	}
	var v struct{ L store.LSN }
	if err := json.Unmarshal([]byte(`{"L":"A/1F"}`), &v); err != nil || v.L != 0xA_0000001F {
		t.Fatalf("%v, %v", v.L, err)
	}
	if out, _ := json.Marshal(v); string(out) != `{"L":"A/1F"}` {
		t.Fatalf("%s", out)
	}
	if err := json.Unmarshal([]byte(`{"L":"nope"}`), &v); err == nil {
		t.Fatal("a bad LSN decoded")
	}
}
