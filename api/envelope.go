package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"time"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
)

// The call envelope: the same eight steps for every method, over HTTP, in
// process (Server.Call) and through the typed client.
//
//  1. Public methods validate their input and run.
//  2. No credential: UNAUTHENTICATED, with no IAM call.
//  3. The input is validated (INVALID_INPUT) before any IAM call.
//  4. Authenticate (the port caches it for 30 s).
//  5. The tenant pre-check: a caller of another tenant (not root) is
//     ACCESS_DENIED before any database access or IAM decision; a root
//     caller naming a tenant IAM does not know is NOT_FOUND.
//  6. Admissions prepare their draft in a first transaction and decide on it.
//  7. Other mutations: one Require, never cached. Reads: one Authorize
//     (allows cached for 10 s per session).
//  8. The handler runs in one transaction (read-only for reads); an allowed
//     mutation writes its audit_events row in that transaction.
//
// IAM is never called inside a transaction.

// Call is one method call in flight, as handlers see it.
type Call = rpc.Call

// Call runs method name ("group.method") with a JSON input.
func (s *Server) Call(ctx context.Context, cred iam.Credential, name string, input json.RawMessage) (out any, err error) {
	start := time.Now()
	var c *Call
	defer func() { s.observeCall(ctx, name, c, err, time.Since(start)) }()
	m, ok := s.registry.Get(name)
	if !ok {
		return nil, core.Errorf(core.CodeNotFound, "no method %q", name)
	}
	if len(bytes.TrimSpace(input)) == 0 {
		input = json.RawMessage("{}")
	}
	c = &Call{Method: m, Cred: cred, Input: input}
	h, served := s.handlers[name]

	if m.Public { // step 1
		if _, err := s.validate(c, h); err != nil {
			return nil, err
		}
		return h.Direct(ctx, c)
	}
	if !cred.Present() { // step 2
		return nil, core.Errorf(core.CodeUnauthn, "a credential is required")
	}
	fields, err := s.validate(c, h) // step 3
	if err != nil {
		return nil, err
	}
	if c.TenantID, err = tenantOf(fields); err != nil {
		return nil, err
	}
	if c.Caller, err = s.authenticate(ctx, cred); err != nil { // step 4
		return nil, err
	}
	if c.Caller.TenantID != c.TenantID && c.Caller.TenantID != s.rootTenant { // step 5
		return nil, denied()
	}
	c.Override = c.Caller.TenantID != c.TenantID
	if c.Override {
		if err := s.knownTenant(ctx, c); err != nil {
			return nil, err
		}
	}
	if !served {
		return nil, core.Errorf(core.CodeUnsupported, "%s is planned for %s", name, phaseOf(m)).
			WithDetails(map[string]any{"reason": "planned", "phase": phaseOf(m)})
	}
	if h.Admission != nil { // step 6
		if c.Method.Kind != core.KindAdmission {
			return nil, core.Errorf(core.CodeInternal, "%s is not an admission", name)
		}
		return s.admit(ctx, c, h.Admission)
	}
	if err := s.decide(ctx, c, fields); err != nil { // step 7
		return nil, err
	}
	if err := s.requireAlso(ctx, c, h); err != nil {
		return nil, err
	}
	switch { // step 8
	case h.Direct != nil:
		return h.Direct(ctx, c)
	case h.List != nil:
		if c.Scope, err = scopeOf(c.Method, c.Input); err != nil {
			return nil, err
		}
		return s.runList(ctx, c, h)
	case m.Kind.Mutates():
		err = s.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
			if out, err = h.Run(ctx, c, tx); err != nil {
				return err
			}
			return writeAudit(ctx, tx, c)
		})
		if err == nil && h.Refresh {
			s.refreshAfterCommit(ctx, c)
		}
		if err == nil && h.After != nil {
			return h.After(ctx, c, out)
		}
		return out, err
	case h.Read != nil:
		var answer func() (any, error)
		if err := s.store.Read(ctx, func(b *store.Batch) { answer = h.Read(c, b) }); err != nil {
			return nil, err
		}
		return answer()
	default:
		err = s.store.InTx(ctx, store.ReadOnly, func(tx store.Tx) error {
			out, err = h.Run(ctx, c, tx)
			return err
		})
		return out, err
	}
}

// validate checks the input against the method's schema, then decodes it
// into the method's input type for the handler. It answers the input's
// top-level fields as the schema's validator read them, so the envelope
// reads the tenant and the decided-on id without parsing the input again.
func (s *Server) validate(c *Call, h *rpc.Handler) (map[string]any, error) {
	fields, verr := c.Method.Schema.ValidateObject(c.Input)
	if verr != nil {
		return nil, verr
	}
	if h == nil || h.Decode == nil {
		return fields, nil
	}
	in, err := h.Decode(c.Input)
	if err != nil {
		return nil, err
	}
	c.SetInput(in)
	return fields, nil
}

func phaseOf(m core.Method) string {
	if m.Phase == "" {
		return "unscheduled"
	}
	return m.Phase
}

func denied() error { return core.Errorf(core.CodeAccessDenied, "access denied") }

// knownTenant refuses a call into a tenant IAM does not know, before any
// decision or database access, so that no row is written in it: NOT_FOUND
// for a caller with root authority (who may act in every tenant), and for
// any other root-tenant caller the ACCESS_DENIED a known tenant would give
// it, so only root learns which tenants exist.
func (s *Server) knownTenant(ctx context.Context, c *Call) error {
	known, err := s.iam.TenantKnown(ctx, c.Caller, c.TenantID)
	switch {
	case err != nil:
		return err
	case known:
		return nil
	case c.Caller.RootAuthority:
		return core.Errorf(core.CodeNotFound, "tenant %q not found", c.TenantID).
			WithDetails(map[string]any{"field": "tenantId"})
	default:
		return denied()
	}
}

// tenantOf reads the input's tenantId (the schema has already checked it).
func tenantOf(fields map[string]any) (string, error) {
	if id, _ := fields["tenantId"].(string); id != "" {
		return id, nil
	}
	return "", core.Errorf(core.CodeInvalidInput, "tenantId is required").WithDetails(map[string]any{"field": "tenantId", "reason": "required"})
}

func (s *Server) authenticate(ctx context.Context, cred iam.Credential) (*iam.Caller, error) {
	if s.iam == nil {
		return nil, core.Errorf(core.CodeUnauthn, "the credential is not valid")
	}
	return s.iam.Authenticate(ctx, cred)
}

// decide makes the method's one decision: Require for mutations, Authorize
// for reads. Denials are opaque ACCESS_DENIED.
func (s *Server) decide(ctx context.Context, c *Call, fields map[string]any) error {
	d, err := s.decisionOf(ctx, c)
	if err != nil {
		return err
	}
	c.Action = d.Action
	c.DecisionTenant = c.TenantID
	if d.Resource.Source == core.IDGlobal {
		c.DecisionTenant = s.rootTenant
	}
	if c.Resource, err = s.resourceOf(d.Resource, c, fields); err != nil {
		return err
	}
	req := c.Request(c.Resource)
	req.Context = pendingContext(d, fields)
	if c.Method.Kind.Mutates() {
		return s.iam.Require(ctx, req)
	}
	dec, err := s.iam.Authorize(ctx, req)
	if err != nil {
		return err
	}
	if !dec.Allowed {
		return denied()
	}
	return nil
}

// refreshAfterCommit re-reads the decided-on resource. A failure only
// delays read-your-writes until the projection's next tail: it is logged,
// and the committed change stands.
func (s *Server) refreshAfterCommit(ctx context.Context, c *Call) {
	r, ok := s.iam.(iam.Refresher)
	if !ok {
		return
	}
	if err := r.RefreshResource(ctx, c.DecisionTenant, c.Resource); err != nil {
		s.deps.Logger.WarnContext(ctx, "refreshing the projection after a change", "resource", c.Resource.String(), "error", err)
	}
}

// chooseDecision picks the decision among a method's alternatives by its
// input ("A or B" in the method table).
func chooseDecision(m core.Method, input json.RawMessage) (core.Decision, error) {
	if len(m.Decisions) == 1 {
		return m.Decisions[0], nil
	}
	var fields map[string]json.RawMessage
	_ = json.Unmarshal(input, &fields)
	var otherwise *core.Decision
	for i, d := range m.Decisions {
		raw, present := fields[d.When.Field]
		switch {
		case d.When.Field == "":
			otherwise = &m.Decisions[i]
		case len(d.When.Values) == 0 && present:
			return d, nil
		case present:
			var v string
			if json.Unmarshal(raw, &v) == nil && slices.Contains(d.When.Values, v) {
				return d, nil
			}
		}
	}
	if otherwise != nil {
		return *otherwise, nil
	}
	return core.Decision{}, core.Errorf(core.CodeInternal, "%s: no decision matches the input", m.FullName())
}

// resourceOf names the decided-on resource from the call's input fields.
func (s *Server) resourceOf(ref core.ResourceRef, c *Call, fields map[string]any) (iam.Resource, error) {
	typ := s.catalog.FullName(ref.Type)
	switch ref.Source {
	case core.IDGlobal:
		return iam.Resource{Type: typ, ID: core.FleetID}, nil
	case core.IDTenant:
		return iam.Resource{Type: typ, ID: c.TenantID}, nil
	case core.IDInput:
		id, _ := fields[ref.Field].(string)
		if id == "" {
			return iam.Resource{}, core.Errorf(core.CodeInvalidInput, "%s is required", ref.Field).
				WithDetails(map[string]any{"field": ref.Field, "reason": "required"})
		}
		return iam.Resource{Type: typ, ID: id}, nil
	}
	return iam.Resource{}, core.Errorf(core.CodeInternal, "%s: decisions on %s resources are not served yet", c.Method.FullName(), ref.Source)
}

// scopeOf reads an owner-scoped list's scope; its first scope is the default.
func scopeOf(m core.Method, input json.RawMessage) (string, error) {
	if len(m.Scopes) == 0 {
		return "", nil
	}
	var in struct {
		Scope string `json:"scope"`
	}
	if err := decode(input, &in); err != nil {
		return "", err
	}
	if in.Scope == "" {
		return m.Scopes[0], nil
	}
	return in.Scope, nil
}

// listRetryWait is how long a list waits for the projection to catch up
// when IAM does not know an item yet, before it reloads the page once.
const listRetryWait = 100 * time.Millisecond

// runList reads a page in a read-only transaction and then, outside it,
// keeps only the items the caller may read: cached allows are reused, the
// rest go to AuthorizeMany in batches of at most 50 sent a few at once. A
// NOT_FOUND (IAM does
// not know an item yet) waits, reloads the page and retries once; any other
// failure fails the whole request, never a partial list.
func (s *Server) runList(ctx context.Context, c *Call, h *rpc.Handler) (any, error) {
	for attempt := 0; ; attempt++ {
		var p rpc.Page
		err := s.store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
			p, err = h.List(ctx, c, tx)
			return err
		})
		if err != nil {
			return nil, err
		}
		if c.Scope == rpc.ScopeMine {
			kept := make([]any, len(p.Items))
			for i, it := range p.Items {
				kept[i] = it.Value
			}
			return p.Answer(kept), nil
		}
		kept, err := s.filterItems(ctx, c, p.Items)
		if errors.Is(err, core.ErrNotFound) && attempt == 0 {
			if err := sleep(ctx, listRetryWait); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		return p.Answer(kept), nil
	}
}

// filterItems keeps the items the caller may read, in their order. The
// page's decisions go out as AuthorizeMany batches of at most 50, a few at
// once (iam.AuthorizeInBatches; through the caching port, only its misses
// are batched); any failure fails the whole list.
func (s *Server) filterItems(ctx context.Context, c *Call, items []rpc.Item) ([]any, error) {
	reqs := make([]iam.Request, len(items))
	for i, it := range items {
		reqs[i] = c.Request(it.Resource)
	}
	decisions, err := iam.AuthorizeInBatches(ctx, s.iam, reqs)
	if err != nil {
		return nil, err
	}
	kept := make([]any, 0, len(items))
	for i, d := range decisions {
		if d.Allowed {
			kept = append(kept, items[i].Value)
		}
	}
	return kept, nil
}

// writeAudit records an allowed mutation's admission context in the
// mutation's own transaction.
func writeAudit(ctx context.Context, tx store.Tx, c *Call) error {
	return store.WriteAudit(ctx, tx, store.Audit{TenantID: c.TenantID, Method: c.Method.FullName(), Action: c.Action,
		ResourceType: c.Resource.Type, ResourceID: c.Resource.ID, Caller: c.AuditCaller(), Override: c.Override})
}

// metricName keeps the metric's label set bounded: unknown names share one.
func (s *Server) metricName(name string) string {
	if s.registry.Has(name) {
		return name
	}
	return "unknown"
}

func resultCode(err error) string {
	if err == nil {
		return "OK"
	}
	return string(core.AsError(err).Code)
}

// decode reads a validated input into v.
func decode(input json.RawMessage, v any) error {
	if err := json.Unmarshal(input, v); err != nil {
		return core.Wrap(core.CodeInvalidInput, err, "input does not match the method's fields")
	}
	return nil
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
