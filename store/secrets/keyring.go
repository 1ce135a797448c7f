package secrets

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/tink-crypto/tink-go/v2/aead/subtle"
	"github.com/tink-crypto/tink-go/v2/tink"
)

// KEK is a key-encryption key: it wraps and unwraps the data keys that
// seal the values. A local key (LocalKEK) implements it, and so does an
// external KMS's AEAD (tink's registry.KMSClient hands one out as a
// tink.AEAD): give it an ID and it is a KEK.
type KEK interface {
	tink.AEAD
	// ID names the key. It is stored with every row the key sealed, so that
	// after a rotation a row opens with the key that sealed it; it must not
	// reveal the key.
	ID() string
}

// Keyring is the KEK new values are sealed with (the primary) and the older
// KEKs rows sealed before a rotation still open with.
type Keyring struct {
	primary KEK
	byID    map[string]KEK
}

// NewKeyring makes a keyring of primary and the older keys; two keys with
// one id are refused.
func NewKeyring(primary KEK, older ...KEK) (*Keyring, error) {
	if primary == nil {
		return nil, errors.New("secrets: a keyring needs a primary key-encryption key")
	}
	k := &Keyring{primary: primary, byID: map[string]KEK{}}
	for _, kek := range append([]KEK{primary}, older...) {
		if _, dup := k.byID[kek.ID()]; dup {
			return nil, fmt.Errorf("secrets: key-encryption key %s is given twice", kek.ID())
		}
		k.byID[kek.ID()] = kek
	}
	return k, nil
}

// PrimaryID is the id of the key new values are sealed with.
func (k *Keyring) PrimaryID() string { return k.primary.ID() }

// LocalKEKSize is a local KEK's length: AES-256.
const LocalKEKSize = 32

// localKEK is an AES-256-GCM key held in the process (tink's AES-GCM).
type localKEK struct {
	*subtle.AESGCM
	id string
}

func (k localKEK) ID() string { return k.id }

// LocalKEK is the KEK of 32 raw key bytes. Its id is "local-" and 16 hex
// digits of a SHA-256 over a label and the key: the same key always has the
// same id, and the id tells nothing of a 256-bit random key.
func LocalKEK(key []byte) (KEK, error) {
	if len(key) != LocalKEKSize {
		return nil, fmt.Errorf("secrets: a key-encryption key is %d bytes, not %d", LocalKEKSize, len(key))
	}
	a, err := subtle.NewAESGCM(key)
	if err != nil {
		return nil, fmt.Errorf("secrets: key-encryption key: %w", err)
	}
	sum := sha256.Sum256(append([]byte("better-compute secrets kek id\x00"), key...))
	return localKEK{AESGCM: a, id: "local-" + hex.EncodeToString(sum[:8])}, nil
}

// GenerateKEK is a new local KEK as ParseKeyring reads it: the standard
// base64 of 32 random bytes (what `openssl rand -base64 32` prints).
func GenerateKEK() (string, error) {
	key := make([]byte, LocalKEKSize)
	if _, err := rand.Read(key); err != nil {
		return "", fmt.Errorf("secrets: generating a key-encryption key: %w", err)
	}
	return base64.StdEncoding.EncodeToString(key), nil
}

// ParseKeyring reads local KEKs from text: base64 keys of 32 bytes each,
// separated by new lines, commas or spaces; lines starting with # are
// comments. The first key is the primary, the others are older keys kept to
// open what they sealed. Errors never quote the text.
func ParseKeyring(text string) (*Keyring, error) {
	var keys []KEK
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		for _, field := range strings.FieldsFunc(line, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\r' }) {
			raw, err := base64.StdEncoding.DecodeString(field)
			if err != nil {
				return nil, fmt.Errorf("secrets: key-encryption key %d is not standard base64", len(keys)+1)
			}
			kek, err := LocalKEK(raw)
			if err != nil {
				return nil, fmt.Errorf("secrets: key-encryption key %d: %w", len(keys)+1, err)
			}
			keys = append(keys, kek)
		}
	}
	if len(keys) == 0 {
		return nil, errors.New("secrets: no key-encryption key is given")
	}
	return NewKeyring(keys[0], keys[1:]...)
}

// EnvKEK is the environment variable a KEK may come from.
const EnvKEK = "BC_SECRETS_KEK"

// LoadKeyring reads the keyring from file when one is named, else from the
// environment variable EnvKEK; neither configured answers nil (the secrets
// are then unavailable, never stored in clear). A file that others may
// read is refused.
func LoadKeyring(file string, getenv func(string) string) (*Keyring, error) {
	if file != "" {
		info, err := os.Stat(file)
		if err != nil {
			return nil, fmt.Errorf("secrets: key-encryption key file: %w", err)
		}
		if info.Mode().Perm()&0o077 != 0 {
			return nil, fmt.Errorf("secrets: key-encryption key file %s is readable by others (mode %04o): chmod 600 it", file, info.Mode().Perm())
		}
		text, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("secrets: key-encryption key file: %w", err)
		}
		k, err := ParseKeyring(string(text))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		return k, nil
	}
	if text := getenv(EnvKEK); text != "" {
		k, err := ParseKeyring(text)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", EnvKEK, err)
		}
		return k, nil
	}
	return nil, nil
}

// EnsureKEKFile makes file with a new local KEK (mode 0600) unless it
// exists, for the dev stack.
func EnsureKEKFile(file string) error {
	if _, err := os.Stat(file); err == nil {
		return nil
	}
	kek, err := GenerateKEK()
	if err != nil {
		return err
	}
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("secrets: creating the key-encryption key file: %w", err)
	}
	_, werr := f.WriteString("# better-compute dev stack key-encryption key (base64, 32 bytes); the first line seals\n" + kek + "\n")
	if err := errors.Join(werr, f.Close()); err != nil {
		return fmt.Errorf("secrets: writing the key-encryption key file: %w", err)
	}
	return nil
}
