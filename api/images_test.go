package api_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/agentgateway"
	imagesapi "github.com/better-compute/better-compute/api/images"
	"github.com/better-compute/better-compute/api/metal"
	"github.com/better-compute/better-compute/api/sites"
	"github.com/better-compute/better-compute/core"
	coreimages "github.com/better-compute/better-compute/core/images"
	"github.com/better-compute/better-compute/internal/sshsigtest"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/blobs"
	imagesdomain "github.com/better-compute/better-compute/store/images"
	"github.com/better-compute/better-compute/store/secrets"
)

// imagesEnv is the API with a blob directory and the agent gateway, whose
// site image endpoint serves the images the test allowed for a node.
type imagesEnv struct {
	*env
	blobs *blobs.Dir
	m     *imagesdomain.Images

	mu      sync.Mutex
	allowed map[[3]string]bool // site, node, image
}

func newImagesEnv(t testing.TB) *imagesEnv {
	t.Helper()
	e := newEnv(t)
	bs, err := blobs.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ie := &imagesEnv{env: e, blobs: bs, m: imagesdomain.New(bs, api.DefaultRootTenant, imagesdomain.AuthzType, 0),
		allowed: map[[3]string]bool{}}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	gw, err := agentgateway.New(agentgateway.Deps{Store: e.store, Catalog: e.catalog, Logger: quiet, Secrets: e.vault,
		TemporalAddress: "127.0.0.1:7233", TemporalNamespace: "better-compute", SiteLease: time.Minute,
		Blobs: bs, ImageForSite: ie.imageForSite})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Deps{Store: e.store, IAM: e.outer, Catalog: e.catalog, Routes: gw, Logger: quiet,
		Secrets: e.vault, Blobs: bs})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	e.server, e.url = srv, hs.URL
	return ie
}

// imageForSite is the test's check of which image a node's workflow
// writes: those allow named.
func (ie *imagesEnv) imageForSite(ctx context.Context, tx store.Tx, siteID, nodeID, imageID string) (coreimages.Image, error) {
	ie.mu.Lock()
	ok := ie.allowed[[3]string{siteID, nodeID, imageID}]
	ie.mu.Unlock()
	if !ok {
		return coreimages.Image{}, core.Errorf(core.CodeNotFound, "no workflow on %s writes %s", nodeID, imageID)
	}
	var tenant string
	if err := tx.QueryRow(ctx, `SELECT tenant_id FROM nodes WHERE id = $1`, nodeID).Scan(&tenant); err != nil {
		return coreimages.Image{}, err
	}
	return imagesdomain.Get(ctx, tx, tenant, imageID)
}

func (ie *imagesEnv) allow(siteID, nodeID, imageID string) {
	ie.mu.Lock()
	ie.allowed[[3]string{siteID, nodeID, imageID}] = true
	ie.mu.Unlock()
}

// addSigner puts a key on an allowlist as `better-compute image-signers
// add` does.
func (ie *imagesEnv) signer(tenant string, k sshsigtest.Key, add bool) {
	ie.t.Helper()
	ctx := context.Background()
	if err := ie.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		if add {
			_, _, err := ie.m.AddSigner(ctx, tx, tenant, k.AuthorizedKey)
			return err
		}
		_, err := ie.m.RemoveSigner(ctx, tx, tenant, k.AuthorizedKey)
		return err
	}); err != nil {
		ie.t.Fatal(err)
	}
}

func hexSum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// put uploads body with the token over real HTTP.
func (ie *imagesEnv) put(token string, body []byte) (int, string) {
	ie.t.Helper()
	req, err := http.NewRequest(http.MethodPut, ie.url+imagesapi.UploadPath, bytes.NewReader(body))
	if err != nil {
		ie.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		ie.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

func registerInput(tenant, name string, data []byte, sig string) imagesapi.RegisterInput {
	return imagesapi.RegisterInput{TenantID: tenant, Name: name, Version: "1.0", Format: coreimages.FormatRaw,
		SHA256: hexSum(data), SizeBytes: int64(len(data)), Signature: sig}
}

// registerAndUpload registers data and uploads it, answering the image.
func (ie *imagesEnv) registerAndUpload(token string, in imagesapi.RegisterInput, data []byte) coreimages.Image {
	ie.t.Helper()
	reg, err := imagesapi.Register.Call(context.Background(), ie.client(token), in)
	if err != nil {
		ie.t.Fatal(err)
	}
	if reg.Upload == nil {
		return reg.Image
	}
	status, body := ie.put(reg.Upload.Token, data)
	if status != 200 {
		ie.t.Fatalf("upload: %d %s", status, body)
	}
	var im coreimages.Image
	if err := json.Unmarshal([]byte(body), &im); err != nil {
		ie.t.Fatal(err)
	}
	return im
}

func TestImagesRegisterUploadVerifyOverHTTP(t *testing.T) {
	ie := newImagesEnv(t)
	ctx := context.Background()
	c := ie.client(ie.boot.UserToken)
	known, unknown := sshsigtest.NewKey(t, "release@acme"), sshsigtest.NewKey(t, "stranger")
	ie.signer("acme", known, true)
	data := []byte(strings.Repeat("a bootable raw disk ", 1000))

	reg, err := imagesapi.Register.Call(ctx, c, registerInput("acme", "debian", data, known.SignBytes(t, coreimages.SignatureNamespace, data)))
	if err != nil {
		t.Fatal(err)
	}
	if reg.Image.State != coreimages.StatePending || reg.Upload == nil || reg.Upload.Method != http.MethodPut {
		t.Fatalf("register: %+v", reg)
	}
	if got := ie.decidedOn("images.register", "acme"); got != "compute-tenant/acme" {
		t.Fatalf("register decided on %s", got)
	}
	// Tampered bytes (same size): 400 digestMismatch, nothing stored.
	tampered := bytes.Clone(data)
	tampered[len(tampered)/2] ^= 0x20
	status, body := ie.put(reg.Upload.Token, tampered)
	if status != 400 || !strings.Contains(body, `"INVALID_INPUT"`) || !strings.Contains(body, `"digestMismatch"`) {
		t.Fatalf("tampered upload: %d %s", status, body)
	}
	// A body of the wrong length is refused before it is read.
	if status, body := ie.put(reg.Upload.Token, data[:10]); status != 400 || !strings.Contains(body, "digestMismatch") {
		t.Fatalf("short upload: %d %s", status, body)
	}
	if n := countFiles(t, ie.blobs.Root()); n != 0 {
		t.Fatalf("refused uploads left %d files", n)
	}
	if im, err := imagesapi.Get.Call(ctx, c, imagesapi.ImageInput{TenantID: "acme", ImageID: reg.Image.ID}); err != nil || im.State != coreimages.StatePending {
		t.Fatalf("after refused uploads: %+v %v", im, err)
	}
	// No token, or a made-up one: UNAUTHENTICATED.
	if status, _ := ie.put("", data); status != 401 {
		t.Fatalf("upload without a token: %d", status)
	}
	if status, _ := ie.put(imagesdomain.UploadTokenPrefix+"nope", data); status != 401 {
		t.Fatalf("upload with an unknown token: %d", status)
	}
	status, body = ie.put(reg.Upload.Token, data)
	if status != 200 {
		t.Fatalf("upload: %d %s", status, body)
	}
	im, err := imagesapi.Get.Call(ctx, c, imagesapi.ImageInput{TenantID: "acme", ImageID: reg.Image.ID})
	if err != nil || im.State != coreimages.StateAvailable || !im.Verified || im.SignerFingerprint != known.Fingerprint(t) {
		t.Fatalf("uploaded image: %+v %v", im, err)
	}
	if status, _ := ie.put(reg.Upload.Token, data); status != 401 {
		t.Fatalf("a second upload with a spent token: %d", status)
	}

	// A key outside the allowlist: available, verified false.
	stranger := ie.registerAndUpload(ie.boot.UserToken,
		registerInput("acme", "unknown-signer", data, unknown.SignBytes(t, coreimages.SignatureNamespace, data)), data)
	if stranger.State != coreimages.StateAvailable || stranger.Verified {
		t.Fatalf("an unknown signer's image: %+v", stranger)
	}
	// Same bytes, so no upload was needed: the tenant's blob was there.
	verifiedTrue, verifiedFalse := true, false
	for want, filter := range map[string]*bool{im.ID: &verifiedTrue, stranger.ID: &verifiedFalse} {
		list, err := imagesapi.List.Call(ctx, c, imagesapi.ListInput{TenantID: "acme", Verified: filter})
		if err != nil || len(list.Items) != 1 || list.Items[0].ID != want {
			t.Fatalf("list verified=%v: %+v %v; want %s", *filter, list, err, want)
		}
	}
	// Removing the signer: verified false.
	ie.signer("acme", known, false)
	if im, err := imagesapi.Get.Call(ctx, c, imagesapi.ImageInput{TenantID: "acme", ImageID: im.ID}); err != nil || im.Verified {
		t.Fatalf("after removing the signer: %+v %v", im, err)
	}
	// A fleet image is decided on the fleet, and only in the root tenant.
	if _, err := imagesapi.Register.Call(ctx, c, imagesapi.RegisterInput{TenantID: "acme", Scope: "fleet", Name: "x", Version: "1",
		Format: "raw", SHA256: hexSum(data), SizeBytes: int64(len(data))}); codeOf(err) == "" {
		t.Fatal("a tenant registered a fleet image")
	}
	if _, err := imagesapi.Register.Call(ctx, ie.client(ie.boot.AdminToken), imagesapi.RegisterInput{TenantID: api.DefaultRootTenant,
		Scope: "fleet", Name: "fleet-debian", Version: "12", Format: "raw", SHA256: hexSum(data), SizeBytes: int64(len(data))}); err != nil {
		t.Fatal(err)
	}
	if got := ie.decidedOn("images.register", api.DefaultRootTenant); got != "compute-fleet/"+core.FleetID {
		t.Fatalf("a fleet register decided on %s", got)
	}
}

func countFiles(t *testing.T, root string) int {
	t.Helper()
	n := 0
	if err := filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestImagesPromoteAndCrossTenantVisibility(t *testing.T) {
	ie := newImagesEnv(t)
	ctx := context.Background()
	acme, globex := ie.client(ie.boot.UserToken), ie.client(ie.globex)
	data := []byte("an image acme will share")
	im := ie.registerAndUpload(ie.boot.UserToken, registerInput("acme", "shared", data, ""), data)
	private := ie.registerAndUpload(ie.boot.UserToken, registerInput("acme", "private", []byte("acme only"), ""), []byte("acme only"))

	// A private image of another tenant is NOT_FOUND exactly like a missing
	// one (the same answer, but for the id it names).
	missing := core.NewID(imagesdomain.IDPrefix)
	_, privateBody := ie.call(ie.globex, "images.get", fmt.Sprintf(`{"tenantId":"globex","imageId":%q}`, im.ID))
	status, missingBody := ie.call(ie.globex, "images.get", fmt.Sprintf(`{"tenantId":"globex","imageId":%q}`, missing))
	if status != 404 || strings.ReplaceAll(privateBody, im.ID, "ID") != strings.ReplaceAll(missingBody, missing, "ID") {
		t.Fatalf("another tenant's private image: %s; a missing one: %d %s", privateBody, status, missingBody)
	}
	if _, err := imagesapi.Promote.Call(ctx, globex, imagesapi.ImageInput{TenantID: "globex", ImageID: im.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex promotes acme's private image: %v", err)
	}
	promoted, err := imagesapi.Promote.Call(ctx, acme, imagesapi.ImageInput{TenantID: "acme", ImageID: im.ID})
	if err != nil || promoted.Visibility != coreimages.Public {
		t.Fatalf("promote: %+v %v", promoted, err)
	}
	if _, err := imagesapi.Promote.Call(ctx, acme, imagesapi.ImageInput{TenantID: "acme", ImageID: im.ID}); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("a second promote: %v; want INVALID_STATE", err)
	}
	got, err := imagesapi.Get.Call(ctx, globex, imagesapi.ImageInput{TenantID: "globex", ImageID: im.ID})
	if err != nil || got.ID != im.ID || got.TenantID != "acme" {
		t.Fatalf("globex reads the public image: %+v %v", got, err)
	}
	list, err := imagesapi.List.Call(ctx, globex, imagesapi.ListInput{TenantID: "globex"})
	if err != nil || len(list.Items) != 1 || list.Items[0].ID != im.ID {
		t.Fatalf("globex lists %+v %v; want only the public image", list, err)
	}
	list, err = imagesapi.List.Call(ctx, acme, imagesapi.ListInput{TenantID: "acme", Visibility: coreimages.Private})
	if err != nil || len(list.Items) != 1 || list.Items[0].ID != private.ID {
		t.Fatalf("acme lists its private images: %+v %v", list, err)
	}
	list, err = imagesapi.List.Call(ctx, acme, imagesapi.ListInput{TenantID: "acme", Name: "shared"})
	if err != nil || len(list.Items) != 1 || list.Items[0].ID != im.ID {
		t.Fatalf("acme lists by name: %+v %v", list, err)
	}
	if _, err := imagesapi.Get.Call(ctx, globex, imagesapi.ImageInput{TenantID: "globex", ImageID: private.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex reads acme's private image: %v", err)
	}
	// A public image is immutable: registering it again with other bytes
	// is CONFLICT, and no upload is offered.
	if _, err := imagesapi.Register.Call(ctx, acme, registerInput("acme", "shared", []byte("other bytes"), "")); codeOf(err) != core.CodeConflict {
		t.Fatalf("re-registering a public image with other bytes: %v", err)
	}
	if reg, err := imagesapi.Register.Call(ctx, acme, registerInput("acme", "shared", data, "")); err != nil || reg.Upload != nil {
		t.Fatalf("re-registering a public image: %+v %v", reg, err)
	}
}

func TestSiteImageEndpointServesRangesToTheSiteOnly(t *testing.T) {
	ie := newImagesEnv(t)
	ctx := context.Background()
	c := ie.client(ie.boot.UserToken)
	site := ie.site(ie.boot.UserToken, "acme", "fra-1", "custom")
	pool := ie.pool(ie.boot.UserToken, "acme", site.ID, "metal").ID
	tok, err := sites.CreateToken.Call(ctx, c, sites.CreateTokenInput{TenantID: "acme", SiteID: site.ID, Name: "agent"})
	if err != nil {
		t.Fatal(err)
	}
	if err := ie.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		_, err := ie.vault.Put(ctx, tx, secrets.PutRequest{TenantID: "acme", Name: "bmc", Scope: "tenant", Value: "pw", By: "idn_x"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	enroll := func(poolID, name string) string {
		n, err := metal.Enroll.Call(ctx, c, metal.EnrollInput{TenantID: "acme", PoolID: poolID, Name: name, BMC: metal.BMCInput{
			Redfish: &metal.RedfishInput{Address: "https://10.0.0.1", Username: "admin", PasswordSecret: "secret://acme/bmc"}}})
		if err != nil {
			t.Fatal(err)
		}
		return n.Node.ID
	}
	node := enroll(pool, "m1")
	otherSite := ie.site(ie.boot.UserToken, "acme", "fra-2", "custom")
	otherNode := enroll(ie.pool(ie.boot.UserToken, "acme", otherSite.ID, "metal-2").ID, "m2")

	data := make([]byte, 1<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	im := ie.registerAndUpload(ie.boot.UserToken, registerInput("acme", "disk", data, ""), data)
	notWritten := ie.registerAndUpload(ie.boot.UserToken, registerInput("acme", "other", []byte("x"), ""), []byte("x"))
	ie.allow(site.ID, node, im.ID)
	ie.allow(otherSite.ID, otherNode, im.ID)

	status, body, _ := postAgentH(t, ie.url, protocol.SiteRegisterPath, `{"token":"`+tok.Token+`","holder":"agent-a"}`)
	if status != 200 {
		t.Fatalf("register: %d %s", status, body)
	}
	var reg protocol.SiteResult
	if err := json.Unmarshal([]byte(body), &reg); err != nil {
		t.Fatal(err)
	}
	fetch := func(imageID, nodeID string, epoch int64, rangeHeader string) (int, []byte, http.Header) {
		req, _ := http.NewRequest(http.MethodGet, ie.url+protocol.SiteImagePathPrefix+imageID+"?node="+nodeID, nil)
		req.Header.Set(protocol.SiteTokenHeader, "Bearer "+tok.Token)
		req.Header.Set(protocol.SiteEpochHeader, fmt.Sprint(epoch))
		req.Header.Set("X-Request-Id", testRequestID)
		if rangeHeader != "" {
			req.Header.Set("Range", rangeHeader)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, raw, resp.Header
	}
	status, got, h := fetch(im.ID, node, reg.Lease.Epoch, "")
	if status != 200 || !bytes.Equal(got, data) || h.Get("Accept-Ranges") != "bytes" || h.Get("ETag") != `"sha256:`+im.SHA256+`"` {
		t.Fatalf("whole image: %d, %d bytes, %v", status, len(got), h)
	}
	status, got, h = fetch(im.ID, node, reg.Lease.Epoch, "bytes=1000-1999")
	if status != http.StatusPartialContent || !bytes.Equal(got, data[1000:2000]) ||
		h.Get("Content-Range") != fmt.Sprintf("bytes 1000-1999/%d", len(data)) {
		t.Fatalf("ranged GET: %d, %d bytes, %v", status, len(got), h)
	}
	// A resumed fetch: the rest from an offset.
	if status, got, _ = fetch(im.ID, node, reg.Lease.Epoch, fmt.Sprintf("bytes=%d-", len(data)-10)); status != 206 || !bytes.Equal(got, data[len(data)-10:]) {
		t.Fatalf("resumed GET: %d %d bytes", status, len(got))
	}
	// Everything the site may not fetch is the same 404.
	var bodies []string
	for _, c := range []struct{ image, node string }{
		{im.ID, otherNode},                        // a node of another site
		{im.ID, core.NewID("node")},               // a missing node
		{notWritten.ID, node},                     // an image no workflow on the node writes
		{core.NewID(imagesdomain.IDPrefix), node}, // a missing image
		{im.ID, ""},                               // no node
	} {
		status, got, _ := fetch(c.image, c.node, reg.Lease.Epoch, "")
		if status != 404 {
			t.Fatalf("fetch %s for %s: %d %s", c.image, c.node, status, got)
		}
		bodies = append(bodies, string(got))
	}
	for _, b := range bodies[1:] {
		if b != bodies[0] {
			t.Fatalf("404 answers differ: %q vs %q", b, bodies[0])
		}
	}
	// Only the lease holder fetches.
	if status, _, _ := fetch(im.ID, node, reg.Lease.Epoch+1, ""); status != 409 {
		t.Fatalf("a stale epoch: %d", status)
	}
}

// BenchmarkImageUpload256MiB uploads a 256 MiB image over real HTTP to the
// API's upload endpoint (register, then PUT: streamed into the blob
// directory while hashed, fsynced, renamed, and made available).
func BenchmarkImageUpload256MiB(b *testing.B) {
	const size = 256 << 20
	ie := newImagesEnv(b)
	data := make([]byte, size)
	if _, err := rand.Read(data); err != nil {
		b.Fatal(err)
	}
	sum := hexSum(data)
	c := ie.client(ie.boot.UserToken)
	b.SetBytes(size)
	i := 0
	for b.Loop() {
		i++
		reg, err := imagesapi.Register.Call(context.Background(), c, imagesapi.RegisterInput{TenantID: "acme",
			Name: "bench", Version: fmt.Sprintf("v%d", i), Format: "raw", SHA256: sum, SizeBytes: size})
		if err != nil || reg.Upload == nil {
			b.Fatalf("register: %+v %v", reg, err)
		}
		if status, body := ie.put(reg.Upload.Token, data); status != 200 {
			b.Fatalf("upload: %d %s", status, body)
		}
		// The next round uploads again.
		if err := ie.blobs.Delete(context.Background(), blobs.Key{TenantID: "acme", SHA256: sum}); err != nil {
			b.Fatal(err)
		}
	}
}
