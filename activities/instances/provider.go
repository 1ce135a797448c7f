package instances

import (
	"context"
	"errors"
	"time"

	"go.temporal.io/sdk/temporal"

	states "github.com/better-compute/better-compute/core/instances"
	"github.com/better-compute/better-compute/drivers/providers"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/flavors"
	domain "github.com/better-compute/better-compute/store/instances"
	"github.com/better-compute/better-compute/store/pools"
	"github.com/better-compute/better-compute/store/provideraccounts"
	"github.com/better-compute/better-compute/store/secrets"
)

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
		t.image = t.in.ProviderImage
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
	journal := createJournal{db: a.Store.Pool, id: id}
	if t.in.DesiredState == string(states.DesiredDeleted) {
		if t.in.ProviderServerID != "" {
			if err := p.DeleteServer(ctx, t.in.ProviderServerID); err != nil && !errors.Is(err, providers.ErrNotFound) {
				return err
			}
		}
		// Every droplet with the instance's tag, and none while a create
		// may still appear in the listing.
		if err := providers.EnsureDeleted(ctx, p, providers.InstanceTag(id), journal); err != nil {
			return err
		}
		return a.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error { return domain.FinishDelete(ctx, tx, id) })
	}
	server, err := a.ensureServer(ctx, p, t, journal)
	if err != nil {
		return err
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

// ensureServer reads the instance's droplet by its recorded id, else
// finds or creates it by its instance tag (providers.EnsureServer, with
// the create journaled on the instance row: a lost create is found
// again, never sent twice while it may still be listed).
func (a *Instances) ensureServer(ctx context.Context, p providers.Provider, t providerTarget, journal createJournal) (providers.Server, error) {
	if t.in.ProviderServerID != "" {
		s, err := p.GetServer(ctx, t.in.ProviderServerID)
		if err == nil || !errors.Is(err, providers.ErrNotFound) {
			return s, err
		}
	}
	s, _, err := providers.EnsureServer(ctx, p, providers.CreateServer{Name: providers.ServerName(t.in.ID), Region: t.region,
		Size: t.flavor.ProviderSize, Image: t.image, UserData: t.userData,
		Tags: providers.ServerTags(t.in.ID, t.in.TenantID)}, providers.InstanceTag(t.in.ID), journal)
	return s, err
}

// createJournal is providers.CreateJournal on the instance's row.
type createJournal struct {
	db store.DBTX
	id string
}

func (j createJournal) Pending(ctx context.Context) (time.Duration, bool, error) {
	return domain.CreateSentAgo(ctx, j.db, j.id)
}
func (j createJournal) Record(ctx context.Context) error {
	return domain.RecordCreateSent(ctx, j.db, j.id)
}
func (j createJournal) Forget(ctx context.Context) error {
	return domain.ForgetCreateSent(ctx, j.db, j.id)
}
