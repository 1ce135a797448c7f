package secrets_test

import (
	"bytes"
	"testing"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store/secrets"
)

// Sealed key material opens only for its purpose and associated data, and
// never without a key-encryption key.
func TestSealOpensOnlyForItsPurposeAndData(t *testing.T) {
	kek, err := secrets.GenerateKEK()
	if err != nil {
		t.Fatal(err)
	}
	keys, err := secrets.ParseKeyring(kek)
	if err != nil {
		t.Fatal(err)
	}
	v := secrets.NewVault(keys, "root")
	plain := []byte("thirty-two bytes of a CA's seed!")
	kekID, sealed, err := v.Seal("ssh-user-ca", plain, []byte("acme\x00sshca_1"))
	if err != nil || kekID != keys.PrimaryID() || bytes.Contains(sealed, plain) {
		t.Fatalf("seal = %s, %v", kekID, err)
	}
	if got, err := v.Open("ssh-user-ca", kekID, sealed, []byte("acme\x00sshca_1")); err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("open = %q, %v", got, err)
	}
	for _, tc := range []struct{ name, purpose, ad string }{
		{"another purpose", "other", "acme\x00sshca_1"},
		{"another tenant", "ssh-user-ca", "globex\x00sshca_1"},
		{"no purpose", "", "acme\x00sshca_1"},
	} {
		if _, err := v.Open(tc.purpose, kekID, sealed, []byte(tc.ad)); err == nil {
			t.Errorf("%s: opened", tc.name)
		}
	}
	none := secrets.NewVault(nil, "root")
	if _, _, err := none.Seal("ssh-user-ca", plain, nil); core.AsError(err).Code != core.CodeUnavailable {
		t.Fatalf("seal without a KEK = %v", err)
	}
	if _, err := none.Open("ssh-user-ca", kekID, sealed, []byte("acme\x00sshca_1")); core.AsError(err).Code != core.CodeUnavailable {
		t.Fatalf("open without a KEK = %v", err)
	}
}
