package site

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/images"
	"github.com/better-compute/better-compute/workflows/metal"
)

// The image cache's layout under the boot dir. Blobs are named by the
// SHA-256 of their bytes; a download in progress is a part file named by
// the digest it should have; a qcow2 image's raw conversion is recorded
// by the qcow2's digest; a node may fetch the digests it staged (one empty
// file each), which survives an agent restart.
const (
	imagesDir      = "images"
	blobsDir       = "sha256"
	partsDir       = "partial"
	conversionsDir = "raw-of"
	nodesDir       = "nodes"
	// tokenFile in a boot's directory holds the SHA-256 of the boot's
	// token (never the token), its node and its expiry.
	tokenFile = "token.json"
)

// Staging's bounds: consecutive failed fetches without progress before the
// activity fails (Temporal retries it, and the part file is kept), the
// waits between them, and how long a fetch may receive nothing.
const (
	maxFetchFailures = 4
	fetchRetryWait   = 500 * time.Millisecond
	fetchStall       = time.Minute
)

// idPattern bounds an image or node id that names a file or a URL segment.
var idPattern = bootIDPattern

// imageCache is the site's content-addressed image cache.
type imageCache struct {
	dir string
	// qemuImg is qemu-img's path ("" looks it up on $PATH).
	qemuImg string

	mu    sync.Mutex
	locks map[string]*digestLock
}

type digestLock struct {
	mu    sync.Mutex
	users int
}

func newImageCache(bootDir, qemuImg string) *imageCache {
	return &imageCache{dir: filepath.Join(bootDir, imagesDir), qemuImg: qemuImg, locks: map[string]*digestLock{}}
}

func (c *imageCache) blob(sha string) string { return filepath.Join(c.dir, blobsDir, sha) }
func (c *imageCache) part(sha string) string { return filepath.Join(c.dir, partsDir, sha) }
func (c *imageCache) conversion(sha string) string {
	return filepath.Join(c.dir, conversionsDir, sha)
}
func (c *imageCache) staged(node, sha string) string {
	return filepath.Join(c.dir, nodesDir, node, sha)
}

// lock serialises the staging of one digest (two nodes deploying one
// image share its download).
func (c *imageCache) lock(sha string) func() {
	c.mu.Lock()
	l := c.locks[sha]
	if l == nil {
		l = &digestLock{}
		c.locks[sha] = l
	}
	l.users++
	c.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		c.mu.Lock()
		if l.users--; l.users == 0 {
			delete(c.locks, sha)
		}
		c.mu.Unlock()
	}
}

// allow lets node fetch the blob sha.
func (c *imageCache) allow(node, sha string) error {
	p := c.staged(node, sha)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	return f.Close()
}

// allowed says whether node staged sha and its blob is there.
func (c *imageCache) allowed(node, sha string) bool {
	if _, err := os.Stat(c.staged(node, sha)); err != nil {
		return false
	}
	st, err := os.Stat(c.blob(sha))
	return err == nil && st.Mode().IsRegular()
}

// staging is one staged image: the bytes the machine fetches.
type staging struct {
	sha    string
	size   int64
	cached bool
}

// conversionRecord is a qcow2 image's raw conversion.
type conversionRecord struct {
	SHA256    string `json:"sha256"`
	SizeBytes int64  `json:"sizeBytes"`
}

// fetchFunc GETs the image's bytes from offset from (a Range request when
// from > 0).
type fetchFunc func(ctx context.Context, from int64) (*http.Response, error)

// stage puts the image in the cache, once: a blob already there (its size
// checked) is answered cached.
func (c *imageCache) stage(ctx context.Context, r metal.StageImageRequest, fetch fetchFunc, done *atomic.Int64) (staging, error) {
	unlock := c.lock(r.SHA256)
	defer unlock()
	for _, d := range []string{blobsDir, partsDir, conversionsDir} {
		if err := os.MkdirAll(filepath.Join(c.dir, d), 0o700); err != nil {
			return staging{}, fmt.Errorf("site: the image cache: %w", err)
		}
	}
	if r.Format == images.FormatQCOW2 {
		if rec, ok := c.convertedBefore(r.SHA256); ok {
			return staging{sha: rec.SHA256, size: rec.SizeBytes, cached: true}, nil
		}
	} else if c.hasBlob(r.SHA256, r.SizeBytes) {
		return staging{sha: r.SHA256, size: r.SizeBytes, cached: true}, nil
	}
	// A qcow2 whose conversion did not finish is converted again, not
	// fetched again.
	if !c.hasBlob(r.SHA256, r.SizeBytes) {
		if err := c.download(ctx, r, fetch, done); err != nil {
			return staging{}, err
		}
	}
	if r.Format != images.FormatQCOW2 {
		return staging{sha: r.SHA256, size: r.SizeBytes}, nil
	}
	return c.convert(ctx, r, done)
}

// hasBlob says whether the blob sha is cached with the given size; one of
// another size is removed (it cannot be those bytes).
func (c *imageCache) hasBlob(sha string, size int64) bool {
	st, err := os.Stat(c.blob(sha))
	if err != nil {
		return false
	}
	if st.Mode().IsRegular() && st.Size() == size {
		return true
	}
	os.Remove(c.blob(sha))
	return false
}

func (c *imageCache) convertedBefore(sha string) (conversionRecord, bool) {
	var rec conversionRecord
	b, err := os.ReadFile(c.conversion(sha))
	if err != nil || json.Unmarshal(b, &rec) != nil || !images.ValidSHA256(rec.SHA256) {
		return rec, false
	}
	return rec, c.hasBlob(rec.SHA256, rec.SizeBytes)
}

// download fetches the image into its part file, resuming where a fetch
// before (this call's or an earlier attempt's) stopped, checks the size
// and the SHA-256, and renames the part file into the cache. A mismatch
// removes the part file.
func (c *imageCache) download(ctx context.Context, r metal.StageImageRequest, fetch fetchFunc, done *atomic.Int64) error {
	path := c.part(r.SHA256)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("site: the image's part file: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	hashed := int64(-1)
	failures := 0
	for {
		// What the part file holds is hashed again only when it is not
		// what this call wrote (an earlier attempt's, or a failed write).
		st, err := f.Stat()
		if err != nil {
			return fmt.Errorf("site: the image's part file: %w", err)
		}
		n := st.Size()
		if n > r.SizeBytes {
			n = 0
		}
		if n != hashed {
			if hashed, err = rehash(f, h, n); err != nil {
				return err
			}
		}
		done.Store(n)
		if n == r.SizeBytes {
			break
		}
		total, complete, err := c.fetchOnce(ctx, f, h, n, r, fetch)
		hashed = total
		done.Store(total)
		if err != nil {
			// The hash is rebuilt from the file: a failed write may have
			// reached the file and not the hash.
			hashed = -1
			var app *temporal.ApplicationError
			if errors.As(err, &app) || ctx.Err() != nil {
				return err
			}
			if total > n {
				failures = 0
			} else if failures++; failures >= maxFetchFailures {
				return fmt.Errorf("site: fetch image %s: %w", r.ImageID, err)
			}
			if !sleepCtx(ctx, fetchRetryWait) {
				return ctx.Err()
			}
			continue
		}
		if complete {
			break
		}
	}
	size := hashed
	sum := hex.EncodeToString(h.Sum(nil))
	if size != r.SizeBytes || sum != r.SHA256 {
		f.Close()
		os.Remove(path)
		return temporal.NewNonRetryableApplicationError(fmt.Sprintf(
			"image %s: the bytes fetched have SHA-256 %s (%d bytes), the image's is %s (%d bytes); nothing was kept",
			r.ImageID, sum, size, r.SHA256, r.SizeBytes), metal.ErrTypeDigestMismatch, nil)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("site: the image's part file: %w", err)
	}
	if err := os.Rename(path, c.blob(r.SHA256)); err != nil {
		return fmt.Errorf("site: the image cache: %w", err)
	}
	return nil
}

// rehash resets h to the first n bytes of f, truncating f there, and
// leaves f's offset at n.
func rehash(f *os.File, h hash.Hash, n int64) (int64, error) {
	h.Reset()
	if err := f.Truncate(n); err != nil {
		return 0, fmt.Errorf("site: the image's part file: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return 0, fmt.Errorf("site: the image's part file: %w", err)
	}
	if _, err := io.CopyN(h, f, n); err != nil {
		return 0, fmt.Errorf("site: read the image's part file: %w", err)
	}
	return n, nil
}

// fetchOnce is one GET from offset n, appending to f and h; total is
// what the part file holds after it. complete is the answer's body ending
// (it may still be short or long: the caller checks). An application
// error is final.
func (c *imageCache) fetchOnce(ctx context.Context, f *os.File, h hash.Hash, n int64, r metal.StageImageRequest,
	fetch fetchFunc) (total int64, complete bool, err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// A fetch that receives nothing for fetchStall (no answer, or no byte
	// of the body) is abandoned and resumed: the connection may be dead
	// without a reset.
	stall := time.AfterFunc(fetchStall, func() { cancel(errors.New("the fetch stalled")) })
	defer stall.Stop()
	resp, err := fetch(ctx, n)
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
			err = fmt.Errorf("%w: %w", err, cause)
		}
		return n, false, err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK:
		if n > 0 {
			// The server did not honour the range: start over.
			if _, err := rehash(f, h, 0); err != nil {
				return 0, false, err
			}
			n = 0
		}
	case resp.StatusCode == http.StatusPartialContent:
		if start, ok := rangeStart(resp.Header.Get("Content-Range")); !ok || start != n {
			return n, false, fmt.Errorf("the answer's range %q does not start at byte %d", resp.Header.Get("Content-Range"), n)
		}
	case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable:
		// The part file is longer than the image: start over.
		if _, err := rehash(f, h, 0); err != nil {
			return 0, false, err
		}
		return 0, false, errors.New("the server's image is shorter than the part file")
	default:
		return n, false, imageAPIError(r.ImageID, resp)
	}
	if _, err := f.Seek(n, io.SeekStart); err != nil {
		return n, false, fmt.Errorf("site: the image's part file: %w", err)
	}
	stall.Reset(fetchStall)
	body := &progressReader{r: resp.Body, onRead: func() { stall.Reset(fetchStall) }}
	// One byte past the image's size shows an image that is too long.
	got, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(body, r.SizeBytes-n+1))
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
			err = fmt.Errorf("%w: %w", err, cause)
		}
		return n + got, false, err
	}
	return n + got, true, nil
}

type progressReader struct {
	r      io.Reader
	onRead func()
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.onRead()
	}
	return n, err
}

// rangeStart is the first byte of a Content-Range "bytes a-b/n".
func rangeStart(cr string) (int64, bool) {
	rest, ok := strings.CutPrefix(cr, "bytes ")
	if !ok {
		return 0, false
	}
	a, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(a, 10, 64)
	return v, err == nil
}

// imageAPIError is the API's refusal of an image fetch, as the other site
// calls map theirs.
func imageAPIError(imageID string, resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	var e struct {
		Error *core.Error `json:"error"`
	}
	if json.Unmarshal(raw, &e) == nil && e.Error != nil {
		return apiError("fetch image "+imageID, e.Error)
	}
	return fmt.Errorf("site: fetch image %s: HTTP %d", imageID, resp.StatusCode)
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// qemuImgInfo is what `qemu-img info --output=json` says of a qcow2 that
// matters here: files it would read besides the image.
type qemuImgInfo struct {
	BackingFilename string `json:"backing-filename"`
	FormatSpecific  struct {
		Data struct {
			DataFile string `json:"data-file"`
		} `json:"data"`
	} `json:"format-specific"`
}

// qemuImgPath is qemu-img's path, or an Unsupported error.
func (c *imageCache) qemuImgPath() (string, error) {
	name := c.qemuImg
	if name == "" {
		name = "qemu-img"
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", temporal.NewNonRetryableApplicationError(
			"this site cannot convert qcow2 images: qemu-img is not installed (Debian package qemu-utils)", metal.ErrTypeUnsupported, nil)
	}
	return p, nil
}

// convert writes the cached qcow2 image r as raw into the cache, records
// the raw bytes' digest and size, and drops the qcow2. An image that
// would make qemu-img read another file (a backing file, an external
// data file) is refused: its bytes are not all in the signed image.
func (c *imageCache) convert(ctx context.Context, r metal.StageImageRequest, done *atomic.Int64) (staging, error) {
	qemuImg, err := c.qemuImgPath()
	if err != nil {
		return staging{}, err
	}
	src := c.blob(r.SHA256)
	refuse := func(msg string) (staging, error) {
		os.Remove(src)
		return staging{}, temporal.NewNonRetryableApplicationError(fmt.Sprintf("image %s: %s", r.ImageID, msg),
			string(core.CodeInvalidInput), nil)
	}
	out, err := exec.CommandContext(ctx, qemuImg, "info", "--output=json", "-f", "qcow2", src).Output()
	if err != nil {
		if ctx.Err() != nil {
			return staging{}, ctx.Err()
		}
		return refuse("qemu-img cannot read it as qcow2: " + commandError(err))
	}
	var info qemuImgInfo
	if err := json.Unmarshal(out, &info); err != nil {
		return refuse("qemu-img's description of it is unreadable")
	}
	if info.BackingFilename != "" || info.FormatSpecific.Data.DataFile != "" {
		return refuse("it is a qcow2 with a backing file or an external data file; the site converts self-contained images only")
	}
	tmp := c.part(r.SHA256) + ".raw"
	defer os.Remove(tmp)
	if _, err := exec.CommandContext(ctx, qemuImg, "convert", "-f", "qcow2", "-O", "raw", src, tmp).Output(); err != nil {
		if ctx.Err() != nil {
			return staging{}, ctx.Err()
		}
		return refuse("qemu-img convert failed: " + commandError(err))
	}
	f, err := os.Open(tmp)
	if err != nil {
		return staging{}, fmt.Errorf("site: the converted image: %w", err)
	}
	h := sha256.New()
	size, err := io.Copy(h, &countingReader{r: f, n: done})
	f.Close()
	if err != nil {
		return staging{}, fmt.Errorf("site: read the converted image: %w", err)
	}
	rec := conversionRecord{SHA256: hex.EncodeToString(h.Sum(nil)), SizeBytes: size}
	if err := os.Rename(tmp, c.blob(rec.SHA256)); err != nil {
		return staging{}, fmt.Errorf("site: the image cache: %w", err)
	}
	b, _ := json.Marshal(rec)
	if err := writeFileAtomic(c.conversion(r.SHA256), b); err != nil {
		return staging{}, fmt.Errorf("site: the image cache: %w", err)
	}
	if rec.SHA256 != r.SHA256 {
		os.Remove(src)
	}
	return staging{sha: rec.SHA256, size: rec.SizeBytes}, nil
}

type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n.Add(int64(n))
	return n, err
}

func commandError(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(bytes.TrimSpace(ee.Stderr)) > 0 {
		return strings.TrimSpace(string(ee.Stderr))
	}
	return err.Error()
}

func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// StageImage fetches the image from the control plane into the site's
// cache (resumed, checked) and lets the node's open boots fetch it from
// the boot server.
func (s *metalActivities) StageImage(ctx context.Context, r metal.StageImageRequest) (metal.StageImageResult, error) {
	var out metal.StageImageResult
	if err := validStageRequest(r); err != nil {
		return out, err
	}
	ctx, done, err := s.enter(ctx, r.Machine)
	if err != nil {
		return out, err
	}
	defer done()
	if s.boot == nil {
		return out, temporal.NewNonRetryableApplicationError(
			"this site agent runs no boot server to serve images from (bcd site --boot-listen)", metal.ErrTypeUnsupported, nil)
	}
	if r.Format == images.FormatQCOW2 {
		// Before fetching gigabytes it could not convert.
		if _, err := s.boot.cache.qemuImgPath(); err != nil {
			return out, err
		}
	}
	var progress atomic.Int64
	if activity.IsActivity(ctx) {
		go heartbeatProgress(ctx, &progress)
	}
	started := time.Now()
	st, err := s.boot.cache.stage(ctx, r, s.t.imageFetch(r.ImageID, r.Machine.NodeID), &progress)
	if s.t.ctx.Err() != nil {
		return out, leaseLost()
	}
	if err != nil {
		return out, err
	}
	if err := s.boot.cache.allow(r.Machine.NodeID, st.sha); err != nil {
		return out, fmt.Errorf("site: serve the image: %w", err)
	}
	s.t.a.log.Info("staged an image", "image", r.ImageID, "node", r.Machine.NodeID, "sha256", st.sha,
		"bytes", st.size, "cached", st.cached, "took", time.Since(started).String())
	return metal.StageImageResult{URL: s.boot.imageURL(r.Machine.NodeID, st.sha), SHA256: st.sha, SizeBytes: st.size,
		Cached: st.cached}, nil
}

func validStageRequest(r metal.StageImageRequest) error {
	bad := func(msg string) error {
		return temporal.NewNonRetryableApplicationError(msg, string(core.CodeInvalidInput), nil)
	}
	switch {
	case !idPattern.MatchString(r.ImageID):
		return bad(fmt.Sprintf("image id %q is not usable", r.ImageID))
	case !idPattern.MatchString(r.Machine.NodeID):
		return bad(fmt.Sprintf("node id %q is not usable", r.Machine.NodeID))
	case !images.ValidSHA256(r.SHA256):
		return bad("the image's sha256 is not 64 lower-case hex characters")
	case r.SizeBytes <= 0:
		return bad("the image's size must be positive")
	}
	switch r.Format {
	case images.FormatRaw, images.FormatISO, images.FormatQCOW2:
		return nil
	}
	return temporal.NewNonRetryableApplicationError(fmt.Sprintf("the site cannot stage an image of format %q", r.Format),
		metal.ErrTypeUnsupported, nil)
}

// heartbeatProgress heartbeats the bytes staged so far.
func heartbeatProgress(ctx context.Context, done *atomic.Int64) {
	tk := time.NewTicker(heartbeatEvery)
	defer tk.Stop()
	for {
		activity.RecordHeartbeat(ctx, done.Load())
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
	}
}

// imageFetch GETs an image's bytes from the API as the site's endpoints
// authenticate: the site token and this term's epoch.
func (t *term) imageFetch(imageID, nodeID string) fetchFunc {
	// The client's overall timeout would cut a large image; the activity's
	// context and the stall check bound the fetch instead.
	c := *t.a.o.HTTPClient
	c.Timeout = 0
	u := strings.TrimRight(t.a.o.APIURL, "/") + protocol.SiteImagePathPrefix + url.PathEscape(imageID) +
		"?node=" + url.QueryEscape(nodeID)
	return func(ctx context.Context, from int64) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set(protocol.SiteTokenHeader, "Bearer "+t.a.o.Token)
		req.Header.Set(protocol.SiteEpochHeader, strconv.FormatInt(t.epoch, 10))
		if from > 0 {
			req.Header.Set("Range", fmt.Sprintf("bytes=%d-", from))
		}
		resp, err := c.Do(req)
		if err != nil {
			// The URL error repeats no header: the token is not in it.
			return nil, err
		}
		return resp, nil
	}
}

// tokenRecord is what the boot server keeps of a boot's token.
type tokenRecord struct {
	NodeID string `json:"nodeId"`
	// TokenSHA256 is the hex SHA-256 of the token.
	TokenSHA256 string `json:"tokenSha256"`
	// ExpiresAt is the token's expiry in Unix milliseconds (0: not said).
	ExpiresAt int64 `json:"expiresAt,omitempty"`
}

func tokenSum(token string) string {
	s := sha256.Sum256([]byte(token))
	return hex.EncodeToString(s[:])
}

// writeTokenRecord keeps the SHA-256 of the boot's token in its directory,
// so that the node's ramdisk can fetch its staged images with it, also
// from an agent restarted since.
func writeTokenRecord(dir string, spec bootSpec) error {
	rec := tokenRecord{NodeID: spec.nodeID, TokenSHA256: tokenSum(spec.cfg.Token)}
	if !spec.expires.IsZero() {
		rec.ExpiresAt = spec.expires.UnixMilli()
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, tokenFile), b)
}

// bootOf says whether token is the token of an open boot of node that
// this site minted.
func (bs *bootServer) bootOf(node, token string) bool {
	if token == "" {
		return false
	}
	want, _ := hex.DecodeString(tokenSum(token))
	entries, err := os.ReadDir(bs.dir)
	if err != nil {
		return false
	}
	now := time.Now().UnixMilli()
	for _, e := range entries {
		if !e.IsDir() || e.Name() == imagesDir || !bootIDPattern.MatchString(e.Name()) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(bs.dir, e.Name(), tokenFile))
		if err != nil {
			continue
		}
		var rec tokenRecord
		if json.Unmarshal(b, &rec) != nil || rec.NodeID != node || (rec.ExpiresAt != 0 && now >= rec.ExpiresAt) {
			continue
		}
		got, err := hex.DecodeString(rec.TokenSHA256)
		if err == nil && subtle.ConstantTimeCompare(got, want) == 1 {
			return true
		}
	}
	return false
}

func (bs *bootServer) imageURL(node, sha string) string {
	base := bs.machineURL
	if base == "" {
		base = bs.url
	}
	return base + "/images/" + node + "/" + sha
}

// serveImage serves a staged image to the node's ramdisk: the bearer must
// be the token of an open boot of that node, and the node must have
// staged that digest. Every refusal is the same 404, so nothing tells a
// wrong token from an unknown node or digest.
func (bs *bootServer) serveImage(w http.ResponseWriter, r *http.Request) {
	node, sha := r.PathValue("node"), r.PathValue("sha")
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		token = ""
	}
	if bs.serving() == nil || !idPattern.MatchString(node) || !images.ValidSHA256(sha) || !bs.bootOf(node, token) ||
		!bs.cache.allowed(node, sha) {
		http.NotFound(w, r)
		return
	}
	serveFile(w, r, bs.cache.blob(sha), "application/octet-stream")
}
