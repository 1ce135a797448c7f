package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	imagesapi "github.com/better-compute/better-compute/api/images"
	"github.com/better-compute/better-compute/core"
	coreimages "github.com/better-compute/better-compute/core/images"
	"github.com/better-compute/better-compute/internal/cli"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/images"
)

// addImagesPush adds `images push` to the images group the registry's
// commands made (cli.Attach): hash a file, register it, upload it when
// asked.
func addImagesPush(root *cobra.Command, o cli.Options) {
	for _, g := range root.Commands() {
		if g.Name() == "images" {
			g.AddCommand(imagesPushCmd(o))
		}
	}
}

func imagesPushCmd(o cli.Options) *cobra.Command {
	var file, name, version, format, sigFile, description, contextName, tenant string
	var fleet bool
	cmd := &cobra.Command{
		Use:   "push --file F --name N --version V [--format raw] [--signature F.sig] [--fleet]",
		Short: "Register an image's bytes (hashed here) and upload them when the API asks",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			client, conn, err := cli.Connect(o, contextName)
			if err != nil {
				return err
			}
			if tenant == "" {
				tenant = conn.Tenant
			}
			if tenant == "" {
				return errors.New("no tenant: give --tenant-id, set " + cli.EnvTenant + ", or log in with --tenant")
			}
			sum, size, err := hashFile(ctx, file)
			if err != nil {
				return err
			}
			in := imagesapi.RegisterInput{TenantID: tenant, Name: name, Version: version, Format: format,
				SHA256: sum, SizeBytes: size, Description: description}
			if fleet {
				in.Scope = imagesapi.ScopeFleet
			}
			if sigFile != "" {
				sig, err := os.ReadFile(sigFile)
				if err != nil {
					return fmt.Errorf("--signature: %w", err)
				}
				in.Signature = string(sig)
			}
			reg, err := imagesapi.Register.Call(ctx, client, in)
			if err != nil {
				return err
			}
			im := reg.Image
			if reg.Upload != nil {
				f, err := os.Open(file)
				if err != nil {
					return err
				}
				defer f.Close()
				if im, err = imagesapi.UploadBytes(ctx, client.HTTP, client.BaseURL, *reg.Upload, f, size); err != nil {
					return err
				}
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(im)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&file, "file", "", "the image's bytes")
	fl.StringVar(&name, "name", "", "the image's name")
	fl.StringVar(&version, "version", "", "the image's version")
	fl.StringVar(&format, "format", "raw", "raw, qcow2 or iso")
	fl.StringVar(&sigFile, "signature", "", "the file's SSH signature (ssh-keygen -Y sign -n "+coreimages.SignatureNamespace+" -f KEY FILE writes FILE.sig)")
	fl.StringVar(&description, "description", "", "what the image is")
	fl.StringVar(&tenant, "tenant-id", "", "the tenant (default: the context's)")
	fl.StringVar(&contextName, "context", "", "the configuration context to use (default: the current one)")
	fl.BoolVar(&fleet, "fleet", false, "a fleet image: the platform's, in the root tenant")
	for _, f := range []string{"file", "name", "version"} {
		_ = cmd.MarkFlagRequired(f)
	}
	return cmd
}

// hashFile is the SHA-256 and size of the file's bytes.
func hashFile(ctx context.Context, path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, ctxReader{ctx, f})
	if err != nil {
		return "", 0, fmt.Errorf("hashing %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

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

// imageSignersCmd administers the signer allowlists with the operator's
// database access, like `better-compute iam`: a tenant's keys, or the
// fleet's (the root tenant's).
func imageSignersCmd() *cobra.Command {
	var cfg config
	var tenant, key string
	cmd := &cobra.Command{
		Use:   "image-signers",
		Short: "Administer the image signer allowlists (add, list, remove) of a tenant or the fleet",
	}
	cfg.bind(cmd.PersistentFlags(), false)
	cmd.PersistentFlags().StringVar(&tenant, "tenant", "", "the tenant whose allowlist it is, or fleet")
	with := func(cmd *cobra.Command, fn func(ctx context.Context, m *images.Images, tx store.Tx) (any, error)) error {
		if err := cfg.load(cmd, false); err != nil {
			return err
		}
		if tenant == "" {
			return errors.New("--tenant is required (a tenant id, or fleet)")
		}
		st, err := store.Open(cmd.Context(), cfg.DatabaseURL)
		if err != nil {
			return err
		}
		defer st.Close()
		catalog, err := core.DefaultCatalog()
		if err != nil {
			return err
		}
		m := images.New(nil, cfg.RootTenant, catalog.FullName(images.ResourceType), 0)
		var out any
		if err := st.InTx(cmd.Context(), store.ReadWrite, func(tx store.Tx) (err error) {
			out, err = fn(cmd.Context(), m, tx)
			return err
		}); err != nil {
			return err
		}
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	keyFlag := func(c *cobra.Command, what string) {
		c.Flags().StringVar(&key, "key", "", what)
		_ = c.MarkFlagRequired("key")
	}
	add := &cobra.Command{
		Use:   "add --tenant T|fleet --key LINE|FILE",
		Short: "Allow a key (an authorized_keys line, or a .pub file); verifies the available images it had signed",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			line, err := keyText(key)
			if err != nil {
				return err
			}
			return with(cmd, func(ctx context.Context, m *images.Images, tx store.Tx) (any, error) {
				s, n, err := m.AddSigner(ctx, tx, tenant, line)
				return map[string]any{"signer": s, "imagesVerified": n}, err
			})
		},
	}
	keyFlag(add, "an authorized_keys line (ssh-ed25519 AAAA... comment), or a file holding one")
	remove := &cobra.Command{
		Use:   "remove --tenant T|fleet --key FINGERPRINT|LINE|FILE",
		Short: "Remove a key; the images it verified become verified: false",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			line := key
			if !strings.HasPrefix(key, "SHA256:") {
				var err error
				if line, err = keyText(key); err != nil {
					return err
				}
			}
			return with(cmd, func(ctx context.Context, m *images.Images, tx store.Tx) (any, error) {
				n, err := m.RemoveSigner(ctx, tx, tenant, line)
				return map[string]any{"imagesUnverified": n}, err
			})
		},
	}
	keyFlag(remove, "the key's fingerprint (SHA256:...), its authorized_keys line, or a file holding it")
	list := &cobra.Command{
		Use:   "list --tenant T|fleet",
		Short: "List the allowlist's keys",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return with(cmd, func(ctx context.Context, m *images.Images, tx store.Tx) (any, error) {
				return m.ListSigners(ctx, tx, tenant)
			})
		},
	}
	cmd.AddCommand(add, remove, list)
	return cmd
}

// keyText is the key a flag gives: the line itself, or a file's content.
func keyText(v string) (string, error) {
	if strings.HasPrefix(v, "ssh-") || strings.HasPrefix(v, "ecdsa-") || strings.HasPrefix(v, "sk-") {
		return v, nil
	}
	b, err := os.ReadFile(v)
	if err != nil {
		return "", fmt.Errorf("--key: neither an authorized_keys line nor a readable file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}
