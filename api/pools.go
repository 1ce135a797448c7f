package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/gpu"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
)

// Pool is a pool as the API returns it. Offer is the viewing tenant's
// offer when the pool is another tenant's, offered to it.
type Pool struct {
	ID                string     `json:"id"`
	TenantID          string     `json:"tenantId"`
	SiteID            string     `json:"siteId"`
	Region            string     `json:"region"`
	Name              string     `json:"name"`
	Class             string     `json:"class"`
	GPUModel          string     `json:"gpuModel"`
	GPUMemoryGb       int        `json:"gpuMemoryGb"`
	Sharing           string     `json:"sharing"`
	Agent             string     `json:"agent"`
	Policy            PoolPolicy `json:"policy"`
	ProviderAccountID string     `json:"providerAccountId,omitempty"`
	CreatedBy         string     `json:"createdBy"`
	CreatedAt         int64      `json:"createdAt"`
	UpdatedAt         int64      `json:"updatedAt"`
	ArchivedAt        *int64     `json:"archivedAt,omitempty"`
	Offer             *PoolOffer `json:"offer,omitempty"`
}

// PoolList is pools.list's answer.
type PoolList struct {
	Items []Pool `json:"items"`
}

// PoolPolicy is a pool's policy. Unknown keys are refused, at every level.
type PoolPolicy struct {
	// Acceptance names the checks a machine passes before it serves.
	Acceptance []string `json:"acceptance,omitempty"`
	// Overcommit is a ratio (≥ 1) per scalar resource, e.g. {"vcpu": 2}.
	Overcommit map[string]float64 `json:"overcommit,omitempty"`
	// LostAfter is how long a silent node stays before it is lost (a Go
	// duration such as "5m").
	LostAfter string `json:"lostAfter,omitempty"`
	// DisruptionBudget is the share of the pool that may be disrupted at
	// once, in [0, 1]; 0.05 when not given.
	DisruptionBudget *float64         `json:"disruptionBudget,omitempty"`
	Admission        *PolicyAdmission `json:"admission,omitempty"`
	// MaxPending bounds the pool's pending requests.
	MaxPending      *int   `json:"maxPending,omitempty"`
	HardwareProfile string `json:"hardwareProfile,omitempty"`
	// Sharing.Replicas is the replica count of timeslice and mps pools.
	Sharing *PolicySharing `json:"sharing,omitempty"`
	// MigLayout is the MIG layout of mig pools.
	MigLayout  string `json:"migLayout,omitempty"`
	TenantRoot bool   `json:"tenantRoot,omitempty"`
}

// PolicyAdmission is a pool policy's admission section.
type PolicyAdmission struct {
	BudgetCheck *bool `json:"budgetCheck,omitempty"`
}

// PolicySharing is a pool policy's sharing section.
type PolicySharing struct {
	Replicas int `json:"replicas"`
}

// DefaultDisruptionBudget is a pool's disruption budget when its policy
// gives none.
const DefaultDisruptionBudget = 0.05

var (
	checkNamePattern    = regexp.MustCompile(`^[a-z][a-z0-9-]{0,63}$`)
	resourceNamePattern = regexp.MustCompile(`^[a-z][A-Za-z0-9]{0,31}$`)
	profilePattern      = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$`)
	migLayoutPattern    = regexp.MustCompile(`^[a-z0-9][a-z0-9.,_+-]{0,63}$`)
)

func badField(field, reason, format string, args ...any) error {
	return core.Errorf(core.CodeInvalidInput, format, args...).WithDetails(map[string]any{"field": field, "reason": reason})
}

// parsePolicy reads and validates a policy for a pool with the given
// sharing, and fills its defaults. raw may be empty (no policy).
func parsePolicy(raw json.RawMessage, sharing string) (PoolPolicy, error) {
	var p PoolPolicy
	if len(bytes.TrimSpace(raw)) > 0 {
		// encoding/json matches names case-insensitively: check them exactly.
		if err := exactKeys(raw, "policy", policyKeys); err != nil {
			return p, err
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
				return p, badField("policy."+strings.Trim(name, `"`), "unknown", "policy has no field %s", name)
			}
			return p, badField("policy", "type", "policy: %v", err)
		}
	}
	if len(p.Acceptance) > 32 {
		return p, badField("policy.acceptance", "maxItems", "policy.acceptance names at most 32 checks")
	}
	for _, c := range p.Acceptance {
		if !checkNamePattern.MatchString(c) {
			return p, badField("policy.acceptance", "pattern", "acceptance check %q must match %s", c, checkNamePattern)
		}
	}
	if len(p.Overcommit) > 32 {
		return p, badField("policy.overcommit", "maxItems", "policy.overcommit has at most 32 resources")
	}
	for r, ratio := range p.Overcommit {
		if !resourceNamePattern.MatchString(r) {
			return p, badField("policy.overcommit", "pattern", "overcommit resource %q must match %s", r, resourceNamePattern)
		}
		if ratio < 1 || ratio > 100 {
			return p, badField("policy.overcommit", "range", "overcommit ratio of %s must be in [1, 100]", r)
		}
	}
	if p.LostAfter != "" {
		d, err := time.ParseDuration(p.LostAfter)
		if err != nil || d < time.Second || d > 7*24*time.Hour {
			return p, badField("policy.lostAfter", "range", "policy.lostAfter must be a duration from 1s to 168h, such as \"5m\"")
		}
	}
	if p.DisruptionBudget == nil {
		b := DefaultDisruptionBudget
		p.DisruptionBudget = &b
	}
	if b := *p.DisruptionBudget; math.IsNaN(b) || b < 0 || b > 1 {
		return p, badField("policy.disruptionBudget", "range", "policy.disruptionBudget must be in [0, 1]")
	}
	if p.MaxPending != nil && (*p.MaxPending < 0 || *p.MaxPending > 1_000_000) {
		return p, badField("policy.maxPending", "range", "policy.maxPending must be in [0, 1000000]")
	}
	if p.HardwareProfile != "" && !profilePattern.MatchString(p.HardwareProfile) {
		return p, badField("policy.hardwareProfile", "pattern", "policy.hardwareProfile must match %s", profilePattern)
	}
	if p.Sharing != nil {
		if sharing != "timeslice" && sharing != "mps" {
			return p, badField("policy.sharing.replicas", "sharing", "policy.sharing.replicas is for timeslice and mps pools, not %s", sharing)
		}
		if p.Sharing.Replicas < 2 || p.Sharing.Replicas > 64 {
			return p, badField("policy.sharing.replicas", "range", "policy.sharing.replicas must be in [2, 64]")
		}
	}
	if p.MigLayout != "" {
		if sharing != "mig" {
			return p, badField("policy.migLayout", "sharing", "policy.migLayout is for mig pools, not %s", sharing)
		}
		if !migLayoutPattern.MatchString(p.MigLayout) {
			return p, badField("policy.migLayout", "pattern", "policy.migLayout must match %s", migLayoutPattern)
		}
	}
	return p, nil
}

// policyKeys are a policy's keys, and those of its sections.
var policyKeys = map[string]map[string]bool{
	"policy": {"acceptance": true, "overcommit": true, "lostAfter": true, "disruptionBudget": true, "admission": true,
		"maxPending": true, "hardwareProfile": true, "sharing": true, "migLayout": true, "tenantRoot": true},
	"policy.admission": {"budgetCheck": true},
	"policy.sharing":   {"replicas": true},
}

// exactKeys refuses an object key at path (or in its sections) that keys
// does not name exactly. A value that is not an object is left to Decode.
func exactKeys(raw json.RawMessage, path string, keys map[string]map[string]bool) error {
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil {
		return nil
	}
	for k, v := range obj {
		if !keys[path][k] {
			return badField(path+"."+k, "unknown", "%s has no field %q", path, k)
		}
		if _, section := keys[path+"."+k]; section {
			if err := exactKeys(v, path+"."+k, keys); err != nil {
				return err
			}
		}
	}
	return nil
}

// PoolOffer is a pool_offers row: the pool in TenantID's view, with its quota.
type PoolOffer struct {
	PoolID             string           `json:"poolId"`
	TenantID           string           `json:"tenantId"` // the receiving tenant
	Quota              map[string]int64 `json:"quota"`
	Priority           *int             `json:"priority,omitempty"`
	IncludeDescendants bool             `json:"includeDescendants"`
	CreatedBy          string           `json:"createdBy"`
	CreatedAt          int64            `json:"createdAt"`
	UpdatedAt          int64            `json:"updatedAt"`
}

// maxQuota bounds one resource's quota.
const maxQuota = 1 << 40

// parseQuota reads a quota: resource name → integer ≥ 0. A resource the
// quota does not name grants zero.
func parseQuota(raw json.RawMessage) (map[string]int64, error) {
	q := map[string]int64{}
	if len(bytes.TrimSpace(raw)) == 0 {
		return q, nil
	}
	var in map[string]json.RawMessage
	if err := json.Unmarshal(raw, &in); err != nil {
		return nil, badField("quota", "type", "quota maps resources to integers")
	}
	if len(in) > 32 {
		return nil, badField("quota", "maxItems", "quota names at most 32 resources")
	}
	for r, n := range in {
		if !resourceNamePattern.MatchString(r) {
			return nil, badField("quota."+r, "pattern", "quota resource %q must match %s", r, resourceNamePattern)
		}
		v, err := json.Number(n).Int64() // a JSON string is no number here
		if err != nil || n[0] == '"' || v < 0 || v > maxQuota {
			return nil, badField("quota."+r, "range", "quota of %s must be an integer in [0, %d]", r, int64(maxQuota))
		}
		q[r] = v
	}
	return q, nil
}

// poolSelect reads pools with their site's region and the offer to the
// viewing tenant ($1), if any.
const poolSelect = `SELECT p.id, p.tenant_id, p.site_id, s.region, p.name, p.class, p.gpu_model, p.gpu_memory_gb,
	p.sharing, p.agent, p.policy, coalesce(p.provider_account_id, ''), p.created_by, p.created_at, p.updated_at, p.archived_at,
	o.pool_id, o.tenant_id, o.quota, o.priority, o.include_descendants, o.created_by, o.created_at, o.updated_at
	FROM pools p JOIN sites s ON s.id = p.site_id
	LEFT JOIN pool_offers o ON o.pool_id = p.id AND o.tenant_id = $1`

func scanPool(row pgx.Row) (Pool, error) {
	var p Pool
	var policy []byte
	var created, updated time.Time
	var archived *time.Time
	var oPool, oTenant, oBy *string
	var oQuota []byte
	var oPriority *int32
	var oDesc *bool
	var oCreated, oUpdated *time.Time
	err := row.Scan(&p.ID, &p.TenantID, &p.SiteID, &p.Region, &p.Name, &p.Class, &p.GPUModel, &p.GPUMemoryGb,
		&p.Sharing, &p.Agent, &policy, &p.ProviderAccountID, &p.CreatedBy, &created, &updated, &archived,
		&oPool, &oTenant, &oQuota, &oPriority, &oDesc, &oBy, &oCreated, &oUpdated)
	if err != nil {
		return Pool{}, err
	}
	if err := json.Unmarshal(policy, &p.Policy); err != nil {
		return Pool{}, fmt.Errorf("pool %s: policy: %w", p.ID, err)
	}
	p.CreatedAt, p.UpdatedAt, p.ArchivedAt = created.UnixMilli(), updated.UnixMilli(), msPtr(archived)
	if oPool != nil {
		o := PoolOffer{PoolID: *oPool, TenantID: *oTenant, IncludeDescendants: *oDesc, CreatedBy: *oBy,
			CreatedAt: oCreated.UnixMilli(), UpdatedAt: oUpdated.UnixMilli()}
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

const offerColumns = `pool_id, tenant_id, quota, priority, include_descendants, created_by, created_at, updated_at`

func scanOffer(row pgx.Row) (PoolOffer, error) {
	var o PoolOffer
	var quota []byte
	var priority *int32
	var created, updated time.Time
	if err := row.Scan(&o.PoolID, &o.TenantID, &quota, &priority, &o.IncludeDescendants, &o.CreatedBy, &created, &updated); err != nil {
		return PoolOffer{}, err
	}
	if err := json.Unmarshal(quota, &o.Quota); err != nil {
		return PoolOffer{}, err
	}
	if priority != nil {
		v := int(*priority)
		o.Priority = &v
	}
	o.CreatedAt, o.UpdatedAt = created.UnixMilli(), updated.UnixMilli()
	return o, nil
}

func (s *Server) poolResource(id string) iam.Resource {
	return iam.Resource{Type: s.catalog.FullName("pool"), ID: id}
}

// putPoolAuthz writes the pool's projection row, shared with every tenant
// it is offered to, in the transaction that changed the pool or its offers.
func (s *Server) putPoolAuthz(ctx context.Context, tx store.Tx, p Pool) error {
	shared, err := collectStrings(tx.Query(ctx, `SELECT tenant_id FROM pool_offers WHERE pool_id = $1`, p.ID))
	if err != nil {
		return err
	}
	return store.PutAuthzResource(ctx, tx, store.AuthzResource{
		Type: s.catalog.FullName("pool"), ID: p.ID, TenantID: p.TenantID, SharedWith: shared,
		Attributes: map[string]any{"region": p.Region, "class": p.Class, "gpuModel": p.GPUModel,
			"gpuMemoryGb": p.GPUMemoryGb, "sharing": p.Sharing},
	})
}

func poolNotFound(id string) error { return core.Errorf(core.CodeNotFound, "pool %s not found", id) }

// loadPool reads a pool the tenant owns, locked for a change; any other
// (another tenant's, even offered to this one) is NOT_FOUND.
func (s *Server) loadPool(ctx context.Context, tx store.Tx, tenantID, id string) (Pool, error) {
	p, err := scanPool(tx.QueryRow(ctx, poolSelect+` WHERE p.tenant_id = $1 AND p.id = $2 FOR UPDATE OF p`, tenantID, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Pool{}, poolNotFound(id)
	}
	return p, err
}

// livePool is loadPool for a change: an archived pool is INVALID_STATE.
func (s *Server) livePool(ctx context.Context, tx store.Tx, tenantID, id string) (Pool, error) {
	p, err := s.loadPool(ctx, tx, tenantID, id)
	if err == nil && p.ArchivedAt != nil {
		err = core.Errorf(core.CodeInvalidState, "pool %s is archived", id)
	}
	return p, err
}

// loadPoolByID reads any pool (the fleet's view), locked.
func (s *Server) loadPoolByID(ctx context.Context, tx store.Tx, id string) (Pool, error) {
	p, err := scanPool(tx.QueryRow(ctx, poolSelect+` WHERE p.id = $2 FOR UPDATE OF p`, "", id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Pool{}, poolNotFound(id)
	}
	return p, err
}

// viewPool reads a pool in the tenant's view: its own, or one offered to it.
func (s *Server) viewPool(ctx context.Context, tx store.Tx, tenantID, id string) (Pool, error) {
	p, err := scanPool(tx.QueryRow(ctx, poolSelect+` WHERE p.id = $2 AND (p.tenant_id = $1 OR o.tenant_id IS NOT NULL)`, tenantID, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Pool{}, poolNotFound(id)
	}
	return p, err
}

func (s *Server) poolsCreate(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		SiteID            string          `json:"siteId"`
		Name              string          `json:"name"`
		Class             string          `json:"class"`
		GPUModel          string          `json:"gpuModel"`
		GPUMemoryGb       int             `json:"gpuMemoryGb"`
		Sharing           string          `json:"sharing"`
		Agent             string          `json:"agent"`
		Policy            json.RawMessage `json:"policy"`
		ProviderAccountID string          `json:"providerAccountId"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	if in.Sharing == "" {
		in.Sharing = "exclusive"
	}
	if in.Agent == "" {
		in.Agent = "bcd"
		if in.Class == "provider" {
			in.Agent = "none"
		}
	}
	if err := checkPoolFields(in.Class, in.GPUMemoryGb, in.ProviderAccountID); err != nil {
		return nil, err
	}
	if !slices.Contains(gpu.Default().Families(), in.GPUModel) {
		return nil, core.Errorf(core.CodeInvalidInput, "gpuModel %q is not a GPU model family of the catalog", in.GPUModel).
			WithDetails(map[string]any{"field": "gpuModel", "reason": "enum"})
	}
	policy, err := parsePolicy(in.Policy, in.Sharing)
	if err != nil {
		return nil, err
	}
	// The site must be the tenant's own, live site.
	if _, err := s.liveSite(ctx, tx, c.TenantID, in.SiteID); err != nil {
		return nil, err
	}
	policyJSON, err := json.Marshal(policy)
	if err != nil {
		return nil, err
	}
	id := core.NewID("pool")
	_, err = tx.Exec(ctx, `INSERT INTO pools (id, tenant_id, site_id, name, class, gpu_model, gpu_memory_gb, sharing, agent,
		policy, provider_account_id, created_by) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,NULLIF($11,''),$12)`,
		id, c.TenantID, in.SiteID, in.Name, in.Class, in.GPUModel, in.GPUMemoryGb, in.Sharing, in.Agent,
		string(policyJSON), in.ProviderAccountID, c.Caller.IdentityID)
	if isUniqueViolation(err) {
		return nil, core.Errorf(core.CodeConflict, "a pool named %q exists in this tenant", in.Name).WithDetails(map[string]any{"field": "name"})
	}
	if err != nil {
		return nil, err
	}
	p, err := s.loadPool(ctx, tx, c.TenantID, id)
	if err != nil {
		return nil, err
	}
	return p, s.putPoolAuthz(ctx, tx, p)
}

// checkPoolFields checks what the schema cannot: gpuMemoryGb's range, and
// that providerAccountId is given for provider pools and only for them.
func checkPoolFields(class string, gpuMemoryGb int, providerAccountID string) error {
	if gpuMemoryGb < 1 || gpuMemoryGb > 4096 {
		return badField("gpuMemoryGb", "range", "gpuMemoryGb must be in [1, 4096]")
	}
	switch {
	case class == "provider" && providerAccountID == "":
		return badField("providerAccountId", "required", "a provider pool needs providerAccountId")
	case class != "provider" && providerAccountID != "":
		return badField("providerAccountId", "class", "providerAccountId is for provider pools only, not %s", class)
	}
	return nil
}

func (s *Server) poolsGet(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		PoolID string `json:"poolId"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	return s.viewPool(ctx, tx, c.TenantID, in.PoolID)
}

// poolsList answers the tenant's live pools and the live pools offered to
// it, of which the projection holds a row in the tenant's view.
func (s *Server) poolsList(ctx context.Context, c *Call, tx store.Tx) (rpc.Page, error) {
	var in struct {
		SiteID string `json:"siteId"`
		Class  string `json:"class"`
	}
	if err := decode(c.Input, &in); err != nil {
		return rpc.Page{}, err
	}
	rows, err := tx.Query(ctx, poolSelect+`
		WHERE p.archived_at IS NULL AND (p.tenant_id = $1 OR o.tenant_id IS NOT NULL)
		  AND ($2 = '' OR p.site_id = $2) AND ($3 = '' OR p.class = $3)
		  AND EXISTS (SELECT 1 FROM authz_resources a WHERE a.type = $4 AND a.id = p.id
		              AND (a.tenant_id = $1 OR $1 = ANY (a.shared_with)))
		ORDER BY p.created_at, p.id LIMIT $5`, c.TenantID, in.SiteID, in.Class, s.catalog.FullName("pool"), listLimit)
	if err != nil {
		return rpc.Page{}, err
	}
	pools, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Pool, error) { return scanPool(r) })
	if err != nil {
		return rpc.Page{}, err
	}
	return rpc.PageOf(pools, func(x Pool) iam.Resource { return s.poolResource(x.ID) },
		func(kept []Pool) any { return PoolList{Items: kept} }), nil
}

// poolsUpdate changes a pool's name, gpuMemoryGb, sharing, agent, policy
// (replaced whole) or providerAccountId. Its site, class and gpuModel never
// change. The policy, new or kept, is checked against the resulting sharing.
func (s *Server) poolsUpdate(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		PoolID            string          `json:"poolId"`
		Name              *string         `json:"name"`
		GPUMemoryGb       *int            `json:"gpuMemoryGb"`
		Sharing           *string         `json:"sharing"`
		Agent             *string         `json:"agent"`
		Policy            json.RawMessage `json:"policy"`
		ProviderAccountID *string         `json:"providerAccountId"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	p, err := s.livePool(ctx, tx, c.TenantID, in.PoolID)
	if err != nil {
		return nil, err
	}
	set := func(dst *string, v *string) {
		if v != nil {
			*dst = *v
		}
	}
	set(&p.Name, in.Name)
	set(&p.Sharing, in.Sharing)
	set(&p.Agent, in.Agent)
	set(&p.ProviderAccountID, in.ProviderAccountID)
	if in.GPUMemoryGb != nil {
		p.GPUMemoryGb = *in.GPUMemoryGb
	}
	if err := checkPoolFields(p.Class, p.GPUMemoryGb, p.ProviderAccountID); err != nil {
		return nil, err
	}
	rawPolicy := in.Policy
	if len(rawPolicy) == 0 {
		if rawPolicy, err = json.Marshal(p.Policy); err != nil {
			return nil, err
		}
	}
	if p.Policy, err = parsePolicy(rawPolicy, p.Sharing); err != nil {
		return nil, err
	}
	policyJSON, err := json.Marshal(p.Policy)
	if err != nil {
		return nil, err
	}
	_, err = tx.Exec(ctx, `UPDATE pools SET name = $2, gpu_memory_gb = $3, sharing = $4, agent = $5, policy = $6,
		provider_account_id = NULLIF($7, ''), updated_at = now() WHERE id = $1`,
		p.ID, p.Name, p.GPUMemoryGb, p.Sharing, p.Agent, string(policyJSON), p.ProviderAccountID)
	if isUniqueViolation(err) {
		return nil, core.Errorf(core.CodeConflict, "a pool named %q exists in this tenant", p.Name).WithDetails(map[string]any{"field": "name"})
	}
	if err != nil {
		return nil, err
	}
	if p, err = s.loadPool(ctx, tx, c.TenantID, p.ID); err != nil {
		return nil, err
	}
	return p, s.putPoolAuthz(ctx, tx, p)
}

// poolsArchive archives a pool: it leaves every list (its own tenant's and
// those it is offered to) and refuses changes; get still answers it.
func (s *Server) poolsArchive(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		PoolID string `json:"poolId"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	p, err := s.livePool(ctx, tx, c.TenantID, in.PoolID)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, `UPDATE pools SET archived_at = now(), updated_at = now() WHERE id = $1`, p.ID); err != nil {
		return nil, err
	}
	return s.loadPool(ctx, tx, c.TenantID, p.ID)
}

// poolsOffer offers the tenant's pool to another tenant, or replaces the
// offer's quota, priority and includeDescendants; the receiving tenant is
// added to the pool's projection row in the same transaction.
func (s *Server) poolsOffer(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		PoolID             string          `json:"poolId"`
		ToTenantID         string          `json:"toTenantId"`
		Quota              json.RawMessage `json:"quota"`
		Priority           *int            `json:"priority"`
		IncludeDescendants bool            `json:"includeDescendants"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	if in.ToTenantID == c.TenantID {
		return nil, badField("toTenantId", "self", "a pool is not offered to its own tenant")
	}
	if in.Priority != nil && (*in.Priority < -1_000_000 || *in.Priority > 1_000_000) {
		return nil, badField("priority", "range", "priority must be in [-1000000, 1000000]")
	}
	quota, err := parseQuota(in.Quota)
	if err != nil {
		return nil, err
	}
	p, err := s.livePool(ctx, tx, c.TenantID, in.PoolID)
	if err != nil {
		return nil, err
	}
	quotaJSON, err := json.Marshal(quota)
	if err != nil {
		return nil, err
	}
	o, err := scanOffer(tx.QueryRow(ctx, `INSERT INTO pool_offers AS o (pool_id, tenant_id, quota, priority, include_descendants, created_by)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (pool_id, tenant_id) DO UPDATE SET quota = EXCLUDED.quota, priority = EXCLUDED.priority,
			include_descendants = EXCLUDED.include_descendants, updated_at = now()
		RETURNING `+offerColumns, p.ID, in.ToTenantID, string(quotaJSON), in.Priority, in.IncludeDescendants, c.Caller.IdentityID))
	if err != nil {
		return nil, err
	}
	return o, s.putPoolAuthz(ctx, tx, p)
}

// poolsUnoffer withdraws an offer; the pool leaves the receiving tenant's
// view (its projection row) in the same transaction.
func (s *Server) poolsUnoffer(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		PoolID     string `json:"poolId"`
		ToTenantID string `json:"toTenantId"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	p, err := s.loadPool(ctx, tx, c.TenantID, in.PoolID)
	if err != nil {
		return nil, err
	}
	o, err := scanOffer(tx.QueryRow(ctx, `DELETE FROM pool_offers WHERE pool_id = $1 AND tenant_id = $2 RETURNING `+offerColumns, p.ID, in.ToTenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, core.Errorf(core.CodeNotFound, "pool %s is not offered to %s", p.ID, in.ToTenantID)
	}
	if err != nil {
		return nil, err
	}
	return o, s.putPoolAuthz(ctx, tx, p)
}
