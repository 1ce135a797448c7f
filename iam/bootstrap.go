package iam

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/core"
)

// Names Bootstrap uses unless told otherwise.
const (
	BootstrapAdminName       = "admin"
	BootstrapTenantID        = "acme"
	BootstrapTenantName      = "Acme"
	BootstrapUserName        = "acme-user"
	BootstrapRootPolicy      = "root-authority"
	BootstrapTenantPolicy    = "tenant-admins"
	BootstrapTenantGroup     = "admins"
	DefaultBootstrapTokenTTL = 365 * 24 * time.Hour
)

// BootstrapOptions configures Bootstrap. Every field is optional.
type BootstrapOptions struct {
	AdminName  string // the root tenant's admin person; BootstrapAdminName
	TenantID   string // the example tenant; BootstrapTenantID
	TenantName string // BootstrapTenantName
	UserName   string // the example tenant's person; BootstrapUserName
	// AdminToken and UserToken are the plaintext tokens an earlier run
	// returned (the dev stack keeps them in .dev/admin-token and
	// .dev/acme-token). A token that still authenticates as its identity, in
	// the right kind of session, is reused; otherwise a new one is made.
	AdminToken string
	UserToken  string
	TokenTTL   time.Duration // of new tokens; DefaultBootstrapTokenTTL
}

// BootstrapResult says what exists after Bootstrap. AdminToken and
// UserToken hold plaintext only when this run created them.
type BootstrapResult struct {
	RootTenantID    string `json:"rootTenantId"`
	AdminIdentityID string `json:"adminIdentityId"`
	AdminSessionID  string `json:"adminSessionId"`
	AdminToken      string `json:"adminToken,omitempty"`
	TenantID        string `json:"tenantId"`
	UserIdentityID  string `json:"userIdentityId"`
	UserSessionID   string `json:"userSessionId"`
	UserToken       string `json:"userToken,omitempty"`
	// Created names what this run created or changed, e.g. "tenant root",
	// "identity root/admin", "token root/admin", "policy root/root-authority".
	Created []string `json:"created"`
}

// RootAuthorityPolicy is the root tenant's policy Bootstrap installs:
// root-authority identities of the root tenant may do everything in it.
func RootAuthorityPolicy(rootTenantID string) string {
	return fmt.Sprintf(`// Root-authority identities of the root tenant may do everything in it.
@id("root-authority")
permit (principal is Identity, action, resource is Resource)
when {
  principal.rootAuthority &&
  principal.tenantId == %[1]q &&
  resource.tenantId == %[1]q
};
`, rootTenantID)
}

// TenantAdminsPolicy is the example tenant's policy Bootstrap installs:
// members of the group may do everything in their own tenant.
func TenantAdminsPolicy(group string) string {
	return fmt.Sprintf(`// Members of %[1]q may do everything in their own tenant.
@id("tenant-admins")
permit (principal in Group::%[1]q, action, resource is Resource)
when { resource.tenantId == principal.tenantId };
`, group)
}

// Bootstrap makes a fresh installation usable, and is idempotent: the root
// tenant; an admin person in it with root authority and a user-session MFA
// token; the root tenant's RootAuthorityPolicy; the example tenant (acme)
// with a person in group "admins", a user-session token and the
// TenantAdminsPolicy. What exists is kept (a policy whose text differs is
// rewritten); a token is made only when the one passed in opts does not
// authenticate as its identity any more.
func Bootstrap(ctx context.Context, admin *Admin, opts BootstrapOptions) (BootstrapResult, error) {
	if opts.AdminName == "" {
		opts.AdminName = BootstrapAdminName
	}
	if opts.TenantID == "" {
		opts.TenantID = BootstrapTenantID
	}
	if opts.TenantName == "" {
		opts.TenantName = BootstrapTenantName
	}
	if opts.UserName == "" {
		opts.UserName = BootstrapUserName
	}
	if opts.TokenTTL == 0 {
		opts.TokenTTL = DefaultBootstrapTokenTTL
	}
	if opts.TenantID == admin.root {
		return BootstrapResult{}, core.Errorf(core.CodeInvalidInput, "the example tenant cannot be the root tenant").
			WithDetails(map[string]any{"field": "tenantId"})
	}
	b := &bootstrapper{admin: admin, opts: opts}
	res := BootstrapResult{RootTenantID: admin.root, TenantID: opts.TenantID}

	if err := b.tenant(ctx, admin.root, "Root"); err != nil {
		return res, err
	}
	adminIdn, err := b.identity(ctx, CreateIdentityInput{TenantID: admin.root, Kind: KindPerson,
		Name: opts.AdminName, RootAuthority: true})
	if err != nil {
		return res, err
	}
	res.AdminIdentityID = adminIdn.ID
	res.AdminSessionID, res.AdminToken, err = b.token(ctx, adminIdn, opts.AdminToken, true)
	if err != nil {
		return res, err
	}
	if err := b.policy(ctx, admin.root, BootstrapRootPolicy, RootAuthorityPolicy(admin.root)); err != nil {
		return res, err
	}

	if err := b.tenant(ctx, opts.TenantID, opts.TenantName); err != nil {
		return res, err
	}
	user, err := b.identity(ctx, CreateIdentityInput{TenantID: opts.TenantID, Kind: KindPerson,
		Name: opts.UserName, Groups: []string{BootstrapTenantGroup}})
	if err != nil {
		return res, err
	}
	res.UserIdentityID = user.ID
	res.UserSessionID, res.UserToken, err = b.token(ctx, user, opts.UserToken, false)
	if err != nil {
		return res, err
	}
	if err := b.policy(ctx, opts.TenantID, BootstrapTenantPolicy, TenantAdminsPolicy(BootstrapTenantGroup)); err != nil {
		return res, err
	}
	res.Created = b.created
	if res.Created == nil {
		res.Created = []string{}
	}
	return res, nil
}

type bootstrapper struct {
	admin   *Admin
	opts    BootstrapOptions
	created []string
}

func (b *bootstrapper) tenant(ctx context.Context, id, name string) error {
	_, err := b.admin.GetTenant(ctx, TenantRef{TenantID: id})
	if !errors.Is(err, core.ErrNotFound) {
		return err
	}
	_, err = b.admin.CreateTenant(ctx, CreateTenantInput{ID: id, Name: name})
	if errors.Is(err, core.ErrConflict) { // made by a concurrent bootstrap
		return nil
	}
	if err == nil {
		b.created = append(b.created, "tenant "+id)
	}
	return err
}

// identity finds the identity by name or creates it; it must be usable.
func (b *bootstrapper) identity(ctx context.Context, in CreateIdentityInput) (Identity, error) {
	idn, err := b.admin.identityByName(ctx, in.TenantID, in.Name)
	if errors.Is(err, core.ErrNotFound) {
		idn, err = b.admin.CreateIdentity(ctx, in)
		if errors.Is(err, core.ErrConflict) {
			idn, err = b.admin.identityByName(ctx, in.TenantID, in.Name)
		} else if err == nil {
			b.created = append(b.created, "identity "+in.TenantID+"/"+in.Name)
		}
	}
	if err != nil {
		return Identity{}, err
	}
	if idn.DisabledAt != 0 || idn.Kind != in.Kind || idn.RootAuthority != in.RootAuthority {
		return Identity{}, core.Errorf(core.CodeInvalidState,
			"identity %s/%s exists but is disabled or of another kind or authority", in.TenantID, in.Name)
	}
	return idn, nil
}

// token reuses have when it is a live user session of idn (with MFA when
// mfa), and makes a new token otherwise.
func (b *bootstrapper) token(ctx context.Context, idn Identity, have string, mfa bool) (sessionID, plaintext string, err error) {
	if have != "" {
		s, ok, err := b.admin.sessionOfToken(ctx, have)
		if err != nil {
			return "", "", err
		}
		if ok && s.IdentityID == idn.ID && s.TenantID == idn.TenantID && s.SessionKind == SessionUser && s.MFA == mfa {
			return s.ID, "", nil
		}
	}
	created, err := b.admin.CreateToken(ctx, CreateTokenInput{TenantID: idn.TenantID, IdentityID: idn.ID,
		SessionKind: SessionUser, MFA: mfa, TTLSeconds: int64(b.opts.TokenTTL / time.Second)})
	if err != nil {
		return "", "", err
	}
	b.created = append(b.created, "token "+idn.TenantID+"/"+idn.Name)
	return created.Session.ID, created.Token, nil
}

// policy puts the policy unless it is there with the same text.
func (b *bootstrapper) policy(ctx context.Context, tenantID, name, text string) error {
	ps, err := b.admin.ListPolicies(ctx, TenantRef{TenantID: tenantID})
	if err != nil {
		return err
	}
	for _, p := range ps {
		if p.Name == name && p.Cedar == text {
			return nil
		}
	}
	if _, err := b.admin.PutPolicy(ctx, PutPolicyInput{TenantID: tenantID, Name: name, Cedar: text}); err != nil {
		return err
	}
	b.created = append(b.created, "policy "+tenantID+"/"+name)
	return nil
}
