package blobs_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/store/blobs"
)

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func newDir(t testing.TB) *blobs.Dir {
	t.Helper()
	d, err := blobs.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// files lists every regular file under root (what a failed put must not
// leave behind).
func files(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, e os.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			out = append(out, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestDirPutOpenStatDelete(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	body := []byte("a disk image, of sorts")
	k := blobs.Key{TenantID: "acme", SHA256: digest(body)}
	if _, err := d.Stat(ctx, k); !errors.Is(err, blobs.ErrNotFound) {
		t.Fatalf("Stat before Put: %v; want ErrNotFound", err)
	}
	info, err := d.Put(ctx, k, int64(len(body)), bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != int64(len(body)) {
		t.Fatalf("Put size %d; want %d", info.Size, len(body))
	}
	o, err := d.Open(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.Seek(2, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(o)
	if err != nil {
		t.Fatal(err)
	}
	_ = o.Close()
	if !bytes.Equal(rest, body[2:]) || o.Info().Size != int64(len(body)) {
		t.Fatalf("read %q (size %d); want %q", rest, o.Info().Size, body[2:])
	}
	// Another tenant does not have the same bytes.
	if _, err := d.Stat(ctx, blobs.Key{TenantID: "globex", SHA256: k.SHA256}); !errors.Is(err, blobs.ErrNotFound) {
		t.Fatalf("another tenant's Stat: %v; want ErrNotFound", err)
	}
	if err := d.Delete(ctx, k); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Open(ctx, k); !errors.Is(err, blobs.ErrNotFound) {
		t.Fatalf("Open after Delete: %v; want ErrNotFound", err)
	}
	if err := d.Delete(ctx, k); err != nil {
		t.Fatalf("deleting a missing blob: %v", err)
	}
}

func TestDirPutKeepsNothingOnMismatch(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	body := []byte("the signed bytes")
	k := blobs.Key{TenantID: "acme", SHA256: digest(body)}
	for name, c := range map[string]struct {
		size int64
		body []byte
	}{
		"other bytes":  {int64(len(body)), []byte("THE signed bytes")},
		"longer body":  {int64(len(body)), append(append([]byte{}, body...), 'x')},
		"shorter body": {int64(len(body)), body[:5]},
		"wrong size":   {int64(len(body)) - 1, body},
	} {
		if _, err := d.Put(ctx, k, c.size, bytes.NewReader(c.body)); !errors.Is(err, blobs.ErrDigestMismatch) {
			t.Errorf("%s: Put = %v; want ErrDigestMismatch", name, err)
		}
	}
	if left := files(t, d.Root()); len(left) != 0 {
		t.Fatalf("a refused put left %v", left)
	}
	if _, err := d.Stat(ctx, k); !errors.Is(err, blobs.ErrNotFound) {
		t.Fatalf("Stat after refused puts: %v", err)
	}
}

func TestDirRefusesKeysOutsideItsTree(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	sum := digest(nil)
	for _, k := range []blobs.Key{
		{TenantID: "..", SHA256: sum}, {TenantID: ".", SHA256: sum}, {TenantID: "a/b", SHA256: sum},
		{TenantID: "", SHA256: sum}, {TenantID: "acme", SHA256: strings.ToUpper(sum)}, {TenantID: "acme", SHA256: "../x"},
	} {
		if _, err := d.Put(ctx, k, 0, bytes.NewReader(nil)); !errors.Is(err, blobs.ErrInvalidKey) {
			t.Errorf("Put(%v) = %v; want ErrInvalidKey", k, err)
		}
		if _, err := d.Open(ctx, k); !errors.Is(err, blobs.ErrInvalidKey) {
			t.Errorf("Open(%v) = %v; want ErrInvalidKey", k, err)
		}
	}
}

// BenchmarkDirPut256MiB streams a 256 MiB body through Put (hash, write,
// fsync, rename) from memory.
func BenchmarkDirPut256MiB(b *testing.B) {
	const size = 256 << 20
	body := make([]byte, size)
	if _, err := rand.Read(body); err != nil {
		b.Fatal(err)
	}
	k := blobs.Key{TenantID: "acme", SHA256: digest(body)}
	d := newDir(b)
	b.SetBytes(size)
	for b.Loop() {
		if _, err := d.Put(context.Background(), k, size, bytes.NewReader(body)); err != nil {
			b.Fatal(err)
		}
	}
}
