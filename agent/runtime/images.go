package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/agent/protocol"
)

var sha256Pattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// imagePath is where the cache keeps an image: by its content's digest,
// so instances of one image share one download.
func (r *Runtime) imagePath(digest string) string {
	return filepath.Join(r.o.StateDir, "images", "sha256", digest)
}

func (r *Runtime) imageLock(digest string) *sync.Mutex {
	r.imageMu.Lock()
	defer r.imageMu.Unlock()
	m, ok := r.images[digest]
	if !ok {
		m = &sync.Mutex{}
		r.images[digest] = m
	}
	return m
}

// fetchImage answers the cached path of in's image, fetching it first when
// the cache lacks it: the bytes are hashed while written, and a digest or
// size other than the spec's fails the instance and keeps nothing.
func (r *Runtime) fetchImage(ctx context.Context, in nodespec.Instance) (string, error) {
	digest := strings.ToLower(strings.TrimPrefix(in.Image.SHA256, "sha256:"))
	if !sha256Pattern.MatchString(digest) {
		return "", fmt.Errorf("image %s: sha256 %q is not a hex SHA-256", in.Image.ID, in.Image.SHA256)
	}
	path := r.imagePath(digest)
	m := r.imageLock(digest)
	m.Lock()
	defer m.Unlock()
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	n, err := r.download(ctx, protocol.InstanceImagePath+in.ID, path, digest, in.Image.SizeBytes)
	if err != nil {
		return "", fmt.Errorf("image %s: %w", in.Image.ID, err)
	}
	r.log.Info("runtime: image fetched", "image", in.Image.ID, "sha256", digest, "bytes", n)
	return path, nil
}

// download GETs urlPath from the agent endpoint into path (mode 0400): the
// bytes are hashed while written to a temporary file, renamed only when
// the digest (and size, when above 0) are the ones asked for.
func (r *Runtime) download(ctx context.Context, urlPath, path, digest string, size int64) (int64, error) {
	if r.o.Client == nil || r.o.Endpoint == "" {
		return 0, errors.New("no agent endpoint")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(r.o.Endpoint, "/")+urlPath, nil)
	if err != nil {
		return 0, err
	}
	resp, err := r.o.Client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".fetch-*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), resp.Body)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != digest {
		return 0, fmt.Errorf("sha256 mismatch: got %s, want %s", got, digest)
	}
	if size > 0 && n != size {
		return 0, fmt.Errorf("%d bytes, want %d", n, size)
	}
	if err := os.Chmod(tmp.Name(), 0o400); err != nil {
		return 0, err
	}
	return n, os.Rename(tmp.Name(), path)
}

// fetchUserData answers in's user data (nil: none), fetched only when it
// is handed to the instance; it is never logged.
func (r *Runtime) fetchUserData(ctx context.Context, in nodespec.Instance) ([]byte, error) {
	if !in.UserData {
		return nil, nil
	}
	if r.o.Client == nil || r.o.Endpoint == "" {
		return nil, errors.New("user data: no agent endpoint")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(r.o.Endpoint, "/")+protocol.InstanceUserDataPath+in.ID, nil)
	if err != nil {
		return nil, err
	}
	resp, err := r.o.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("user data: %w", err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return nil, nil
	default:
		return nil, fmt.Errorf("user data: HTTP %d", resp.StatusCode)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20+1))
	if err != nil {
		return nil, fmt.Errorf("user data: %w", err)
	}
	if len(b) > 1<<20 {
		return nil, errors.New("user data: larger than 1 MiB")
	}
	return b, nil
}

// fetchEnv answers the instance's environment (protocol.InstanceEnvPath),
// its secrets resolved, as "NAME=value" in name order; nil when it has
// none.
func (r *Runtime) fetchEnv(ctx context.Context, in nodespec.Instance) ([]string, error) {
	if !in.Env {
		return nil, nil
	}
	if r.o.Client == nil || r.o.Endpoint == "" {
		return nil, errors.New("env: no agent endpoint")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(r.o.Endpoint, "/")+protocol.InstanceEnvPath+in.ID, nil)
	if err != nil {
		return nil, err
	}
	resp, err := r.o.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("env: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("env: HTTP %d", resp.StatusCode)
	}
	var env map[string]string
	if err := json.NewDecoder(io.LimitReader(resp.Body, 8<<20)).Decode(&env); err != nil {
		return nil, fmt.Errorf("env: %w", err)
	}
	out := make([]string, 0, len(env))
	for name, value := range env {
		if name == "" || strings.ContainsAny(name, "=\x00") || strings.ContainsRune(value, 0) {
			return nil, fmt.Errorf("env: %q is not a variable a process can hold", name)
		}
		out = append(out, name+"="+value)
	}
	sort.Strings(out)
	return out, nil
}
