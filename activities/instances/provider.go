package instances

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.temporal.io/sdk/temporal"

	states "github.com/better-compute/better-compute/core/instances"
	"github.com/better-compute/better-compute/drivers/providers"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/flavors"
	"github.com/better-compute/better-compute/store/images"
	domain "github.com/better-compute/better-compute/store/instances"
	"github.com/better-compute/better-compute/store/pools"
	"github.com/better-compute/better-compute/store/provideraccounts"
	"github.com/better-compute/better-compute/store/secrets"
)

// Provider tags of every droplet an instance owns.
const (
	TagManaged        = "better-compute-managed"
	TagInstancePrefix = "better-compute-instance:"
	TagTenantPrefix   = "better-compute-tenant:"
)

// ListGrace is how long after a create was sent a droplet that is not
// listed yet is waited for (the provider lists new droplets late) before
// the create is sent again.
const ListGrace = 2 * time.Minute

// ServerName is the deterministic droplet name of an instance: "bc-i-"
// and 24 characters of its id's body, so a lost create is recognised.
func ServerName(instanceID string) string {
	body := instanceID[strings.IndexByte(instanceID, '_')+1:]
	if len(body) > 24 {
		body = body[:24]
	}
	return "bc-i-" + body
}

// InstanceTag is the tag naming the instance's droplet.
func InstanceTag(instanceID string) string { return TagInstancePrefix + instanceID }

// providerTarget is what a provider convergence reads from the database.
type providerTarget struct {
	in       domain.Instance
	pool     pools.Pool
	flavor   flavors.Flavor
	image    string
	region   string
	cred     providers.Credential
	userData string
}

// ConvergeInstanceProvider drives the droplet of an instance on a provider pool
// toward its desired state, one step per call: find it (by recorded id,
// else by its instance tag), create it (create_sent_at recorded first; a
// create whose outcome is unknown is looked up before it is ever sent
// again), power it on or off, resize it, delete it (every droplet with
// the instance's tag) and then end the instance. The droplet's status is
// recorded as observed and the state moved (store/instances.Converge). A
// 429, a 5xx or a timeout fails the activity, which Temporal retries with
// backoff: the instance stays converging. A refusal (4xx) marks it
// failed.
func (a *Instances) ConvergeInstanceProvider(ctx context.Context, id string) (Progress, error) {
	if a.Providers == nil || a.Secrets == nil {
		return Progress{}, errors.New("instances: no provider factory or secret store configured")
	}
	t, err := a.providerTarget(ctx, id)
	if err != nil {
		return Progress{}, err
	}
	p, err := a.Providers.Open(ctx, t.cred)
	if err != nil {
		return Progress{}, err
	}
	if err := a.stepProvider(ctx, p, t); err != nil {
		if errors.Is(err, providers.ErrRefused) {
			return a.refused(ctx, id, err)
		}
		return Progress{}, providerRetryable(err)
	}
	return a.ConvergeInstance(ctx, id)
}

func providerRetryable(err error) error {
	var rl *providers.RateLimited
	if errors.As(err, &rl) {
		return temporal.NewApplicationErrorWithOptions(err.Error(), "RateLimited", temporal.ApplicationErrorOptions{
			NextRetryDelay: time.Until(rl.RetryAt)})
	}
	return err
}

func (a *Instances) refused(ctx context.Context, id string, cause error) (Progress, error) {
	if err := a.MarkInstanceFailed(ctx, MarkFailedParams{InstanceID: id, Reason: "providerRefused", Message: cause.Error()}); err != nil {
		return Progress{}, err
	}
	return a.ConvergeInstance(ctx, id)
}

// providerTarget reads the instance, its pool, flavor and image, and
// resolves the account's token and the user data in one read-write
// transaction (the resolutions are recorded); the provider is called only
// after it.
func (a *Instances) providerTarget(ctx context.Context, id string) (providerTarget, error) {
	var t providerTarget
	err := a.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		if t.in, err = domain.LoadByID(ctx, tx, id); err != nil {
			return err
		}
		if t.pool, err = pools.View(ctx, tx, t.in.TenantID, t.in.PoolID); err != nil {
			return err
		}
		if t.flavor, err = flavorOf(ctx, tx, t.in); err != nil {
			return err
		}
		im, err := images.Get(ctx, tx, t.in.TenantID, t.in.ImageID)
		if err != nil {
			return err
		}
		t.image = im.Name
		acct, err := provideraccounts.Get(ctx, tx, t.pool.ProviderAccountID)
		if err != nil {
			return err
		}
		t.region = t.pool.Region
		if len(acct.Regions) > 0 {
			t.region = acct.Regions[0]
		}
		use := secrets.Use{Purpose: "provider-credential", IdentityKind: "workflow", IdentityID: id,
			ResourceType: "instance", ResourceID: id}
		token, err := provideraccounts.Token(ctx, tx, a.Secrets, acct, use)
		if err != nil {
			return err
		}
		t.cred = providers.Credential{Kind: acct.Provider, Token: token, BaseURL: acct.BaseURL}
		plain, ref, err := domain.UserData(ctx, tx, id)
		if err != nil {
			return err
		}
		t.userData = plain
		if ref != "" && t.in.DesiredState != string(states.DesiredDeleted) && t.in.ProviderServerID == "" {
			// Resolved only when it is handed to the provider (a create).
			t.userData, err = a.Secrets.Resolve(ctx, tx, ref, secrets.Use{TenantID: t.in.TenantID, Purpose: "instance-user-data",
				IdentityKind: "provider", IdentityID: acct.ID, ResourceType: "instance", ResourceID: id})
		}
		return err
	})
	return t, err
}

// flavorOf reads the instance's flavor, deleted or not.
func flavorOf(ctx context.Context, tx store.Tx, in domain.Instance) (flavors.Flavor, error) {
	var f flavors.Flavor
	err := tx.QueryRow(ctx, `SELECT id, provider_size FROM flavors WHERE id = $1`, in.FlavorID).Scan(&f.ID, &f.ProviderSize)
	return f, err
}

// stepProvider makes one convergence step at the provider.
func (a *Instances) stepProvider(ctx context.Context, p providers.Provider, t providerTarget) error {
	id := t.in.ID
	if t.in.DesiredState == string(states.DesiredDeleted) {
		servers, err := p.ServersTagged(ctx, InstanceTag(id))
		if err != nil {
			return err
		}
		for _, s := range servers {
			if err := p.DeleteServer(ctx, s.ID); err != nil {
				return err
			}
		}
		if t.in.ProviderServerID != "" {
			if err := p.DeleteServer(ctx, t.in.ProviderServerID); err != nil && !errors.Is(err, providers.ErrNotFound) {
				return err
			}
		}
		return a.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error { return domain.FinishDelete(ctx, tx, id) })
	}
	server, found, err := a.findServer(ctx, p, t.in)
	if err != nil {
		return err
	}
	if !found {
		if server, err = a.createServer(ctx, p, t); err != nil || server.ID == "" {
			return err
		}
	}
	if err := a.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		return domain.RecordProvider(ctx, tx, id, server.ID, server.PublicIPv4)
	}); err != nil {
		return err
	}
	if t.flavor.ProviderSize != "" && server.Size != "" && server.Size != t.flavor.ProviderSize {
		if server.Status == providers.ServerActive {
			_, err := p.PowerOff(ctx, server.ID)
			return err // resized once it is off, at a later step
		}
		if server.Status == providers.ServerOff {
			_, err := p.Resize(ctx, server.ID, t.flavor.ProviderSize)
			return err
		}
	}
	switch {
	case t.in.DesiredState == string(states.DesiredRunning) && server.Status == providers.ServerOff:
		_, err = p.PowerOn(ctx, server.ID)
	case t.in.DesiredState == string(states.DesiredStopped) && server.Status == providers.ServerActive:
		_, err = p.PowerOff(ctx, server.ID)
	}
	if err != nil {
		return err
	}
	observed := ""
	switch server.Status {
	case providers.ServerActive:
		observed = "running"
	case providers.ServerOff:
		observed = "stopped"
	}
	if observed == "" {
		return nil
	}
	return a.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error { return domain.SetObserved(ctx, tx, id, observed) })
}

// findServer finds the instance's droplet: by its recorded id, else by
// its instance tag (the one with the instance's name).
func (a *Instances) findServer(ctx context.Context, p providers.Provider, in domain.Instance) (providers.Server, bool, error) {
	if in.ProviderServerID != "" {
		s, err := p.GetServer(ctx, in.ProviderServerID)
		if err == nil {
			return s, true, nil
		}
		if !errors.Is(err, providers.ErrNotFound) {
			return providers.Server{}, false, err
		}
	}
	servers, err := p.ServersTagged(ctx, InstanceTag(in.ID))
	if err != nil {
		return providers.Server{}, false, err
	}
	for _, s := range servers {
		if s.Name == ServerName(in.ID) {
			return s, true, nil
		}
	}
	return providers.Server{}, false, nil
}

// createServer sends the create, recording create_sent_at first. When a
// create was sent before and its droplet is not listed yet, it waits
// (a retryable error) for ListGrace before it sends another.
func (a *Instances) createServer(ctx context.Context, p providers.Provider, t providerTarget) (providers.Server, error) {
	id := t.in.ID
	sentAt, err := domain.CreateSentAt(ctx, a.Store.Pool, id)
	if err != nil {
		return providers.Server{}, err
	}
	if sentAt > 0 && time.Since(time.UnixMilli(sentAt)) < ListGrace {
		return providers.Server{}, fmt.Errorf("instances: the droplet of %s created at %d is not listed yet", id, sentAt)
	}
	if err := a.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		if sentAt > 0 {
			return domain.ResendCreate(ctx, tx, id)
		}
		_, err := domain.MarkCreateSent(ctx, tx, id)
		return err
	}); err != nil {
		return providers.Server{}, err
	}
	return p.CreateServer(ctx, providers.CreateServer{Name: ServerName(id), Region: t.region, Size: t.flavor.ProviderSize,
		Image: t.image, UserData: t.userData,
		Tags: []string{TagManaged, InstanceTag(id), TagTenantPrefix + t.in.TenantID}})
}
