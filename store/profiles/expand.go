package profiles

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/better-compute/better-compute/core"
	coreimages "github.com/better-compute/better-compute/core/images"
	"github.com/better-compute/better-compute/core/inventory"
	coreprofiles "github.com/better-compute/better-compute/core/profiles"
	"github.com/better-compute/better-compute/core/provisioning"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/images"
	"github.com/better-compute/better-compute/store/metal"
	"github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/pools"
	"github.com/better-compute/better-compute/store/secrets"
)

// TargetForNode builds the target of the tenant's enrolled node: its
// identity, pool, site, boot MAC, labels and driver bindings, its pool's
// verified-images rule, and the disks, NICs and hostname of its latest
// inventory (none before its first). Another tenant's node is NOT_FOUND; a
// node that was not enrolled as bare metal INVALID_STATE (notMetal).
func TargetForNode(ctx context.Context, tx store.Tx, tenantID, nodeID string) (coreprofiles.Target, error) {
	m, err := metal.Get(ctx, tx, tenantID, nodeID, false)
	if err != nil {
		return coreprofiles.Target{}, err
	}
	n := m.Node
	t := coreprofiles.Target{Kind: coreprofiles.TargetMetal, Node: coreprofiles.Node{
		ID: n.ID, Name: n.Name, PoolID: n.PoolID, SiteID: n.SiteID, BootMAC: m.BMC.BootMAC,
		Labels: n.Labels, DriverBindings: n.DriverBindings}}
	if n.PoolID != "" {
		p, err := pools.Get(ctx, tx, n.PoolID)
		if err != nil {
			return coreprofiles.Target{}, fmt.Errorf("profiles: the pool of node %s: %w", n.ID, err)
		}
		t.PoolRequiresVerifiedImages = p.Policy.RequireVerifiedImages
	}
	snap, err := nodes.Snapshot(ctx, tx, tenantID, nodeID, 0)
	if errors.Is(err, core.ErrNotFound) {
		return t, nil
	}
	if err != nil {
		return coreprofiles.Target{}, err
	}
	var inv inventory.NodeInventory
	if err := json.Unmarshal(snap.Document, &inv); err != nil {
		return coreprofiles.Target{}, fmt.Errorf("profiles: the inventory of node %s: %w", n.ID, err)
	}
	t.Node.Hostname = inv.System.Hostname
	for _, d := range inv.Disks {
		t.Node.Disks = append(t.Node.Disks, coreprofiles.Disk{Name: d.Name, Model: d.Model, Serial: d.Serial, WWN: d.WWN,
			SizeBytes: d.SizeBytes, SizeGiB: d.SizeBytes >> 30})
	}
	for _, nic := range inv.NICs {
		if nic.Virtual {
			continue
		}
		mac := nic.PermanentMAC
		if mac == "" {
			mac = nic.MAC
		}
		t.Node.NICs = append(t.Node.NICs, coreprofiles.NIC{Name: nic.Name, MAC: mac})
	}
	return t, nil
}

// Checked is a profile version checked against the database and, when
// given, a target: the version read, the image it resolved to (nil when
// it resolved to none), the rendering (for a target) and every problem.
type Checked struct {
	Profile  Profile
	Version  Version
	Image    *coreimages.Image
	Rendered coreprofiles.Rendered
	Problems []provisioning.Problem
}

// Check reads a version of the tenant's profile (0: the latest) and checks
// it without running it: its image resolves for the tenant (its own or a
// public one), is available, and verified where the profile or the
// target's pool asks; its user data's secret exists; and, for a target,
// it renders. A missing profile or version is an error; everything wrong
// with the profile is a problem.
func Check(ctx context.Context, tx store.Tx, vault *secrets.Vault, tenantID, profileID string, version int, t *coreprofiles.Target) (Checked, error) {
	p, v, err := GetVersion(ctx, tx, tenantID, profileID, version)
	if err != nil {
		return Checked{}, err
	}
	c := Checked{Profile: p, Version: v}
	doc, problems := coreprofiles.Parse(v.Document)
	if len(problems) > 0 {
		c.Problems = problems
		return c, nil
	}
	add := func(field, reason, format string, args ...any) {
		c.Problems = append(c.Problems, provisioning.Problem{Field: field, Reason: reason, Message: fmt.Sprintf(format, args...)})
	}
	im, err := images.Resolve(ctx, tx, tenantID, doc.Image)
	switch {
	case errors.Is(err, core.ErrNotFound):
		add("image", coreprofiles.ReasonNotFound, "the profile's image %s is not an image this tenant may use", refString(doc.Image))
	case err != nil:
		return Checked{}, err
	default:
		c.Image = &im
		verifiedOnly := doc.RequireVerifiedImage || t != nil && t.PoolRequiresVerifiedImages
		switch {
		case im.State != coreimages.StateAvailable:
			add("image", coreprofiles.ReasonImageNotAvail, "image %s@%s is %s: its bytes are not uploaded yet", im.Name, im.Version, im.State)
		case verifiedOnly && !im.Verified:
			who := "the profile"
			if !doc.RequireVerifiedImage {
				who = "the node's pool"
			}
			add("image", coreprofiles.ReasonImageNotVerified, "%s admits verified images only, and image %s@%s is not verified", who, im.Name, im.Version)
		}
	}
	if doc.UserDataIsSecret() {
		found, err := secretExists(ctx, tx, vault, tenantID, doc.UserData)
		switch {
		case core.AsError(err) != nil && core.AsError(err).Code == core.CodeInvalidInput:
			add("userData", coreprofiles.ReasonSecretRef, "userData is not a secret://<tenant>/<name> reference")
		case err != nil:
			return Checked{}, err
		case !found:
			add("userData", coreprofiles.ReasonNotFound, "the user data's secret %s does not exist", doc.UserData)
		}
	}
	if t == nil {
		c.Problems = append(c.Problems, coreprofiles.Check(doc)...)
		return c, nil
	}
	target := *t
	if c.Image != nil {
		target.Image = imageRef(*c.Image)
	}
	r, problems := coreprofiles.Render(doc, target)
	r.Context.ProfileID, r.Context.ProfileVersion = p.ID, v.Version
	c.Rendered, c.Problems = r, append(c.Problems, problems...)
	return c, nil
}

// Expand renders a version of the tenant's profile (0: the latest) for t,
// as a workflow runs it: the profile must be live, and every problem
// Check finds refuses it. A missing or foreign image or secret is
// NOT_FOUND, an image that is not available or not verified where it must
// be INVALID_STATE (reason imageNotAvailable, imageNotVerified), anything
// else INVALID_INPUT; each error's details name the field and reason
// (and list every problem).
func Expand(ctx context.Context, tx store.Tx, vault *secrets.Vault, tenantID, profileID string, version int, t coreprofiles.Target) (coreprofiles.Rendered, error) {
	c, err := Check(ctx, tx, vault, tenantID, profileID, version, &t)
	if err != nil {
		return coreprofiles.Rendered{}, err
	}
	if c.Profile.DeletedAt != nil {
		return coreprofiles.Rendered{}, core.Errorf(core.CodeInvalidState, "profile %s is deleted", profileID).
			WithDetails(map[string]any{"field": "profileId", "reason": "deleted"})
	}
	if len(c.Problems) > 0 {
		return coreprofiles.Rendered{}, ProblemsError(c.Problems)
	}
	return c.Rendered, nil
}

// ProblemsError is the error of a profile with problems, its code the
// most telling problem's.
func ProblemsError(problems []provisioning.Problem) error {
	pick, code := problems[0], core.CodeInvalidInput
	for _, p := range problems {
		if p.Reason == coreprofiles.ReasonNotFound {
			pick, code = p, core.CodeNotFound
			break
		}
		if code == core.CodeInvalidInput && (p.Reason == coreprofiles.ReasonImageNotAvail || p.Reason == coreprofiles.ReasonImageNotVerified) {
			pick, code = p, core.CodeInvalidState
		}
	}
	return core.Errorf(code, "%s", pick.Message).
		WithDetails(map[string]any{"field": pick.Field, "reason": pick.Reason, "problems": problems})
}

// secretExists asks the vault whether the reference names a secret of the
// tenant (or the fleet's); without a vault nothing can be told.
func secretExists(ctx context.Context, tx store.Tx, vault *secrets.Vault, tenantID, ref string) (bool, error) {
	if vault == nil {
		return false, core.Errorf(core.CodeUnavailable, "secrets are not configured")
	}
	return vault.Exists(ctx, tx, tenantID, ref)
}

func imageRef(im coreimages.Image) *provisioning.ImageRef {
	return &provisioning.ImageRef{ID: im.ID, TenantID: im.TenantID, Name: im.Name, Version: im.Version, Format: im.Format,
		SHA256: im.SHA256, SizeBytes: im.SizeBytes, Verified: im.Verified}
}

func refString(r coreimages.Ref) string {
	if r.ID != "" {
		return r.ID
	}
	return r.Name + "@" + r.Version
}
