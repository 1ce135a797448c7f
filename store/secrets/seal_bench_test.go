package secrets

import (
	"strings"
	"testing"
)

// BenchmarkSealOpen seals and opens a BMC-password-sized value: a fresh data
// key, its wrap by a local KEK, the payload, then the reverse.
func BenchmarkSealOpen(b *testing.B) {
	kek, err := GenerateKEK()
	if err != nil {
		b.Fatal(err)
	}
	keys, err := ParseKeyring(kek)
	if err != nil {
		b.Fatal(err)
	}
	v := NewVault(keys, "root")
	value, ad := []byte(strings.Repeat("p", 32)), valueAD("acme", "bmc", 1)
	for b.Loop() {
		sealed, err := seal(keys.primary, value, ad)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := v.open(keys.PrimaryID(), sealed, ad); err != nil {
			b.Fatal(err)
		}
	}
}
