package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	imagesapi "github.com/better-compute/better-compute/api/images"
	coreimages "github.com/better-compute/better-compute/core/images"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/internal/cli"
	"github.com/better-compute/better-compute/internal/controlplane"
	"github.com/better-compute/better-compute/internal/sshsigtest"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/blobs"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// run runs cmd with args, answering what it printed.
func run(t *testing.T, cmd interface {
	SetArgs([]string)
	SetOut(io.Writer)
	ExecuteContext(context.Context) error
}, args ...string) ([]byte, error) {
	t.Helper()
	var out bytes.Buffer
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	err := cmd.ExecuteContext(context.Background())
	return out.Bytes(), err
}

// `images push` against a real API: the file is hashed, registered and
// uploaded, and its signature verified once `image-signers add` allowed
// the key; `image-signers remove` unverifies it.
func TestImagesPushAndImageSigners(t *testing.T) {
	ctx := context.Background()
	dbURL := testenv.DatabaseURL(t)
	st, err := store.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	bs, err := blobs.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cp, err := controlplane.New(ctx, controlplane.Config{Store: st, Blobs: bs, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Close)
	boot, err := iam.Bootstrap(ctx, cp.Admin, iam.BootstrapOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(cp.API)
	t.Cleanup(hs.Close)

	dir := t.TempDir()
	file := filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(file, bytes.Repeat([]byte("disk "), 10000), 0o600); err != nil {
		t.Fatal(err)
	}
	key := sshsigtest.NewKey(t, "release")
	sig := filepath.Join(dir, "disk.raw.sig")
	if err := os.WriteFile(sig, []byte(key.Sign(t, coreimages.SignatureNamespace, file)), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{cli.EnvAPIURL: hs.URL, cli.EnvToken: boot.UserToken, cli.EnvTenant: boot.TenantID}
	o := cli.Options{ConfigPath: filepath.Join(dir, "config.yaml"), Getenv: func(k string) string { return env[k] }}

	if _, err := run(t, imageSignersCmd(), "add", "--database-url", dbURL, "--tenant", boot.TenantID, "--key", key.Private+".pub"); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, imagesPushCmd(o), "--file", file, "--name", "disk", "--version", "1", "--signature", sig)
	if err != nil {
		t.Fatal(err)
	}
	var im coreimages.Image
	if err := json.Unmarshal(out, &im); err != nil {
		t.Fatalf("push printed %q: %v", out, err)
	}
	if im.State != coreimages.StateAvailable || !im.Verified || im.SignerFingerprint != key.Fingerprint(t) || im.SizeBytes != 50000 {
		t.Fatalf("pushed image %+v", im)
	}
	// Pushing again answers the same image, with nothing to upload.
	out, err = run(t, imagesPushCmd(o), "--file", file, "--name", "disk", "--version", "1", "--signature", sig)
	var again coreimages.Image
	if err != nil || json.Unmarshal(out, &again) != nil || again.ID != im.ID {
		t.Fatalf("pushing again: %s %v", out, err)
	}
	if _, err := run(t, imageSignersCmd(), "remove", "--database-url", dbURL, "--tenant", boot.TenantID, "--key", key.Fingerprint(t)); err != nil {
		t.Fatal(err)
	}
	client, _, err := cli.Connect(o, "")
	if err != nil {
		t.Fatal(err)
	}
	got, err := imagesapi.Get.Call(ctx, client, imagesapi.ImageInput{TenantID: boot.TenantID, ImageID: im.ID})
	if err != nil || got.Verified {
		t.Fatalf("after image-signers remove: %+v %v", got, err)
	}
	out, err = run(t, imageSignersCmd(), "list", "--database-url", dbURL, "--tenant", boot.TenantID)
	if err != nil || string(bytes.TrimSpace(out)) != "[]" {
		t.Fatalf("list after remove: %s %v", out, err)
	}
}
