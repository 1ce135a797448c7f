package iam

// The Cedar entity model of the embedded IAM. Policies (iam_policies, the
// examples in iam/policies) are written against it.
//
// Entity types:
//
//	Identity::"<identityId>"   the principal
//	Group::"<name>"            a group an identity is in (its Cedar parents)
//	Action::"<action>"         the action, e.g. Action::"compute:pools:read"
//	Resource::"<type>/<id>"    the resource, e.g. Resource::"compute-pool/pool_…"
//
// Principal: Identity::"<identityId>", with attributes
//
//	id            String   the identity id
//	tenantId      String   the caller's tenant
//	kind          String   "person", "service" or "agent"
//	rootAuthority Boolean
//
// and the groups the identity is in (Admin.CreateIdentity / SetIdentityGroups,
// read fresh at every decision) as its parents, so `principal in
// Group::"auditors"` holds for a member of "auditors".
//
// Action: Action::"<name>", the catalog action's name as the entity id. Every
// catalog action compute:<area>:<verb> also is `in` three action groups, so a
// policy can name many actions at once:
//
//	Action::"compute:*:<verb>"   e.g. every read action: Action::"compute:*:read"
//	Action::"compute:<area>:*"   e.g. every pools action: Action::"compute:pools:*"
//	Action::"compute:*"          every compute action
//
// (<area> is everything between "compute:" and the last segment, so a
// plugin's compute:acme-autoinstall:render is in Action::"compute:*:render"
// and Action::"compute:acme-autoinstall:*".)
//
// Resource: one entity type, Resource, because Cedar identifiers cannot
// contain '-'; its id is "<prefixed type>/<id>". Attributes:
//
//	type       String   the prefixed type, e.g. "compute-reservation"
//	id         String   the resource id
//	tenantId   String   the tenant the resolver answered for (the decision's)
//	ownerId    String   only when the row has an owner
//	parentType String   only when the type has a parent (e.g. "compute-pool")
//	parentId   String   only with parentType
//	relations, parentRelations  Set<String>, the same sets as in the context
//	                    (the spec calls them resource.parentRelations)
//	<declared> each attribute the catalog declares for the type, at the top
//	           level (resource.gpuCount); attributes the resolver returns that
//	           the type does not declare are dropped, and a declared attribute
//	           whose name is one of the above is dropped too (the implicit one
//	           wins).
//
// The resource's Cedar parent is its parent resource, so `resource in
// Resource::"compute-pool/pool_…"` holds for a reservation in that pool.
//
// Optional attributes are absent, never null or a default: a declared
// attribute the resolver leaves out (or sets to nil) is not on the entity,
// and so are ownerId and parentType/parentId when there is none. Test them
// with `has` before use (`resource has gpuModel && resource.gpuModel ==
// "H100"`). Reading an absent attribute is an evaluation error, and Cedar
// skips a policy whose evaluation errs: a permit then does not apply (deny),
// but neither does a forbid, so write forbids with `unless { resource has x
// && … }` (see iam/policies).
//
// Types: a declared "string" is a Cedar String, "boolean" a Boolean and
// "number" a Long. A number that is not an integer is rounded up to the
// next integer (ceil), so an "at most" bound still holds: 72.5 hours is 73
// for `resource.durationHours <= 72`. Resolvers should pass whole units
// (durationHours as integer hours). A declared attribute whose value does
// not fit its declared type (a string for a number, NaN or ±Inf, a
// fractional number beyond ±2^53, an unsigned beyond the Long range) denies
// the decision with RESOLVE_FAILED: a resolver defect fails closed. Types of another host (no catalog prefix) have no declared
// attributes: every attribute the host's resolver returns is passed on,
// typed by its Go value (see cedarValue).
//
// Context:
//
//	sessionKind      String        "user", "service" or "agent"
//	mfa              Boolean
//	relations        Set<String>   the caller's relations on the resource
//	parentRelations  Set<String>   the caller's relations on its parent
//	sourceIp         ipaddr        only from the verified Credential.SourceIP;
//	                               absent when it is empty or not an address
//	<key>            every entry of Request.Context, converted by cedarValue,
//	                 except the five keys above, which it cannot override.

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"sync"

	cedar "github.com/cedar-policy/cedar-go"
	"github.com/cedar-policy/cedar-go/types"

	"github.com/better-compute/better-compute/core"
)

// Cedar entity type names of the model above.
const (
	CedarPrincipalType = "Identity"
	CedarGroupType     = "Group"
	CedarActionType    = "Action"
	CedarResourceType  = "Resource"
)

// Largest integer a JSON number (float64) carries exactly.
const cedarMaxExactInt = 1 << 53

// cedarReservedResourceAttr reports the names a declared attribute may not
// take: the implicit resource attributes.
func cedarReservedResourceAttr(name string) bool {
	switch name {
	case "type", "id", "tenantId", "ownerId", "parentType", "parentId", "relations", "parentRelations":
		return true
	}
	return false
}

// cedarReservedContextKey reports the context keys the IAM sets itself;
// Request.Context cannot override them.
func cedarReservedContextKey(key string) bool {
	switch key {
	case "sessionKind", "mfa", "relations", "parentRelations", "sourceIp":
		return true
	}
	return false
}

// cedarResourceUID is the entity id of a resource: Resource::"<type>/<id>".
func cedarResourceUID(typ, id string) types.EntityUID {
	return types.NewEntityUID(CedarResourceType, types.String(typ+"/"+id))
}

// ParsePolicies parses a Cedar policy document (one or more statements).
// An empty document or a syntax error is INVALID_INPUT with
// details.field "cedar".
func ParsePolicies(name, text string) (cedar.PolicyList, error) {
	list, err := cedar.NewPolicyListFromBytes(name, []byte(text))
	if err != nil {
		return nil, core.Errorf(core.CodeInvalidInput, "the policy does not parse: %v", err).
			WithDetails(map[string]any{"field": "cedar"})
	}
	if len(list) == 0 {
		return nil, core.Errorf(core.CodeInvalidInput, "the policy holds no statement").
			WithDetails(map[string]any{"field": "cedar"})
	}
	return list, nil
}

// cedarActionEntities builds the Action entities of every catalog action
// with their groups as parents (see the model above).
func cedarActionEntities(cat *core.Catalog) map[types.EntityUID]types.Entity {
	out := map[types.EntityUID]types.Entity{}
	for _, a := range cat.Actions() {
		uid := types.NewEntityUID(CedarActionType, types.String(a.Name))
		out[uid] = types.Entity{UID: uid, Parents: types.NewEntityUIDSet(cedarActionGroups(a.Name)...)}
	}
	return out
}

// cedarActionGroups are the action groups an action is in.
func cedarActionGroups(action string) []types.EntityUID {
	rest, ok := strings.CutPrefix(action, "compute:")
	i := strings.LastIndexByte(rest, ':')
	if !ok || i <= 0 {
		return nil
	}
	area, verb := rest[:i], rest[i+1:]
	return []types.EntityUID{
		types.NewEntityUID(CedarActionType, types.String("compute:*:"+verb)),
		types.NewEntityUID(CedarActionType, types.String("compute:"+area+":*")),
		types.NewEntityUID(CedarActionType, "compute:*"),
	}
}

// cedarEntities is the EntityGetter of one decision: the principal, the
// resource and the (shared, immutable) action entities.
type cedarEntities struct {
	principal types.Entity
	resource  types.Entity
	actions   map[types.EntityUID]types.Entity
}

func (e *cedarEntities) Get(uid types.EntityUID) (types.Entity, bool) {
	switch uid {
	case e.principal.UID:
		return e.principal, true
	case e.resource.UID:
		return e.resource, true
	}
	ent, ok := e.actions[uid]
	return ent, ok
}

// cedarStringSet turns relation names into a Set<String>.
func cedarStringSet(ss []string) types.Set {
	vals := make([]types.Value, len(ss))
	for i, s := range ss {
		vals[i] = types.String(s)
	}
	return types.NewSet(vals...)
}

// cedarNumber converts a Go number to a Long, rounding a fraction up.
func cedarNumber(v any) (types.Long, bool) {
	var f float64
	switch n := v.(type) {
	case int:
		return types.Long(n), true
	case int8:
		return types.Long(n), true
	case int16:
		return types.Long(n), true
	case int32:
		return types.Long(n), true
	case int64:
		return types.Long(n), true
	case uint8:
		return types.Long(n), true
	case uint16:
		return types.Long(n), true
	case uint32:
		return types.Long(n), true
	case uint:
		if uint64(n) > math.MaxInt64 {
			return 0, false
		}
		return types.Long(n), true
	case uint64:
		if n > math.MaxInt64 {
			return 0, false
		}
		return types.Long(n), true
	case types.Long:
		return n, true
	case json.Number:
		if i, err := n.Int64(); err == nil {
			return types.Long(i), true
		}
		x, err := n.Float64()
		if err != nil {
			return 0, false
		}
		f = x
	case float32:
		f = float64(n)
	case float64:
		f = n
	default:
		return 0, false
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	f = math.Ceil(f)
	if f > cedarMaxExactInt || f < -cedarMaxExactInt {
		return 0, false
	}
	return types.Long(int64(f)), true
}

// cedarDeclared converts a declared attribute's value to its declared type.
func cedarDeclared(t core.AttrType, v any) (types.Value, bool) {
	switch t {
	case core.AttrString:
		switch s := v.(type) {
		case string:
			return types.String(s), true
		case types.String:
			return s, true
		}
	case core.AttrBoolean:
		switch b := v.(type) {
		case bool:
			return types.Boolean(b), true
		case types.Boolean:
			return b, true
		}
	case core.AttrNumber:
		if n, ok := cedarNumber(v); ok {
			return n, true
		}
	}
	return nil, false
}

// cedarValue converts a Go value of Request.Context (or of a host type's
// attributes) to a Cedar value: strings, booleans, numbers (Long, fractions
// rounded up), slices and arrays (Set), maps with string keys (Record), and
// Cedar values as they are. A nil in a map or slice is left out. Anything
// else is an error.
func cedarValue(v any) (types.Value, error) {
	switch x := v.(type) {
	case types.Value:
		return x, nil
	case string:
		return types.String(x), nil
	case bool:
		return types.Boolean(x), nil
	case []string:
		return cedarStringSet(x), nil
	case map[string]any:
		rec, err := cedarRecord(x, nil)
		return rec, err
	}
	if n, ok := cedarNumber(v); ok {
		return n, nil
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Slice, reflect.Array:
		vals := make([]types.Value, 0, rv.Len())
		for i := range rv.Len() {
			e := rv.Index(i).Interface()
			if e == nil {
				continue
			}
			cv, err := cedarValue(e)
			if err != nil {
				return nil, err
			}
			vals = append(vals, cv)
		}
		return types.NewSet(vals...), nil
	case reflect.Map:
		if rv.Type().Key().Kind() != reflect.String {
			break
		}
		m := make(map[string]any, rv.Len())
		for it := rv.MapRange(); it.Next(); {
			m[it.Key().String()] = it.Value().Interface()
		}
		rec, err := cedarRecord(m, nil)
		return rec, err
	}
	return nil, fmt.Errorf("a %T has no Cedar form", v)
}

// cedarRecord converts a map to a Record, leaving out nils and the keys
// skip reports (skip may be nil).
func cedarRecord(m map[string]any, skip func(string) bool) (types.Record, error) {
	rm := make(types.RecordMap, len(m))
	for k, v := range m {
		if v == nil || (skip != nil && skip(k)) {
			continue
		}
		cv, err := cedarValue(v)
		if err != nil {
			return types.Record{}, fmt.Errorf("%s: %w", k, err)
		}
		rm[types.String(k)] = cv
	}
	return types.NewRecord(rm), nil
}

// cedarSourceIP parses the verified source address; false when there is none.
func cedarSourceIP(s string) (types.IPAddr, bool) {
	if s == "" {
		return types.IPAddr{}, false
	}
	ip, err := types.ParseIPAddr(s)
	if err != nil {
		return types.IPAddr{}, false
	}
	return ip, true
}

// cedarPolicySets caches each tenant's parsed PolicySet, keyed by the
// tenant's policy_version: every decision reads the version from the
// database with its relations, so a change made by any process is seen at
// the next decision. It lives in an Embedded, never at package level.
type cedarPolicySets struct {
	mu   sync.RWMutex
	sets map[string]*cedarTenantPolicies
}

// cedarTenantPolicies is one tenant's parsed policies at one version.
type cedarTenantPolicies struct {
	version int64
	set     *cedar.PolicySet
}

func (c *cedarPolicySets) get(tenantID string, version int64) (*cedarTenantPolicies, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	p, ok := c.sets[tenantID]
	if !ok || p.version < version {
		return nil, false
	}
	return p, true
}

// put keeps the newer of what is cached and p.
func (c *cedarPolicySets) put(tenantID string, p *cedarTenantPolicies) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sets == nil {
		c.sets = map[string]*cedarTenantPolicies{}
	}
	if old, ok := c.sets[tenantID]; ok && old.version > p.version {
		return
	}
	c.sets[tenantID] = p
}

// cedarPolicySetOf builds a PolicySet from a tenant's stored policies (name,
// text) in name order. Policy ids are "<name>#<n>", n counting the
// document's statements from 0. A stored policy that no longer parses is an
// error (the tenant's decisions fail, closed), never skipped: skipping a
// forbid would widen access.
func cedarPolicySetOf(docs [][2]string) (*cedar.PolicySet, error) {
	set := cedar.NewPolicySet()
	slices.SortFunc(docs, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	for _, d := range docs {
		list, err := ParsePolicies(d[0], d[1])
		if err != nil {
			return nil, fmt.Errorf("stored policy %q: %w", d[0], err)
		}
		for i, p := range list {
			set.Add(cedar.PolicyID(fmt.Sprintf("%s#%d", d[0], i)), p)
		}
	}
	return set, nil
}
