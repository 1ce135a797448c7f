// Package blobs is the content-addressed blob store images' bytes live in.
// A blob is named by its tenant and the SHA-256 of its bytes: the same
// bytes of two tenants are two blobs, so no tenant learns, by a register
// that needs no upload, that another holds them.
//
// Store is the seam: Dir keeps blobs in a directory (the dev stack's); an
// S3-compatible object store fits the same interface (an object per key,
// Put by a multipart upload committed only once the digest checks out,
// Open by ranged GETs).
package blobs

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"time"
)

// Key names a blob: a tenant and the lower-case hex SHA-256 of its bytes.
type Key struct {
	TenantID string
	SHA256   string
}

func (k Key) String() string { return k.TenantID + "/" + k.SHA256 }

// Errors of a Store.
var (
	// ErrNotFound: no blob has the key.
	ErrNotFound = errors.New("blobs: not found")
	// ErrDigestMismatch: the bytes Put read are not of the declared size
	// and SHA-256; nothing was kept.
	ErrDigestMismatch = errors.New("blobs: the bytes do not match the declared digest and size")
	// ErrInvalidKey: a key whose tenant or digest is malformed.
	ErrInvalidKey = errors.New("blobs: invalid key")
)

// Info is what a store knows of a blob.
type Info struct {
	Size    int64
	ModTime time.Time
}

// Object is an open blob, ready for http.ServeContent: seekable, with its
// size and modification time.
type Object interface {
	io.ReadSeekCloser
	Info() Info
}

// Store keeps blobs by key.
type Store interface {
	// Stat answers the blob's size and time, or ErrNotFound.
	Stat(ctx context.Context, key Key) (Info, error)
	// Open opens the blob for reading, or answers ErrNotFound.
	Open(ctx context.Context, key Key) (Object, error)
	// Put streams r into the blob of key, keeping it only when r holds
	// exactly size bytes whose SHA-256 is key.SHA256; otherwise it answers
	// ErrDigestMismatch and keeps nothing. Putting a blob that exists
	// replaces it with the same bytes.
	Put(ctx context.Context, key Key, size int64, r io.Reader) (Info, error)
	// Delete removes the blob; a missing one is not an error.
	Delete(ctx context.Context, key Key) error
}

var (
	sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)
	// A tenant id (iam's grammar) becomes a directory name: it has no
	// separator, and "." and ".." are refused.
	tenantRE = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)
)

func (k Key) check() error {
	if !sha256RE.MatchString(k.SHA256) || !tenantRE.MatchString(k.TenantID) || k.TenantID == "." || k.TenantID == ".." {
		return fmt.Errorf("%w: %q", ErrInvalidKey, k.String())
	}
	return nil
}

// Dir is a Store in a directory: <root>/tenants/<tenant>/<sha256[:2]>/<sha256>,
// written through a temporary file in <root>/tmp renamed into place once
// its digest checks out, so a reader never sees a partial blob.
type Dir struct {
	root string
}

// NewDir is the store in root, made (mode 0700) when missing.
func NewDir(root string) (*Dir, error) {
	if root == "" {
		return nil, errors.New("blobs: a blob directory is required")
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("blobs: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(abs, "tmp"), 0o700); err != nil {
		return nil, fmt.Errorf("blobs: %w", err)
	}
	return &Dir{root: abs}, nil
}

// Root is the store's directory.
func (d *Dir) Root() string { return d.root }

func (d *Dir) path(k Key) string {
	return filepath.Join(d.root, "tenants", k.TenantID, k.SHA256[:2], k.SHA256)
}

// Stat implements Store.
func (d *Dir) Stat(_ context.Context, k Key) (Info, error) {
	if err := k.check(); err != nil {
		return Info{}, err
	}
	fi, err := os.Stat(d.path(k))
	if errors.Is(err, fs.ErrNotExist) {
		return Info{}, ErrNotFound
	}
	if err != nil {
		return Info{}, fmt.Errorf("blobs: %w", err)
	}
	return Info{Size: fi.Size(), ModTime: fi.ModTime()}, nil
}

type file struct {
	*os.File
	info Info
}

func (f file) Info() Info { return f.info }

// Open implements Store.
func (d *Dir) Open(_ context.Context, k Key) (Object, error) {
	if err := k.check(); err != nil {
		return nil, err
	}
	f, err := os.Open(d.path(k))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("blobs: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("blobs: %w", err)
	}
	return file{File: f, info: Info{Size: fi.Size(), ModTime: fi.ModTime()}}, nil
}

// ctxReader stops a copy once its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// Put implements Store.
func (d *Dir) Put(ctx context.Context, k Key, size int64, r io.Reader) (info Info, err error) {
	if err := k.check(); err != nil {
		return Info{}, err
	}
	if size < 0 {
		return Info{}, fmt.Errorf("blobs: a negative size %d", size)
	}
	var name [12]byte
	_, _ = rand.Read(name[:])
	tmp, err := os.OpenFile(filepath.Join(d.root, "tmp", hex.EncodeToString(name[:])), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return Info{}, fmt.Errorf("blobs: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	// One byte past size tells a longer body from an exact one.
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(ctxReader{ctx, r}, size+1))
	if err != nil {
		return Info{}, fmt.Errorf("blobs: reading the bytes of %s: %w", k, err)
	}
	if n != size || hex.EncodeToString(h.Sum(nil)) != k.SHA256 {
		return Info{}, ErrDigestMismatch
	}
	if err := tmp.Sync(); err != nil {
		return Info{}, fmt.Errorf("blobs: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return Info{}, fmt.Errorf("blobs: %w", err)
	}
	dst := d.path(k)
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return Info{}, fmt.Errorf("blobs: %w", err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return Info{}, fmt.Errorf("blobs: %w", err)
	}
	committed = true
	return d.Stat(ctx, k)
}

// Delete implements Store.
func (d *Dir) Delete(_ context.Context, k Key) error {
	if err := k.check(); err != nil {
		return err
	}
	if err := os.Remove(d.path(k)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("blobs: %w", err)
	}
	return nil
}

var _ Store = (*Dir)(nil)
