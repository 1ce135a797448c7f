package secrets

import "fmt"

// Sealing for key material a domain keeps in its own rows (an SSH user
// CA's private key): sealed exactly as a secret's value is (a fresh
// AES-256-GCM data key wrapped by the keyring's primary KEK), but with no
// secrets row and no secret:// name, so no method can resolve, replace or
// delete it. The associated data starts with the purpose, so such a
// ciphertext never opens as a secret's value, nor as another purpose's.

// Seal seals plaintext for purpose, bound to ad, and answers the id of the
// KEK that sealed it (kept with the ciphertext) and the ciphertext. Without
// a KEK it is UNAVAILABLE, as secrets.put is.
func (v *Vault) Seal(purpose string, plaintext, ad []byte) (kekID string, sealed []byte, err error) {
	keys, err := v.keyring()
	if err != nil {
		return "", nil, err
	}
	if purpose == "" {
		return "", nil, fmt.Errorf("secrets: sealing needs a purpose")
	}
	sealed, err = seal(keys.primary, plaintext, sealedAD(purpose, ad))
	return keys.primary.ID(), sealed, err
}

// Open opens what Seal sealed for purpose and ad with the KEK kekID.
func (v *Vault) Open(purpose, kekID string, sealed, ad []byte) ([]byte, error) {
	if purpose == "" {
		return nil, fmt.Errorf("secrets: opening needs a purpose")
	}
	return v.open(kekID, sealed, sealedAD(purpose, ad))
}

func sealedAD(purpose string, ad []byte) []byte {
	return append([]byte("better-compute sealed v1\x00"+purpose+"\x00"), ad...)
}
