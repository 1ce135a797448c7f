package devstack

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/flavors"
	"github.com/better-compute/better-compute/api/images"
	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/api/provideraccounts"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/api/sandboxes"
	apisecrets "github.com/better-compute/better-compute/api/secrets"
	"github.com/better-compute/better-compute/core"
	coresandboxes "github.com/better-compute/better-compute/core/sandboxes"
	coresecrets "github.com/better-compute/better-compute/core/secrets"
	"github.com/better-compute/better-compute/drivers/providers/dofake"
	"github.com/better-compute/better-compute/iam"
)

// The dev stack's VPS fleet: a vps-host pool whose one machine is a real
// `bcd node` (the host agent, agents.go) running instances in runc and
// QEMU, and a provider pool backed by an account at the fake DigitalOcean
// API this process serves. Both are the root tenant's, offered to the demo
// tenant, whose user holds "user" on them. The demo image is the instance
// test image (`make testimage`), public, so the demo user can create an
// instance at once.
const (
	vpsPool         = "vps"
	providerPool    = "do"
	providerAccount = "do-fake"
	// providerTokenSecret holds the fake's token in the root tenant.
	providerTokenSecret = "do-fake-token"
	providerToken       = "dev-stack-fake-digitalocean"
	demoImageName       = "demo-httpd"
	demoImageVersion    = "1"
	// providerRegion is where the account's droplets go.
	providerRegion = "nyc3"
)

// VPSFleet names what seedVPS made (or found).
type VPSFleet struct {
	HostPoolID     string `json:"hostPoolId"`
	ProviderPoolID string `json:"providerPoolId"`
	AccountID      string `json:"providerAccountId"`
	ImageID        string `json:"imageId,omitempty"`
	// SandboxTemplateID is the demo tenant's sandbox template.
	SandboxTemplateID string `json:"sandboxTemplateId,omitempty"`
	// ProviderURL is the fake DigitalOcean API's base URL.
	ProviderURL string `json:"providerUrl"`
}

// startProvider serves the fake DigitalOcean API on Options.ProviderAddr.
func (s *Stack) startProvider() error {
	if s.opts.ProviderAddr == "-" {
		return nil
	}
	// The token may use the fake's previews; the account's own previews
	// flag decides whether better-compute does.
	srv, err := dofake.Start(s.opts.ProviderAddr, dofake.Config{Tokens: []string{providerToken}, PreviewTokens: []string{providerToken},
		Settings: dofake.Settings{BootDelay: 3 * time.Second, ActionDelay: 2 * time.Second},
		Logger:   s.opts.Logger.With("component", "do-fake")})
	if err != nil {
		return fmt.Errorf("fake DigitalOcean: %w", err)
	}
	s.provider = srv
	s.vps.ProviderURL = srv.URL
	return nil
}

// seedVPS creates the VPS fleet through the API, as the root admin would,
// finding what an earlier run made.
func (s *Stack) seedVPS(ctx context.Context) error {
	token, err := s.AdminToken()
	if err != nil {
		return err
	}
	admin := api.NewClient(s.apiURL, token)
	root := s.tokens.RootTenantID
	host, err := s.ensurePool(ctx, admin, pools.CreateInput{TenantID: root, SiteID: s.demo.SiteID, Name: vpsPool,
		Class: "vps-host", GPUModel: "H100", GPUMemoryGb: 80, Policy: &pools.Policy{Overcommit: map[string]float64{"vcpu": 4}}})
	if err != nil {
		return err
	}
	s.vps.HostPoolID = host
	for _, f := range []flavors.CreateInput{
		{Name: "c1-m1", VCPU: 1, MemoryGiB: 1, DiskGiB: 1, Runtime: "container"},
		{Name: "c2-m2", VCPU: 2, MemoryGiB: 2, DiskGiB: 2, Runtime: "container"},
		{Name: "vm-c1-m512", VCPU: 1, MemoryGiB: 0.5, DiskGiB: 1, Runtime: "vm"},
	} {
		f.TenantID, f.PoolID = root, host
		if err := s.ensureFlavor(ctx, admin, f); err != nil {
			return err
		}
	}
	// Instances count vcpu and memoryGiB against the offer: a key not named grants none.
	if err := s.offerToDemo(ctx, admin, host, pools.Quota{"gpu": demoGPUQuota, "vcpu": 64, "memoryGiB": 128}); err != nil {
		return err
	}
	if s.provider != nil {
		if s.vps.AccountID, err = s.ensureAccount(ctx, admin); err != nil {
			return err
		}
		do, err := s.ensurePool(ctx, admin, pools.CreateInput{TenantID: root, SiteID: s.demo.SiteID, Name: providerPool,
			Class: "provider", GPUModel: "H100", GPUMemoryGb: 80, Agent: "none", ProviderAccountID: s.vps.AccountID})
		if err != nil {
			return err
		}
		s.vps.ProviderPoolID = do
		if err := s.ensureFlavor(ctx, admin, flavors.CreateInput{TenantID: root, PoolID: do, Name: "s-1vcpu-1gb",
			VCPU: 1, MemoryGiB: 1, DiskGiB: 25, ProviderSize: "s-1vcpu-1gb"}); err != nil {
			return err
		}
		if err := s.offerToDemo(ctx, admin, do, pools.Quota{"gpu": demoGPUQuota}); err != nil {
			return err
		}
	}
	if s.vps.ImageID, err = s.ensureDemoImage(ctx, admin); err != nil || s.vps.ImageID == "" {
		return err
	}
	s.vps.SandboxTemplateID, err = s.ensureSandboxTemplate(ctx, host)
	return err
}

// sandboxTemplate is the demo tenant's sandbox template: the demo image in
// c1-m1, under gVisor where runsc is installed (runc otherwise).
const sandboxTemplate = "demo-shell"

// ensureSandboxTemplate makes (or finds) the demo user's sandbox template.
func (s *Stack) ensureSandboxTemplate(ctx context.Context, hostPool string) (string, error) {
	token, err := s.DemoToken()
	if err != nil {
		return "", err
	}
	demo := api.NewClient(s.apiURL, token)
	tenant := s.tokens.TenantID
	list, err := sandboxes.ListTemplates.Call(ctx, demo, sandboxes.TemplateListInput{TenantID: tenant})
	if err != nil {
		return "", fmt.Errorf("sandbox template: %w", err)
	}
	for _, t := range list.Items {
		if t.Name == sandboxTemplate {
			return t.ID, nil
		}
	}
	fl, err := flavors.List.Call(ctx, demo, flavors.ListInput{TenantID: tenant, PoolID: hostPool})
	if err != nil {
		return "", fmt.Errorf("sandbox template: %w", err)
	}
	flavorID := ""
	for _, f := range fl.Items {
		if f.Name == "c1-m1" {
			flavorID = f.ID
		}
	}
	runtime := coresandboxes.RuntimeGVisor
	if _, err := exec.LookPath("runsc"); err != nil {
		runtime = coresandboxes.RuntimeRunc
	}
	t, err := sandboxes.CreateTemplate.Call(ctx, demo, sandboxes.TemplateInput{TenantID: tenant, Name: sandboxTemplate,
		PoolID: hostPool, FlavorID: flavorID, ImageID: s.vps.ImageID, Runtime: runtime, MaxTTLSeconds: 3600})
	if err != nil {
		return "", fmt.Errorf("sandbox template: %w", err)
	}
	return t.ID, nil
}

func (s *Stack) ensurePool(ctx context.Context, admin *api.Client, in pools.CreateInput) (string, error) {
	list, err := pools.List.Call(ctx, admin, pools.ListInput{TenantID: in.TenantID, SiteID: in.SiteID})
	if err != nil {
		return "", fmt.Errorf("vps fleet: %w", err)
	}
	for _, p := range list.Items {
		if p.Name == in.Name && p.TenantID == in.TenantID {
			return p.ID, nil
		}
	}
	p, err := pools.Create.Call(ctx, admin, in)
	if err != nil {
		return "", fmt.Errorf("vps fleet: pool %s: %w", in.Name, err)
	}
	return p.ID, nil
}

func (s *Stack) ensureFlavor(ctx context.Context, admin *api.Client, in flavors.CreateInput) error {
	_, err := flavors.Create.Call(ctx, admin, in)
	if core.AsError(err).Code == core.CodeConflict {
		return nil // made by an earlier run
	}
	if err != nil {
		return fmt.Errorf("vps fleet: flavor %s: %w", in.Name, err)
	}
	return nil
}

// offerToDemo offers the pool to the demo tenant and gives its user the
// "user" relation there.
func (s *Stack) offerToDemo(ctx context.Context, admin *api.Client, poolID string, quota pools.Quota) error {
	if _, err := pools.Offer.Call(ctx, admin, pools.OfferInput{TenantID: s.tokens.RootTenantID, PoolID: poolID,
		ToTenantID: s.tokens.TenantID, Quota: quota}); err != nil {
		return fmt.Errorf("vps fleet: offer: %w", err)
	}
	_, err := s.cp.Admin.AddRelation(ctx, iam.Relation{TenantID: s.tokens.TenantID, SubjectID: s.tokens.UserIdentityID,
		Relation: "user", ResourceType: s.cp.Catalog.FullName("pool"), ResourceID: poolID})
	if err != nil && !errors.Is(err, core.ErrConflict) {
		return fmt.Errorf("vps fleet: relation: %w", err)
	}
	return nil
}

// ensureAccount keeps the fake's token as a root secret and the account
// pointing at this run's fake.
func (s *Stack) ensureAccount(ctx context.Context, admin *api.Client) (string, error) {
	root := s.tokens.RootTenantID
	if _, err := apisecrets.Put.Call(ctx, admin, apisecrets.PutInput{TenantID: root, Name: providerTokenSecret,
		Value: providerToken, Description: "the dev stack's fake DigitalOcean token", IdempotencyKey: "devstack-" + providerTokenSecret}); err != nil {
		return "", fmt.Errorf("vps fleet: the provider token: %w", err)
	}
	list, err := provideraccounts.List.Call(ctx, admin, rpc.TenantListInput{TenantID: root})
	if err != nil {
		return "", fmt.Errorf("vps fleet: %w", err)
	}
	for _, a := range list.Items {
		if a.Name != providerAccount {
			continue
		}
		if a.BaseURL != s.vps.ProviderURL {
			url := s.vps.ProviderURL
			if _, err := provideraccounts.Update.Call(ctx, admin, provideraccounts.UpdateInput{TenantID: root,
				ProviderAccountID: a.ID, BaseURL: &url}); err != nil {
				return "", fmt.Errorf("vps fleet: account: %w", err)
			}
		}
		return a.ID, nil
	}
	a, err := provideraccounts.Create.Call(ctx, admin, provideraccounts.CreateInput{TenantID: root, Provider: "digitalocean",
		Name: providerAccount, CredentialRef: coresecrets.Ref(root, providerTokenSecret), BaseURL: s.vps.ProviderURL,
		Regions: []string{providerRegion}})
	if err != nil {
		return "", fmt.Errorf("vps fleet: account: %w", err)
	}
	return a.ID, nil
}

// ensureDemoImage registers and uploads Options.DemoImage as a public
// fleet image (none when the file is missing: `make testimage` makes it).
func (s *Stack) ensureDemoImage(ctx context.Context, admin *api.Client) (string, error) {
	path := s.opts.DemoImage
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		s.opts.Logger.Warn("no demo instance image (make testimage makes one)", "path", path)
		return "", nil
	}
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	size, err := io.Copy(h, f)
	if err != nil {
		return "", err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	root := s.tokens.RootTenantID
	reg, err := images.Register.Call(ctx, admin, images.RegisterInput{TenantID: root, Scope: images.ScopeFleet,
		Name: demoImageName, Version: demoImageVersion, Format: "raw", SHA256: hex.EncodeToString(h.Sum(nil)), SizeBytes: size,
		Description: "the instance test image: busybox httpd on port 8080", IdempotencyKey: "devstack-demo-image"})
	if core.AsError(err).Code == core.CodeConflict {
		// An earlier run registered other bytes under the name: keep it.
		return s.findDemoImage(ctx, admin)
	}
	if err != nil {
		return "", fmt.Errorf("vps fleet: demo image: %w", err)
	}
	im := reg.Image
	if reg.Upload != nil {
		if im, err = images.UploadBytes(ctx, admin.HTTP, admin.BaseURL, *reg.Upload, f, size); err != nil {
			return "", fmt.Errorf("vps fleet: demo image upload: %w", err)
		}
	}
	if im.Visibility != "public" {
		if im, err = images.Promote.Call(ctx, admin, images.ImageInput{TenantID: root, ImageID: im.ID}); err != nil {
			return "", fmt.Errorf("vps fleet: demo image: %w", err)
		}
	}
	return im.ID, nil
}

func (s *Stack) findDemoImage(ctx context.Context, admin *api.Client) (string, error) {
	list, err := images.List.Call(ctx, admin, images.ListInput{TenantID: s.tokens.RootTenantID, Name: demoImageName})
	if err != nil {
		return "", err
	}
	for _, im := range list.Items {
		if im.Version == demoImageVersion {
			return im.ID, nil
		}
	}
	return "", fmt.Errorf("vps fleet: demo image %s@%s not found", demoImageName, demoImageVersion)
}

// VPS is the VPS fleet of the running stack.
func (s *Stack) VPS() VPSFleet { return s.vps }

// Provider is the fake DigitalOcean API behind the provider pool (nil
// when the stack serves none): tests inject its faults and read its
// counters.
func (s *Stack) Provider() *dofake.Fake {
	if s.provider == nil {
		return nil
	}
	return s.provider.Fake
}

// HostAgentDir is the VPS host agent's state directory (its instances,
// runc's state, its VMs' files).
func (s *Stack) HostAgentDir() string { return filepath.Join(s.opts.Dir, "agents", hostAgent) }
