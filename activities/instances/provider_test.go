package instances

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/better-compute/better-compute/core"
	coresecrets "github.com/better-compute/better-compute/core/secrets"
	"github.com/better-compute/better-compute/drivers/providers"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/instances"
	"github.com/better-compute/better-compute/store/secrets"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// fakeProvider is an in-memory Provider through the interface, with the
// failures the issue names: a create whose answer is lost after the
// droplet was made, droplets listed only some calls after their create,
// and 429s.
type fakeProvider struct {
	mu       sync.Mutex
	servers  []providers.Server
	creates  int
	lostNext bool // the next create's answer is lost (an unknown outcome)
	listLag  int  // a new droplet is listed only after this many list calls
	unlisted map[string]int
	limited  int // the next calls answer 429
	token    string
}

func (f *fakeProvider) Open(_ context.Context, c providers.Credential) (providers.Provider, error) {
	f.token = c.Token
	return f, nil
}

func (f *fakeProvider) rateLimited() error {
	if f.limited > 0 {
		f.limited--
		return &providers.RateLimited{RetryAt: time.Now().Add(time.Second)}
	}
	return nil
}

func (f *fakeProvider) Kind() string                                        { return "digitalocean" }
func (f *fakeProvider) Regions(context.Context) ([]providers.Region, error) { return nil, nil }
func (f *fakeProvider) Sizes(context.Context) ([]providers.Size, error)     { return nil, nil }
func (f *fakeProvider) Images(context.Context) ([]providers.Image, error)   { return nil, nil }

func (f *fakeProvider) CreateServer(_ context.Context, r providers.CreateServer) (providers.Server, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.rateLimited(); err != nil {
		return providers.Server{}, err
	}
	f.creates++
	s := providers.Server{ID: fmt.Sprint(1000 + f.creates), Name: r.Name, Status: providers.ServerActive, Size: r.Size,
		Tags: r.Tags, PublicIPv4: fmt.Sprintf("203.0.113.%d", f.creates)}
	f.servers = append(f.servers, s)
	if f.unlisted == nil {
		f.unlisted = map[string]int{}
	}
	f.unlisted[s.ID] = f.listLag
	if f.lostNext {
		f.lostNext = false
		return providers.Server{}, fmt.Errorf("%w: the answer was lost", providers.ErrUnavailable)
	}
	return s, nil
}

func (f *fakeProvider) GetServer(_ context.Context, id string) (providers.Server, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.rateLimited(); err != nil {
		return providers.Server{}, err
	}
	for _, s := range f.servers {
		if s.ID == id {
			return s, nil
		}
	}
	return providers.Server{}, providers.ErrNotFound
}

func (f *fakeProvider) ServersTagged(_ context.Context, tag string) ([]providers.Server, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.rateLimited(); err != nil {
		return nil, err
	}
	var out []providers.Server
	for _, s := range f.servers {
		if f.unlisted[s.ID] > 0 {
			f.unlisted[s.ID]--
			continue
		}
		if slices.Contains(s.Tags, tag) {
			out = append(out, s)
		}
	}
	return out, nil
}

func (f *fakeProvider) DeleteServer(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.servers = slices.DeleteFunc(f.servers, func(s providers.Server) bool { return s.ID == id })
	return nil
}

func (f *fakeProvider) power(id, status string) (providers.Action, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.servers {
		if f.servers[i].ID == id {
			f.servers[i].Status = status
			return providers.Action{ID: "1", Status: providers.ActionCompleted}, nil
		}
	}
	return providers.Action{}, providers.ErrNotFound
}

func (f *fakeProvider) PowerOn(_ context.Context, id string) (providers.Action, error) {
	return f.power(id, providers.ServerActive)
}
func (f *fakeProvider) PowerOff(_ context.Context, id string) (providers.Action, error) {
	return f.power(id, providers.ServerOff)
}
func (f *fakeProvider) Resize(context.Context, string, string) (providers.Action, error) {
	return providers.Action{}, nil
}
func (f *fakeProvider) GetAction(context.Context, string, string) (providers.Action, error) {
	return providers.Action{}, nil
}

const tenant = "ten_prov"

func providerInstance(t *testing.T, st *store.Store, vault *secrets.Vault) string {
	t.Helper()
	ctx := context.Background()
	catalog, err := core.DefaultCatalog()
	if err != nil {
		t.Fatal(err)
	}
	siteID, acct, poolID, flavor := core.NewID("site"), core.NewID("pacct"), core.NewID("pool"), core.NewID("flv")
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO sites (id, tenant_id, name, region, iam_region, kind, created_by) VALUES ($1, $2, $1, 'fra1', 'eu-west', 'custom', 'idn_x')`,
			[]any{siteID, tenant}},
		{`INSERT INTO provider_accounts (id, tenant_id, provider, name, credential_ref, created_by)
			VALUES ($1, $2, 'digitalocean', 'do', $3, 'idn_x')`, []any{acct, tenant, "secret://" + tenant + "/do-token"}},
		{`INSERT INTO pools (id, tenant_id, site_id, name, class, gpu_model, gpu_memory_gb, agent, provider_account_id, created_by)
			VALUES ($1, $2, $3, $1, 'provider', 'NONE', 1, 'none', $4, 'idn_x')`, []any{poolID, tenant, siteID, acct}},
		{`INSERT INTO flavors (id, tenant_id, pool_id, name, vcpu, memory_mib, provider_size)
			VALUES ($1, $2, $3, 's1', 1, 1024, 's-1vcpu-1gb')`, []any{flavor, tenant, poolID}},
	} {
		if _, err := st.Pool.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatalf("%s: %v", q.sql, err)
		}
	}
	id := core.NewID("inst")
	types := domain.Types{Instance: catalog.FullName("instance"), Pool: catalog.FullName("pool")}
	if err := st.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		if _, err := vault.Put(ctx, tx, secrets.PutRequest{TenantID: tenant, Name: "do-token", Scope: coresecrets.ScopeTenant,
			Value: "dop_v1_test", By: "idn_x"}); err != nil {
			return err
		}
		if _, err := domain.Draft(ctx, tx, types, tenant, id, "idn_o", domain.Request{PoolID: poolID, FlavorID: flavor,
			ProviderImage: "ubuntu-24-04-x64", Name: "d"}); err != nil {
			return err
		}
		_, err := domain.Place(ctx, tx, tenant, id)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return id
}

// A droplet instance survives 429s and a create whose answer was lost
// (with the droplet listed late): exactly one droplet, found again by its
// tag, then stopped and deleted.
func TestProviderConvergesOnOneDroplet(t *testing.T) {
	ctx := context.Background()
	st := testenv.Store(t)
	kek, err := secrets.GenerateKEK()
	if err != nil {
		t.Fatal(err)
	}
	keys, err := secrets.ParseKeyring(kek)
	if err != nil {
		t.Fatal(err)
	}
	vault := secrets.NewVault(keys, "ten_root")
	id := providerInstance(t, st, vault)
	fake := &fakeProvider{lostNext: true, listLag: 2, limited: 1}
	a := &Instances{Store: st, Providers: fake, Secrets: vault}

	// step runs the activity as Temporal's retries would, until want.
	step := func(want string) {
		t.Helper()
		for attempt := 0; attempt < 10; attempt++ {
			p, err := a.ConvergeInstanceProvider(ctx, id)
			var app *temporal.ApplicationError
			switch {
			case err == nil && p.State == want:
				return
			case err == nil, errors.As(err, &app) && app.Type() == "RateLimited",
				errors.Is(err, providers.ErrUnavailable), errors.Is(err, providers.ErrOutcomeUnknown):
			default:
				t.Fatalf("attempt %d: %v", attempt, err)
			}
		}
		t.Fatalf("never became %s", want)
	}
	step("running")
	if fake.creates != 1 || len(fake.servers) != 1 || fake.token != "dop_v1_test" {
		t.Fatalf("creates %d, servers %+v", fake.creates, fake.servers)
	}
	s := fake.servers[0]
	if s.Name != providers.ServerName(id) || !slices.Equal(s.Tags, providers.ServerTags(id, tenant)) {
		t.Fatalf("droplet = %+v", s)
	}
	var address, server string
	if err := st.Pool.QueryRow(ctx, `SELECT address, provider_server_id FROM instances WHERE id = $1`, id).Scan(&address, &server); err != nil ||
		address != s.PublicIPv4 || server != s.ID {
		t.Fatalf("address %q server %q, %v", address, server, err)
	}

	change := func(sql string) {
		if _, err := st.Pool.Exec(ctx, sql, id); err != nil {
			t.Fatal(err)
		}
	}
	change(`UPDATE instances SET desired_state = 'stopped', state = 'stopping', generation = generation + 1 WHERE id = $1`)
	step("stopping") // powered off now, observed at the next step
	step("stopped")
	if fake.servers[0].Status != providers.ServerOff {
		t.Fatalf("droplet = %+v", fake.servers[0])
	}
	change(`UPDATE instances SET desired_state = 'deleted', state = 'deleting', generation = generation + 1 WHERE id = $1`)
	step("deleted")
	if len(fake.servers) != 0 || fake.creates != 1 {
		t.Fatalf("after delete: creates %d, servers %+v", fake.creates, fake.servers)
	}
}
