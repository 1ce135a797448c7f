// Package pools is the pools domain: pools, their offers to other tenants
// (whose quotas are the tenants' quotas), their rules that need the
// database, their SQL and their state writes. It is the only writer of the
// pools and pool_offers tables.
package pools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/better-compute/better-compute/store/provideraccounts"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/better-compute/core"
	policy "github.com/better-compute/better-compute/core/pools"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/sites"
)

// ResourceType is the catalog type a pool is decided on.
const ResourceType = "pool"

// Pool is a pool as the API returns it. Offer is the viewing tenant's
// offer when the pool is another tenant's, offered to it.
type Pool struct {
	ID                string        `json:"id"`
	TenantID          string        `json:"tenantId"`
	SiteID            string        `json:"siteId"`
	Region            string        `json:"region"`
	Name              string        `json:"name"`
	Class             string        `json:"class"`
	GPUModel          string        `json:"gpuModel"`
	GPUMemoryGb       int           `json:"gpuMemoryGb"`
	Sharing           string        `json:"sharing"`
	Agent             string        `json:"agent"`
	Policy            policy.Policy `json:"policy"`
	ProviderAccountID string        `json:"providerAccountId,omitempty"`
	// BillingMode is metered, platform-fee or none (BillingModes).
	BillingMode string `json:"billingMode"`
	CreatedBy   string `json:"createdBy"`
	CreatedAt   int64  `json:"createdAt"`
	UpdatedAt   int64  `json:"updatedAt"`
	ArchivedAt  *int64 `json:"archivedAt,omitempty"`
	Offer       *Offer `json:"offer,omitempty"`
}

// Offer is a pool_offers row: the pool in TenantID's view, with its quota.
type Offer struct {
	PoolID             string           `json:"poolId"`
	TenantID           string           `json:"tenantId"` // the receiving tenant
	Quota              map[string]int64 `json:"quota"`
	Priority           *int             `json:"priority,omitempty"`
	IncludeDescendants bool             `json:"includeDescendants"`
	// Suspended offers admit nothing new (CheckOffer); ExcludedRegions
	// are regions nothing new is made in.
	Suspended       bool     `json:"suspended"`
	SuspendedAt     *int64   `json:"suspendedAt,omitempty"`
	ExcludedRegions []string `json:"excludedRegions,omitempty"`
	CreatedBy       string   `json:"createdBy"`
	CreatedAt       int64    `json:"createdAt"`
	UpdatedAt       int64    `json:"updatedAt"`
}

// selectPools reads pools with their site's region and the offer to the
// viewing tenant ($1), if any.
const selectPools = `SELECT p.id, p.tenant_id, p.site_id, s.region, p.name, p.class, p.gpu_model, p.gpu_memory_gb,
	p.sharing, p.agent, p.policy, coalesce(p.provider_account_id, ''), p.billing_mode, p.created_by, p.created_at, p.updated_at, p.archived_at,
	o.pool_id, o.tenant_id, o.quota, o.priority, o.include_descendants, o.suspended_at, o.excluded_regions,
	o.created_by, o.created_at, o.updated_at
	FROM pools p JOIN sites s ON s.id = p.site_id
	LEFT JOIN pool_offers o ON o.pool_id = p.id AND o.tenant_id = $1`

func scan(row pgx.Row) (Pool, error) {
	var p Pool
	var pol []byte
	var created, updated time.Time
	var archived *time.Time
	var oPool, oTenant, oBy *string
	var oQuota []byte
	var oPriority *int32
	var oDesc *bool
	var oCreated, oUpdated, oSuspended *time.Time
	var oExcluded []string
	err := row.Scan(&p.ID, &p.TenantID, &p.SiteID, &p.Region, &p.Name, &p.Class, &p.GPUModel, &p.GPUMemoryGb,
		&p.Sharing, &p.Agent, &pol, &p.ProviderAccountID, &p.BillingMode, &p.CreatedBy, &created, &updated, &archived,
		&oPool, &oTenant, &oQuota, &oPriority, &oDesc, &oSuspended, &oExcluded, &oBy, &oCreated, &oUpdated)
	if err != nil {
		return Pool{}, err
	}
	if err := json.Unmarshal(pol, &p.Policy); err != nil {
		return Pool{}, fmt.Errorf("pool %s: policy: %w", p.ID, err)
	}
	p.CreatedAt, p.UpdatedAt, p.ArchivedAt = created.UnixMilli(), updated.UnixMilli(), msPtr(archived)
	if oPool != nil {
		o := Offer{PoolID: *oPool, TenantID: *oTenant, IncludeDescendants: *oDesc, CreatedBy: *oBy,
			CreatedAt: oCreated.UnixMilli(), UpdatedAt: oUpdated.UnixMilli(),
			Suspended: oSuspended != nil, SuspendedAt: msPtr(oSuspended), ExcludedRegions: nonEmpty(oExcluded)}
		if oPriority != nil {
			v := int(*oPriority)
			o.Priority = &v
		}
		if err := json.Unmarshal(oQuota, &o.Quota); err != nil {
			return Pool{}, fmt.Errorf("offer of %s: quota: %w", p.ID, err)
		}
		p.Offer = &o
	}
	return p, nil
}

const offerColumns = `pool_id, tenant_id, quota, priority, include_descendants, suspended_at, excluded_regions,
	created_by, created_at, updated_at`

// offerColumnsOf are offerColumns of the table aliased alias.
func offerColumnsOf(alias string) string {
	cols := strings.Split(offerColumns, ",")
	for i, c := range cols {
		cols[i] = alias + "." + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}

func scanOffer(row pgx.Row) (Offer, error) {
	var o Offer
	var quota []byte
	var priority *int32
	var created, updated time.Time
	var suspended *time.Time
	if err := row.Scan(&o.PoolID, &o.TenantID, &quota, &priority, &o.IncludeDescendants, &suspended, &o.ExcludedRegions,
		&o.CreatedBy, &created, &updated); err != nil {
		return Offer{}, err
	}
	o.Suspended, o.SuspendedAt, o.ExcludedRegions = suspended != nil, msPtr(suspended), nonEmpty(o.ExcludedRegions)
	if err := json.Unmarshal(quota, &o.Quota); err != nil {
		return Offer{}, err
	}
	if priority != nil {
		v := int(*priority)
		o.Priority = &v
	}
	o.CreatedAt, o.UpdatedAt = created.UnixMilli(), updated.UnixMilli()
	return o, nil
}

func nonEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

func msPtr(t *time.Time) *int64 {
	if t == nil {
		return nil
	}
	ms := t.UnixMilli()
	return &ms
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

func nameTaken(name string) error {
	return core.Errorf(core.CodeConflict, "a pool named %q exists in this tenant", name).WithDetails(map[string]any{"field": "name"})
}

// NotFound is the answer for a pool outside the caller's reach.
func NotFound(id string) error { return core.Errorf(core.CodeNotFound, "pool %s not found", id) }

// PutAuthz writes the pool's projection row (typ is the pool type's full
// name), shared with every tenant it is offered to, in the transaction
// that changed the pool, its offers or its site's region.
func PutAuthz(ctx context.Context, tx store.Tx, typ string, p Pool) error {
	rows, err := tx.Query(ctx, `SELECT tenant_id FROM pool_offers WHERE pool_id = $1`, p.ID)
	if err != nil {
		return err
	}
	shared, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	return store.PutAuthzResource(ctx, tx, store.AuthzResource{
		Type: typ, ID: p.ID, TenantID: p.TenantID, SharedWith: shared,
		Attributes: map[string]any{"region": p.Region, "class": p.Class, "gpuModel": p.GPUModel,
			"gpuMemoryGb": p.GPUMemoryGb, "sharing": p.Sharing},
	})
}

// PutSiteAuthz rewrites the projection rows of the site's pools, whose
// region is the site's, once the site's region changed. The pools are
// locked, so a concurrent change of one waits for the new region.
func PutSiteAuthz(ctx context.Context, tx store.Tx, typ, siteID string) error {
	rows, err := tx.Query(ctx, `SELECT id FROM pools WHERE site_id = $1 FOR UPDATE`, siteID)
	if err != nil {
		return err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, id := range ids {
		p, err := LoadByID(ctx, tx, id)
		if err != nil {
			return err
		}
		if err := PutAuthz(ctx, tx, typ, p); err != nil {
			return err
		}
	}
	return nil
}

// Load reads a pool the tenant owns, locked for a change; any other
// (another tenant's, even offered to this one) is NOT_FOUND.
func Load(ctx context.Context, tx store.Tx, tenantID, id string) (Pool, error) {
	p, err := scan(tx.QueryRow(ctx, selectPools+` WHERE p.tenant_id = $1 AND p.id = $2 FOR UPDATE OF p`, tenantID, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Pool{}, NotFound(id)
	}
	return p, err
}

// Live is Load for a change: an archived pool is INVALID_STATE.
func Live(ctx context.Context, tx store.Tx, tenantID, id string) (Pool, error) {
	p, err := Load(ctx, tx, tenantID, id)
	if err == nil && p.ArchivedAt != nil {
		err = core.Errorf(core.CodeInvalidState, "pool %s is archived", id)
	}
	return p, err
}

// LoadByID reads any pool (the fleet's view), locked.
func LoadByID(ctx context.Context, tx store.Tx, id string) (Pool, error) {
	p, err := scan(tx.QueryRow(ctx, selectPools+` WHERE p.id = $2 FOR UPDATE OF p`, "", id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Pool{}, NotFound(id)
	}
	return p, err
}

// Get reads any pool (the fleet's view), unlocked.
func Get(ctx context.Context, tx store.Tx, id string) (Pool, error) {
	p, err := scan(tx.QueryRow(ctx, selectPools+` WHERE p.id = $2`, "", id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Pool{}, NotFound(id)
	}
	return p, err
}

// View reads a pool in the tenant's view: its own, or one offered to it.
func View(ctx context.Context, tx store.Tx, tenantID, id string) (Pool, error) {
	return scanViewed(tx.QueryRow(ctx, viewSQL, tenantID, id), id)
}

// QueueView queues View's read in b (store.Read); the answer is valid once
// b has run.
func QueueView(b *store.Batch, tenantID, id string) func() (Pool, error) {
	return store.QueueRow(b, func(row pgx.Row) (Pool, error) { return scanViewed(row, id) }, viewSQL, tenantID, id)
}

const viewSQL = selectPools + ` WHERE p.id = $2 AND (p.tenant_id = $1 OR o.tenant_id IS NOT NULL)`

func scanViewed(row pgx.Row, id string) (Pool, error) {
	p, err := scan(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return Pool{}, NotFound(id)
	}
	return p, err
}

// Own reads a pool the tenant owns, unlocked (for reads); any other, even
// one offered to the tenant, is NOT_FOUND: what belongs to a pool (join
// tokens, join requests) is the owner's, as every change to it.
func Own(ctx context.Context, tx store.Tx, tenantID, id string) (Pool, error) {
	p, err := View(ctx, tx, tenantID, id)
	if err == nil && p.TenantID != tenantID {
		return Pool{}, NotFound(id)
	}
	return p, err
}

// InView reads the pools of the tenant's view, oldest first: its own and
// those offered to it; the one pool poolID (archived included) when it is
// set, else the live ones.
func InView(ctx context.Context, tx store.Tx, tenantID, poolID string) ([]Pool, error) {
	rows, err := tx.Query(ctx, selectPools+` WHERE (p.tenant_id = $1 OR o.tenant_id IS NOT NULL) AND (p.id = $2 OR ($2 = '' AND p.archived_at IS NULL))
		ORDER BY p.created_at, p.id`, tenantID, poolID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Pool, error) { return scan(r) })
}

// New is what pools.create is given. Sharing and Agent are already
// defaulted; Policy is validated and defaulted.
type New struct {
	SiteID            string
	Name              string
	Class             string
	GPUModel          string
	GPUMemoryGb       int
	Sharing           string
	Agent             string
	Policy            policy.Policy
	ProviderAccountID string
	// BillingMode is one of BillingModes; "" is metered.
	BillingMode string
}

// Create inserts a pool on the tenant's own, live site, and its
// authorization row (typ is the pool type's full name). A name taken in
// the tenant is CONFLICT.
func Create(ctx context.Context, tx store.Tx, typ, tenantID, createdBy string, in New) (Pool, error) {
	if _, err := sites.Live(ctx, tx, tenantID, in.SiteID); err != nil {
		return Pool{}, err
	}
	if err := ownAccount(ctx, tx, tenantID, in.ProviderAccountID); err != nil {
		return Pool{}, err
	}
	policyJSON, err := json.Marshal(in.Policy)
	if err != nil {
		return Pool{}, err
	}
	if in.BillingMode == "" {
		in.BillingMode = BillingMetered
	}
	id := core.NewID("pool")
	_, err = tx.Exec(ctx, `INSERT INTO pools (id, tenant_id, site_id, name, class, gpu_model, gpu_memory_gb, sharing, agent,
		policy, provider_account_id, billing_mode, created_by) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,NULLIF($11,''),$12,$13)`,
		id, tenantID, in.SiteID, in.Name, in.Class, in.GPUModel, in.GPUMemoryGb, in.Sharing, in.Agent,
		string(policyJSON), in.ProviderAccountID, in.BillingMode, createdBy)
	if isUniqueViolation(err) {
		return Pool{}, nameTaken(in.Name)
	}
	if err != nil {
		return Pool{}, err
	}
	p, err := Load(ctx, tx, tenantID, id)
	if err != nil {
		return Pool{}, err
	}
	return p, PutAuthz(ctx, tx, typ, p)
}

// List reads the tenant's live pools and the live pools offered to it, of
// which the projection holds a row in the tenant's view, at most limit,
// oldest first; siteID and class filter when set.
func List(ctx context.Context, tx store.Tx, typ, tenantID, siteID, class string, page store.PageQuery) ([]Pool, error) {
	after := page.AfterKey()
	rows, err := tx.Query(ctx, selectPools+`
		WHERE p.archived_at IS NULL AND (p.tenant_id = $1 OR o.tenant_id IS NOT NULL)
		  AND ($2 = '' OR p.site_id = $2) AND ($3 = '' OR p.class = $3)
		  AND `+store.VisibleIn("p.id", "$1", "$4", true)+`
		  AND (`+store.MsOf("p.created_at")+`, p.id) > ($6, $7)
		ORDER BY `+store.MsOf("p.created_at")+`, p.id LIMIT $5`, tenantID, siteID, class, typ, page.Fetch(), after.At, after.ID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Pool, error) { return scan(r) })
}

// Change is what pools.update changes; nil fields are kept, and a policy
// replaces the whole policy.
type Change struct {
	Name              *string
	GPUMemoryGb       *int
	Sharing           *string
	Agent             *string
	Policy            *policy.Policy
	ProviderAccountID *string
	BillingMode       *string
}

// Update changes the tenant's live pool. Its site, class and gpuModel never
// change. The policy, new or kept, is checked against the resulting
// sharing, and providerAccountId against the class.
func Update(ctx context.Context, tx store.Tx, typ, tenantID, id string, ch Change) (Pool, error) {
	p, err := Live(ctx, tx, tenantID, id)
	if err != nil {
		return Pool{}, err
	}
	set := func(dst *string, v *string) {
		if v != nil {
			*dst = *v
		}
	}
	set(&p.Name, ch.Name)
	set(&p.Sharing, ch.Sharing)
	set(&p.Agent, ch.Agent)
	set(&p.ProviderAccountID, ch.ProviderAccountID)
	set(&p.BillingMode, ch.BillingMode)
	if ch.GPUMemoryGb != nil {
		p.GPUMemoryGb = *ch.GPUMemoryGb
	}
	if err := policy.CheckClass(p.Class, p.ProviderAccountID); err != nil {
		return Pool{}, err
	}
	if ch.ProviderAccountID != nil {
		if err := ownAccount(ctx, tx, p.TenantID, p.ProviderAccountID); err != nil {
			return Pool{}, err
		}
	}
	next := &p.Policy
	if ch.Policy != nil {
		next = ch.Policy
	}
	if p.Policy, err = policy.Validate(next, p.Sharing); err != nil {
		return Pool{}, err
	}
	policyJSON, err := json.Marshal(p.Policy)
	if err != nil {
		return Pool{}, err
	}
	_, err = tx.Exec(ctx, `UPDATE pools SET name = $2, gpu_memory_gb = $3, sharing = $4, agent = $5, policy = $6,
		provider_account_id = NULLIF($7, ''), billing_mode = $8, updated_at = now() WHERE id = $1`,
		p.ID, p.Name, p.GPUMemoryGb, p.Sharing, p.Agent, string(policyJSON), p.ProviderAccountID, p.BillingMode)
	if isUniqueViolation(err) {
		return Pool{}, nameTaken(p.Name)
	}
	if err != nil {
		return Pool{}, err
	}
	if p, err = Load(ctx, tx, tenantID, p.ID); err != nil {
		return Pool{}, err
	}
	return p, PutAuthz(ctx, tx, typ, p)
}

// Archive archives the tenant's live pool: it leaves every list (its own
// tenant's and those it is offered to) and refuses changes; get still
// answers it.
func Archive(ctx context.Context, tx store.Tx, tenantID, id string) (Pool, error) {
	p, err := Live(ctx, tx, tenantID, id)
	if err != nil {
		return Pool{}, err
	}
	if _, err := tx.Exec(ctx, `UPDATE pools SET archived_at = now(), updated_at = now() WHERE id = $1`, p.ID); err != nil {
		return Pool{}, err
	}
	return Load(ctx, tx, tenantID, p.ID)
}

// OfferTerms are an offer's quota, priority, includeDescendants, whether
// it is suspended and the regions it excludes.
type OfferTerms struct {
	Quota              policy.Quota
	Priority           *int
	IncludeDescendants bool
	Suspended          bool
	ExcludedRegions    []string
}

func quotaJSON(q policy.Quota) (string, error) {
	if q == nil {
		q = policy.Quota{}
	}
	raw, err := json.Marshal(q)
	return string(raw), err
}

// PutOffer offers the tenant's live pool to another tenant, or replaces the
// offer's terms; the receiving tenant is added to the pool's projection row
// in the same transaction.
func PutOffer(ctx context.Context, tx store.Tx, typ, tenantID, id, toTenantID, createdBy string, terms OfferTerms) (Offer, error) {
	if toTenantID == tenantID {
		return Offer{}, policy.BadField("toTenantId", "self", "a pool is not offered to its own tenant")
	}
	if err := terms.Quota.Check(); err != nil {
		return Offer{}, err
	}
	p, err := Live(ctx, tx, tenantID, id)
	if err != nil {
		return Offer{}, err
	}
	quota, err := quotaJSON(terms.Quota)
	if err != nil {
		return Offer{}, err
	}
	if terms.ExcludedRegions == nil {
		terms.ExcludedRegions = []string{}
	}
	for _, r := range terms.ExcludedRegions {
		if !regionSlug.MatchString(r) {
			return Offer{}, policy.BadField("excludedRegions", "regionSlug", "excluded region %q is not a region slug", r)
		}
	}
	// A suspension keeps the instant it began while it lasts.
	o, err := scanOffer(tx.QueryRow(ctx, `INSERT INTO pool_offers AS o (pool_id, tenant_id, quota, priority, include_descendants,
			suspended_at, excluded_regions, created_by)
		VALUES ($1, $2, $3, $4, $5, CASE WHEN $6 THEN now() END, $7, $8)
		ON CONFLICT (pool_id, tenant_id) DO UPDATE SET quota = EXCLUDED.quota, priority = EXCLUDED.priority,
			include_descendants = EXCLUDED.include_descendants, excluded_regions = EXCLUDED.excluded_regions,
			suspended_at = CASE WHEN $6 THEN COALESCE(o.suspended_at, now()) END, updated_at = now()
		RETURNING `+offerColumns, p.ID, toTenantID, quota, terms.Priority, terms.IncludeDescendants, terms.Suspended,
		terms.ExcludedRegions, createdBy))
	if err != nil {
		return Offer{}, err
	}
	return o, PutAuthz(ctx, tx, typ, p)
}

// Unoffer withdraws an offer of the tenant's pool; the pool leaves the
// receiving tenant's view (its projection row) in the same transaction.
func Unoffer(ctx context.Context, tx store.Tx, typ, tenantID, id, toTenantID string) (Offer, error) {
	p, err := Load(ctx, tx, tenantID, id)
	if err != nil {
		return Offer{}, err
	}
	o, err := scanOffer(tx.QueryRow(ctx, `DELETE FROM pool_offers WHERE pool_id = $1 AND tenant_id = $2 RETURNING `+offerColumns, p.ID, toTenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Offer{}, core.Errorf(core.CodeNotFound, "pool %s is not offered to %s", p.ID, toTenantID)
	}
	if err != nil {
		return Offer{}, err
	}
	return o, PutAuthz(ctx, tx, typ, p)
}

// Quotas reads the offers the tenant received on live pools (the one pool
// poolID when set), by pool id, the page's rows after its key plus one. A
// pool outside the tenant's view is NOT_FOUND; its own pool has no offer,
// so no quota items.
func Quotas(ctx context.Context, tx store.Tx, tenantID, poolID string, page store.PageQuery) ([]Offer, error) {
	if poolID != "" {
		if _, err := View(ctx, tx, tenantID, poolID); err != nil {
			return nil, err
		}
	}
	rows, err := tx.Query(ctx, `SELECT `+offerColumnsOf("o")+`
		FROM pool_offers o JOIN pools p ON p.id = o.pool_id
		WHERE o.tenant_id = $1 AND p.archived_at IS NULL AND ($2 = '' OR o.pool_id = $2) AND o.pool_id > $4
		ORDER BY o.pool_id LIMIT $3`, tenantID, poolID, page.Fetch(), page.AfterKey().ID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Offer, error) { return scanOffer(r) })
}

// SetQuota replaces, whole, the quota of the offer of pool id to tenantID.
// It reaches any pool (the fleet's operators set quotas); a pool not
// offered to the tenant is NOT_FOUND, an archived one INVALID_STATE.
func SetQuota(ctx context.Context, tx store.Tx, tenantID, id string, quota policy.Quota) (Offer, error) {
	if err := quota.Check(); err != nil {
		return Offer{}, err
	}
	p, err := LoadByID(ctx, tx, id)
	if err != nil {
		return Offer{}, err
	}
	if p.ArchivedAt != nil {
		return Offer{}, core.Errorf(core.CodeInvalidState, "pool %s is archived", p.ID)
	}
	q, err := quotaJSON(quota)
	if err != nil {
		return Offer{}, err
	}
	o, err := scanOffer(tx.QueryRow(ctx, `UPDATE pool_offers SET quota = $3, updated_at = now()
		WHERE pool_id = $1 AND tenant_id = $2 RETURNING `+offerColumns, p.ID, tenantID, q))
	if errors.Is(err, pgx.ErrNoRows) {
		return Offer{}, core.Errorf(core.CodeNotFound, "pool %s is not offered to %s", p.ID, tenantID)
	}
	return o, err
}

// ownAccount checks that a provider pool's account is its tenant's own,
// live one (held against a concurrent delete until the commit): a pool
// naming another tenant's account would spend that tenant's credential.
// Another tenant's account is the NOT_FOUND of a missing one.
func ownAccount(ctx context.Context, tx store.Tx, tenantID, accountID string) error {
	if accountID == "" {
		return nil
	}
	_, err := provideraccounts.ForPool(ctx, tx, tenantID, accountID)
	return err
}
