package images_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"

	"github.com/better-compute/better-compute/core"
	coreimages "github.com/better-compute/better-compute/core/images"
	"github.com/better-compute/better-compute/internal/sshsigtest"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/blobs"
	"github.com/better-compute/better-compute/store/images"
)

type fixture struct {
	t     *testing.T
	s     *store.Store
	blobs *blobs.Dir
	m     *images.Images
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	bs, err := blobs.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, s: testenv.Store(t), blobs: bs, m: images.New(bs, "root", images.AuthzType, 0)}
}

func (f *fixture) tx(fn func(tx store.Tx) error) error {
	return f.s.InTx(context.Background(), store.ReadWrite, fn)
}

func codeOf(err error) core.Code {
	var ce *core.Error
	if errors.As(err, &ce) {
		return ce.Code
	}
	return ""
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func (f *fixture) register(p images.RegisterRequest) (images.Registered, error) {
	var out images.Registered
	err := f.tx(func(tx store.Tx) (err error) {
		out, err = f.m.Register(context.Background(), tx, p)
		return err
	})
	return out, err
}

func request(tenant, name string, data []byte, sig string) images.RegisterRequest {
	return images.RegisterRequest{TenantID: tenant, Name: name, Version: "1.0", Format: coreimages.FormatRaw,
		SHA256: sum(data), SizeBytes: int64(len(data)), Signature: sig, By: "idn_alice"}
}

// upload does what the upload endpoint does with a token and a body.
func (f *fixture) upload(token string, body []byte) (coreimages.Image, error) {
	ctx := context.Background()
	var im coreimages.Image
	if err := f.s.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		im, err = f.m.Uploading(ctx, tx, token)
		return err
	}); err != nil {
		return coreimages.Image{}, err
	}
	if err := f.m.PutBytes(ctx, im, bytes.NewReader(body)); err != nil {
		return coreimages.Image{}, err
	}
	err := f.tx(func(tx store.Tx) (err error) {
		im, err = f.m.FinishUpload(ctx, tx, token)
		return err
	})
	return im, err
}

func (f *fixture) get(tenant, id string) (coreimages.Image, error) {
	var im coreimages.Image
	err := f.s.InTx(context.Background(), store.ReadOnly, func(tx store.Tx) (err error) {
		im, err = images.Get(context.Background(), tx, tenant, id)
		return err
	})
	return im, err
}

// authzAttrs is the image's authorization row's attributes and sharing.
func (f *fixture) authz(id string) store.AuthzResource {
	f.t.Helper()
	r, err := store.GetAuthzResource(context.Background(), f.s.Pool, images.AuthzType, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return r
}

func (f *fixture) addSigner(tenant string, k sshsigtest.Key) int {
	f.t.Helper()
	var n int
	if err := f.tx(func(tx store.Tx) (err error) {
		_, n, err = f.m.AddSigner(context.Background(), tx, tenant, k.AuthorizedKey)
		return err
	}); err != nil {
		f.t.Fatal(err)
	}
	return n
}

func TestRegisterUploadAndVerify(t *testing.T) {
	f := newFixture(t)
	alice := sshsigtest.NewKey(t, "alice@acme")
	f.addSigner("acme", alice)
	data := []byte("a raw disk image, signed by alice")
	reg, err := f.register(request("acme", "debian", data, alice.SignBytes(t, coreimages.SignatureNamespace, data)))
	if err != nil {
		t.Fatal(err)
	}
	if reg.Image.State != coreimages.StatePending || reg.Upload == nil || reg.Upload.Token == "" || reg.Upload.Path != images.UploadPath {
		t.Fatalf("register = %+v; want a pending image and an upload", reg)
	}
	if r := f.authz(reg.Image.ID); r.Attributes["visibility"] != coreimages.Private || r.Attributes["verified"] != false || len(r.SharedWith) != 0 {
		t.Fatalf("authorization row %+v", r)
	}

	// Tampered bytes: refused, nothing kept, the image stays pending and
	// the token still uploads.
	tampered := append([]byte{}, data...)
	tampered[0] ^= 1
	if _, err := f.upload(reg.Upload.Token, tampered); codeOf(err) != core.CodeInvalidInput {
		t.Fatalf("tampered upload: %v; want INVALID_INPUT", err)
	} else if ce := core.AsError(err); ce.Details["reason"] != "digestMismatch" {
		t.Fatalf("tampered upload details %v", ce.Details)
	}
	if _, err := f.blobs.Stat(context.Background(), blobs.Key{TenantID: "acme", SHA256: sum(tampered)}); !errors.Is(err, blobs.ErrNotFound) {
		t.Fatalf("the tampered bytes were kept: %v", err)
	}
	if im, err := f.get("acme", reg.Image.ID); err != nil || im.State != coreimages.StatePending {
		t.Fatalf("after the tampered upload: %+v, %v", im, err)
	}

	im, err := f.upload(reg.Upload.Token, data)
	if err != nil {
		t.Fatal(err)
	}
	fp := alice.Fingerprint(t)
	if im.State != coreimages.StateAvailable || !im.Verified || im.SignerFingerprint != fp || im.UploadedAt == nil {
		t.Fatalf("uploaded image %+v; want available, verified by %s", im, fp)
	}
	if r := f.authz(im.ID); r.Attributes["verified"] != true {
		t.Fatalf("authorization row %+v; want verified", r)
	}
	// The token is spent; an available image takes no second upload.
	if _, err := f.upload(reg.Upload.Token, data); codeOf(err) != core.CodeUnauthn {
		t.Fatalf("a second upload with the token: %v; want UNAUTHENTICATED", err)
	}
	again, err := f.register(request("acme", "debian", data, alice.SignBytes(t, coreimages.SignatureNamespace, data)))
	if err != nil || again.Image.ID != im.ID || again.Upload != nil {
		t.Fatalf("registering the same again: %+v, %v; want the image, no upload", again, err)
	}
	bob := sshsigtest.NewKey(t, "bob")
	if _, err := f.register(request("acme", "debian", data, bob.SignBytes(t, coreimages.SignatureNamespace, data))); codeOf(err) != core.CodeConflict {
		t.Fatalf("registering the name@version with another signature: %v; want CONFLICT", err)
	}
	other := append([]byte{}, data...)
	other = append(other, '!')
	if _, err := f.register(request("acme", "debian", other, "")); codeOf(err) != core.CodeConflict {
		t.Fatalf("registering the name@version with other bytes: %v; want CONFLICT", err)
	}

	// Removing the signer unverifies the image and its authorization row.
	var n int
	if err := f.tx(func(tx store.Tx) (err error) {
		n, err = f.m.RemoveSigner(context.Background(), tx, "acme", fp)
		return err
	}); err != nil || n != 1 {
		t.Fatalf("RemoveSigner = %d, %v; want 1 image", n, err)
	}
	if im, err := f.get("acme", im.ID); err != nil || im.Verified || im.SignerFingerprint != "" {
		t.Fatalf("after removing the signer: %+v, %v", im, err)
	}
	if r := f.authz(im.ID); r.Attributes["verified"] != false {
		t.Fatalf("authorization row %+v; want unverified", r)
	}
	// Adding it back (as the fleet's) verifies what it had signed.
	if n := f.addSigner("fleet", alice); n != 1 {
		t.Fatalf("AddSigner verified %d images; want 1", n)
	}
	if im, err := f.get("acme", im.ID); err != nil || !im.Verified || im.SignerFingerprint != fp {
		t.Fatalf("after adding the fleet signer: %+v, %v", im, err)
	}
}

func TestSignaturesOutsideTheAllowlistDoNotVerify(t *testing.T) {
	f := newFixture(t)
	known, unknown := sshsigtest.NewKey(t, "known"), sshsigtest.NewKey(t, "unknown")
	f.addSigner("fleet", known)
	data := []byte("bytes of an image")
	cases := []struct {
		name, sig string
		verified  bool
	}{
		{"no signature", "", false},
		{"an unknown key", unknown.SignBytes(t, coreimages.SignatureNamespace, data), false},
		{"another namespace", known.SignBytes(t, "file", data), false},
		{"other bytes", known.SignBytes(t, coreimages.SignatureNamespace, []byte("other bytes")), false},
		{"a fleet signer", known.SignBytes(t, coreimages.SignatureNamespace, data), true},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			reg, err := f.register(request("acme", fmt.Sprintf("img%d", i), data, c.sig))
			if err != nil {
				t.Fatal(err)
			}
			im := reg.Image
			if reg.Upload != nil {
				if im, err = f.upload(reg.Upload.Token, data); err != nil {
					t.Fatal(err)
				}
			}
			if im.State != coreimages.StateAvailable || im.Verified != c.verified {
				t.Fatalf("image %+v; want available, verified %v", im, c.verified)
			}
		})
	}
	if _, err := f.register(request("acme", "garbage", data, "not a signature")); codeOf(err) != core.CodeInvalidInput {
		t.Fatalf("a malformed signature: %v; want INVALID_INPUT", err)
	}
}

func TestRegisterWithBytesAlreadyStoredIsAvailableAtOnce(t *testing.T) {
	f := newFixture(t)
	data := []byte("shared bytes")
	first, err := f.register(request("acme", "a", data, ""))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.upload(first.Upload.Token, data); err != nil {
		t.Fatal(err)
	}
	second, err := f.register(request("acme", "b", data, ""))
	if err != nil {
		t.Fatal(err)
	}
	if second.Upload != nil || second.Image.State != coreimages.StateAvailable {
		t.Fatalf("second registration of stored bytes %+v; want available, no upload", second)
	}
	// Another tenant's bytes are not its own: it uploads.
	other, err := f.register(request("globex", "a", data, ""))
	if err != nil {
		t.Fatal(err)
	}
	if other.Upload == nil || other.Image.State != coreimages.StatePending {
		t.Fatalf("another tenant's registration %+v; want pending with an upload", other)
	}
	// The same request again answers the same image with a fresh token.
	again, err := f.register(request("globex", "a", data, ""))
	if err != nil || again.Image.ID != other.Image.ID || again.Upload == nil || again.Upload.Token == other.Upload.Token {
		t.Fatalf("registering again: %+v, %v", again, err)
	}
	// An idempotency key with another request is CONFLICT.
	p := request("globex", "c", data, "")
	p.IdempotencyKey = "k1"
	if _, err := f.register(p); err != nil {
		t.Fatal(err)
	}
	p.Description = "changed"
	if _, err := f.register(p); codeOf(err) != core.CodeConflict {
		t.Fatalf("the key with another request: %v; want CONFLICT", err)
	}
}

func TestPromoteAndCrossTenantVisibility(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	data := []byte("an image to share")
	reg, err := f.register(request("acme", "shared", data, ""))
	if err != nil {
		t.Fatal(err)
	}
	promote := func(tenant, id string) (coreimages.Image, error) {
		var im coreimages.Image
		err := f.tx(func(tx store.Tx) (err error) {
			im, err = f.m.Promote(ctx, tx, tenant, id)
			return err
		})
		return im, err
	}
	if _, err := promote("acme", reg.Image.ID); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("promoting a pending image: %v; want INVALID_STATE", err)
	}
	if _, err := f.upload(reg.Upload.Token, data); err != nil {
		t.Fatal(err)
	}
	// Private: another tenant reads NOT_FOUND, exactly like a missing image.
	_, private := f.get("globex", reg.Image.ID)
	missingID := core.NewID(images.IDPrefix)
	_, missing := f.get("globex", missingID)
	if codeOf(private) != core.CodeNotFound || codeOf(missing) != core.CodeNotFound ||
		private.Error() != images.NotFound(reg.Image.ID).Error() || missing.Error() != images.NotFound(missingID).Error() {
		t.Fatalf("another tenant's private image: %v; a missing one: %v", private, missing)
	}
	if _, err := promote("globex", reg.Image.ID); codeOf(err) != core.CodeNotFound {
		t.Fatalf("another tenant promotes a private image: %v; want NOT_FOUND", err)
	}
	im, err := promote("acme", reg.Image.ID)
	if err != nil || im.Visibility != coreimages.Public || im.PromotedAt == nil {
		t.Fatalf("promote = %+v, %v", im, err)
	}
	if r := f.authz(im.ID); r.Attributes["visibility"] != coreimages.Public || len(r.SharedWith) != 1 || r.SharedWith[0] != store.SharedWithAll {
		t.Fatalf("the public image's authorization row %+v", r)
	}
	if got, err := f.get("globex", im.ID); err != nil || got.ID != im.ID {
		t.Fatalf("another tenant reads the public image: %+v, %v", got, err)
	}
	if _, err := promote("acme", im.ID); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("promoting again: %v; want INVALID_STATE", err)
	}
	// Listing: globex sees the public image, not acme's private ones.
	priv, err := f.register(request("acme", "private", []byte("private bytes"), ""))
	if err != nil {
		t.Fatal(err)
	}
	for tenant, want := range map[string][]string{"globex": {im.ID}, "acme": {im.ID, priv.Image.ID}} {
		var got []string
		if err := f.s.InTx(ctx, store.ReadOnly, func(tx store.Tx) error {
			rows, err := images.List(ctx, tx, images.AuthzType, tenant, images.Filter{}, store.PageQuery{Limit: 10})
			for _, r := range rows {
				got = append(got, r.ID)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s lists %v; want %v", tenant, got, want)
		}
	}
}
