// Package rpc is how a domain describes its methods to the call envelope:
// one descriptor per method (its name, its Go input and output types, its
// handler, its kind and, for admissions, the two halves), and the call the
// handler is given. The envelope (package api) decodes, validates against
// the schema derived from the input type, authenticates, decides and runs
// the handler; domains never see HTTP.
package rpc

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/cloudresources"
	"github.com/better-compute/better-compute/drivers/providers"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/internal/nodeca"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/blobs"
	"github.com/better-compute/better-compute/store/secrets"
)

// Call is one method call in flight, as handlers see it.
type Call struct {
	Method   core.Method
	Cred     iam.Credential
	Caller   *iam.Caller // nil for an unauthenticated public call
	Input    json.RawMessage
	TenantID string // the input's tenantId
	// DecisionTenant is where the decision is made: the root tenant for
	// fleet-wide methods, the input's tenant otherwise.
	DecisionTenant string
	// Resource is what the decision was made on.
	Resource iam.Resource
	Action   string
	// Override: a root-tenant caller acting in another tenant.
	Override bool
	// Scope of an owner-scoped list: "mine" (the default: the handler's SQL
	// keeps the caller's own rows, with no per-item decisions) or "all".
	Scope string

	// input is the decoded input, set once by the envelope.
	input any
}

// ScopeMine is the owner scope whose rows the SQL, not IAM, filters.
const ScopeMine = "mine"

// ApproverKeys answers the live approver keys of a live person of a
// tenant (none for anyone else).
type ApproverKeys interface {
	ApproverKeys(ctx context.Context, tenantID, identityID string) ([]iam.ApproverKey, error)
}

// AuditCaller is the call's admission context as its audit rows record it.
func (c *Call) AuditCaller() store.Caller {
	k := c.Caller
	if k == nil {
		return store.Caller{RequestID: c.Cred.RequestID, SourceIP: c.Cred.SourceIP}
	}
	return store.Caller{IdentityID: k.IdentityID, IdentityKind: k.IdentityKind, SessionID: k.SessionID,
		SessionKind: k.SessionKind, MFA: k.MFA, AgentID: k.AgentID, DelegatedBy: k.DelegatedBy,
		RequestID: c.Cred.RequestID, SourceIP: c.Cred.SourceIP}
}

// Request is the call's question to IAM about r.
func (c *Call) Request(r iam.Resource) iam.Request {
	return iam.Request{Caller: c.Caller, TenantID: c.DecisionTenant, Action: c.Action, Resource: r, RequestID: c.Cred.RequestID}
}

// Deps are what domains' handlers may use. A domain takes what it needs
// when it builds its descriptors.
type Deps struct {
	Store    *store.Store
	Temporal client.Client
	// TaskQueue is the control plane's Temporal task queue.
	TaskQueue string
	Catalog   *core.Catalog
	// RootTenant is the platform's tenant.
	RootTenant string
	Logger     *slog.Logger
	// NodeCA signs the certificates of admitted nodes; nil when none is
	// configured.
	NodeCA *nodeca.CA
	// ReservationMaxAhead bounds how far ahead a reservation may start (0:
	// the reservations domain's default, one year).
	ReservationMaxAhead time.Duration
	// PublicURL is the API's base URL as nodes reach it, written into the
	// `bcd node join` command joinTokens.create answers; "" leaves a
	// placeholder for the user to fill.
	PublicURL string
	// ReservationStarts, when set, takes admitted reservations whose
	// workflows are owed and starts them off the request path; without it
	// the create call starts the workflow itself before it answers.
	ReservationStarts WorkflowStarter
	// Secrets is the sealed secret store; nil (or one without a
	// key-encryption key) refuses secrets.put with UNAVAILABLE.
	Secrets *secrets.Vault
	// Blobs holds images' bytes; nil answers images.register and uploads
	// UNAVAILABLE.
	Blobs blobs.Store
	// IAM decides what a handler decides itself, per item (metal.bulk's
	// "then each node"); nil answers those items UNAVAILABLE.
	IAM iam.Port
	// Metal tunes the metal domain (tests shorten its deadlines).
	Metal MetalConfig
	// Providers opens capacity providers' APIs for an account's credential
	// (providerAccounts.offers); nil answers those calls UNAVAILABLE.
	Providers providers.Factory
	// CloudResources configures the cloud-resources module.
	CloudResources CloudResourcesConfig
	// Approvers answers the approver keys registered for an identity (the
	// embedded IAM's admin service); nil answers commandBatches.approve and
	// cancel UNAVAILABLE.
	Approvers ApproverKeys
	// WebhookLoopback lets webhooks reach loopback receivers (the dev stack
	// and tests); every other private address is refused regardless.
	WebhookLoopback bool
}

// CloudResourcesConfig is the cloud-resources module's configuration
// (cloud-resources-api.md: maxPerKind, quotas, kindMeters) and the waits
// its workflows are started with (0: 30 s and 5 min).
type CloudResourcesConfig struct {
	Quotas          cloudresources.Quotas
	KindMeters      []string
	ConvergingEvery time.Duration
	SettledEvery    time.Duration
}

// MetalConfig tunes the metal domain's methods.
type MetalConfig struct {
	// Deadlines override core/metal.DefaultDeadlines per in-flight
	// provision state (the key "" overrides the power deadline).
	Deadlines map[string]time.Duration
	// PowerWait bounds how long metal.power waits for the read-back (0:
	// 60 s); past it the call answers the operation in flight.
	PowerWait time.Duration
}

// WorkflowStarter starts, off the request path, the workflow a committed
// row owes (the row records the start, so it is its own outbox). Owe never
// blocks and may drop what it cannot queue: the starter also scans the
// table for owed starts.
type WorkflowStarter interface {
	Owe(tenantID, id string)
}

// Resource names a resource of a catalog type ("pool") by its full name.
func (d Deps) Resource(typ, id string) iam.Resource {
	return iam.Resource{Type: d.Catalog.FullName(typ), ID: id}
}

// SecretsDecision is the further decision of a call that hands the
// tenant's secrets to what it makes (a secret:// reference):
// compute:secrets:manage on the tenant, and in the root tenant on the
// fleet too.
func (d Deps) SecretsDecision(tenantID string) []Requirement {
	const action = "compute:secrets:manage"
	out := []Requirement{{Action: action, Resource: d.Resource("tenant", tenantID)}}
	if tenantID == d.RootTenant {
		out = append(out, Requirement{Action: action, Resource: d.Resource("fleet", core.FleetID)})
	}
	return out
}

// Domain builds a domain's descriptors from the process's dependencies.
type Domain func(Deps) []Descriptor

// Descriptor is one served method, type-erased for the envelope.
type Descriptor interface {
	// Info is what start-up checks against the method table.
	Info() Info
	// Handler is what the envelope runs.
	Handler() *Handler
}

// Info is a descriptor's static description: the method's name and what
// its table row must say (action, decided-on and phase cells, exactly), its
// kind, and its input and output types.
type Info struct {
	Name      string
	Action    string
	DecidedOn string
	Phase     string
	Kind      core.Kind
	Input     reflect.Type
	Output    reflect.Type
}

// Handler is a method's handler, type-erased. Exactly one of Direct, Run,
// Read, List and Admission is set.
type Handler struct {
	// Decode reads a validated input into the method's input type.
	Decode func(input json.RawMessage) (any, error)
	// Direct runs with no transaction (system methods).
	Direct func(ctx context.Context, c *Call) (any, error)
	// Run is the handler of a read or a mutation, in the call's transaction
	// (read-only for reads).
	Run func(ctx context.Context, c *Call, tx store.Tx) (any, error)
	// Read is the handler of a read whose statements are all known before
	// any runs: it queues them in b, the envelope sends them in one round
	// trip (store.Read), then calls the answer Read returned.
	Read func(c *Call, b *store.Batch) func() (any, error)
	// List reads one page of a "+ items" list; the envelope then keeps only
	// the items the caller may read.
	List func(ctx context.Context, c *Call, tx store.Tx) (Page, error)
	// Admission serves a method whose decision is made on its draft.
	Admission *ErasedAdmission
	// Refresh: once the mutation commits, this process's projection re-reads
	// the resource it was decided on, so the next decision does not wait for
	// the projection's tail.
	Refresh bool
	// After, optional with Run, finishes a mutation once its transaction has
	// committed, outside it (a workflow update), and answers the call.
	After func(ctx context.Context, c *Call, out any) (any, error)
	// DecideOn, optional, answers the catalog type of the alternative the
	// decision is made on (see Method.DecideOn).
	DecideOn func(ctx context.Context, c *Call, tx store.Tx) (string, error)
	// Also, optional with Run on a mutation, names its further decisions
	// (see Method.Also).
	Also func(ctx context.Context, c *Call, tx store.Tx) ([]Requirement, error)
}

// ErasedAdmission is an admission's halves, type-erased (see Admission).
type ErasedAdmission struct {
	Prepare  func(ctx context.Context, c *Call, tx store.Tx, draftID string) (iam.Resource, error)
	Complete func(ctx context.Context, c *Call, tx store.Tx) (any, error)
	Seal     func(ctx context.Context, c *Call, tx store.Tx) error
	Denied   func(ctx context.Context, c *Call, tx store.Tx) error
	Failed   func(ctx context.Context, c *Call, tx store.Tx, cause error) error
	Started  func(ctx context.Context, c *Call) error
	Also     func(c *Call) []Requirement
}

// Requirement is one further decision of an admission: Action on Resource,
// asked for the call's caller in the call's decision tenant.
type Requirement struct {
	Action   string
	Resource iam.Resource
}

// Ref is a method's name bound to its input and output types. A domain
// declares one per method; its descriptor and every caller name the method
// through it, so the name and the types are written once.
type Ref[In, Out any] string

// Caller sends one call: the HTTP client, or a server in process.
type Caller interface {
	Call(ctx context.Context, method string, in, out any) error
}

// Call calls the method through c.
func (r Ref[In, Out]) Call(ctx context.Context, c Caller, in In) (Out, error) {
	var out Out
	err := c.Call(ctx, string(r), in, &out)
	return out, err
}

// Method describes one method whose input is In and whose answer is Out.
// Set exactly one of Direct, Run, Read, List and Admission.
type Method[In, Out any] struct {
	Name      Ref[In, Out]
	Action    string // the table's action cell
	DecidedOn string // the table's decided-on cell
	Phase     string // the table's phase cell
	Kind      core.Kind

	Direct func(ctx context.Context, c *Call, in In) (Out, error)
	Run    func(ctx context.Context, c *Call, tx store.Tx, in In) (Out, error)
	// Read, for reads only, queues the read's statements (with their scan
	// callbacks) and answers once they have run; see Handler.Read.
	Read      func(c *Call, b *store.Batch, in In) func() (Out, error)
	List      func(ctx context.Context, c *Call, tx store.Tx, in In) (Page, error)
	Admission *Admission[In, Out]
	Refresh   bool
	After     func(ctx context.Context, c *Call, in In, out Out) (Out, error)
	// DecideOn chooses among the alternatives of a decided-on cell ("A or
	// B") when the input alone cannot: it reads what the choice needs, in a
	// read-only transaction of its own before the decision, and answers the
	// catalog type of the alternative to decide on ("fleet", "tenant").
	DecideOn func(ctx context.Context, c *Call, tx store.Tx, in In) (string, error)
	// Also, optional with Run on a mutation, names the further decisions
	// the input calls for (the table's extras: each volume a template
	// names). It reads what it needs in a read-only transaction of its own
	// after the method's decision; the envelope requires each, in order,
	// outside any transaction, before the handler's transaction.
	Also func(ctx context.Context, c *Call, tx store.Tx, in In) ([]Requirement, error)
}

// Admission is an admission method's halves: transaction 1 prepares the
// draft (or the changed row), the decision is made on it, transaction 2
// completes it.
type Admission[In, Out any] struct {
	// Prepare writes the draft (and its authorization row) and returns the
	// resource the decision is made on. The draft's id should be draftID so
	// a retry finds the same row ("" for a change of an existing row).
	Prepare func(ctx context.Context, c *Call, tx store.Tx, draftID string, in In) (iam.Resource, error)
	// Also, optional, names the further decisions the input calls for (a
	// second action the draft's decision does not cover). The envelope
	// requires each, in order, right after the draft's decision and before
	// transaction 2, outside any transaction; a denial goes as the draft's
	// does (Denied), and a replay of the stored result decides none.
	Also func(c *Call, in In) []Requirement
	// Complete runs after the decision allowed it, in transaction 2.
	Complete func(ctx context.Context, c *Call, tx store.Tx, in In) (Out, error)
	// Seal, optional, runs last in transaction 2, after the stored result
	// and the audit row, right before the commit: a check under a lock held
	// to the commit (a quota shared by concurrent calls) then holds it for
	// its own statements and the commit only. Its error rolls transaction 2
	// back like Complete's.
	Seal func(ctx context.Context, c *Call, tx store.Tx, in In) error
	// Denied, optional, records a denial on the draft (in its own transaction).
	Denied func(ctx context.Context, c *Call, tx store.Tx, in In) error
	// Failed, optional, records on the draft why Complete refused it, in a
	// transaction of its own once transaction 2 has rolled back.
	Failed func(ctx context.Context, c *Call, tx store.Tx, in In, cause error) error
	// Started, optional, starts what drives the admitted resource once
	// transaction 2 has committed, and again on every replay. Idempotent.
	Started func(ctx context.Context, c *Call, in In) error
}

// Info implements Descriptor.
func (m *Method[In, Out]) Info() Info {
	return Info{Name: string(m.Name), Action: m.Action, DecidedOn: m.DecidedOn, Phase: m.Phase, Kind: m.Kind,
		Input: reflect.TypeFor[In](), Output: reflect.TypeFor[Out]()}
}

// Handler implements Descriptor.
func (m *Method[In, Out]) Handler() *Handler {
	h := &Handler{Refresh: m.Refresh, Decode: func(raw json.RawMessage) (any, error) {
		var in In
		if err := json.Unmarshal(raw, &in); err != nil {
			return nil, core.Wrap(core.CodeInvalidInput, err, "input does not match the method's fields")
		}
		return in, nil
	}}
	if f := m.Direct; f != nil {
		h.Direct = func(ctx context.Context, c *Call) (any, error) { return f(ctx, c, input[In](c)) }
	}
	if f := m.Run; f != nil {
		h.Run = func(ctx context.Context, c *Call, tx store.Tx) (any, error) { return f(ctx, c, tx, input[In](c)) }
	}
	if f := m.Read; f != nil {
		h.Read = func(c *Call, b *store.Batch) func() (any, error) {
			answer := f(c, b, input[In](c))
			return func() (any, error) { return answer() }
		}
	}
	if f := m.List; f != nil {
		h.List = func(ctx context.Context, c *Call, tx store.Tx) (Page, error) { return f(ctx, c, tx, input[In](c)) }
	}
	if f := m.DecideOn; f != nil {
		h.DecideOn = func(ctx context.Context, c *Call, tx store.Tx) (string, error) { return f(ctx, c, tx, input[In](c)) }
	}
	if f := m.Also; f != nil {
		h.Also = func(ctx context.Context, c *Call, tx store.Tx) ([]Requirement, error) {
			return f(ctx, c, tx, input[In](c))
		}
	}
	if f := m.After; f != nil {
		h.After = func(ctx context.Context, c *Call, out any) (any, error) { return f(ctx, c, input[In](c), out.(Out)) }
	}
	if a := m.Admission; a != nil {
		e := &ErasedAdmission{
			Prepare: func(ctx context.Context, c *Call, tx store.Tx, draftID string) (iam.Resource, error) {
				return a.Prepare(ctx, c, tx, draftID, input[In](c))
			},
			Complete: func(ctx context.Context, c *Call, tx store.Tx) (any, error) {
				return a.Complete(ctx, c, tx, input[In](c))
			},
		}
		if f := a.Seal; f != nil {
			e.Seal = func(ctx context.Context, c *Call, tx store.Tx) error { return f(ctx, c, tx, input[In](c)) }
		}
		if f := a.Denied; f != nil {
			e.Denied = func(ctx context.Context, c *Call, tx store.Tx) error { return f(ctx, c, tx, input[In](c)) }
		}
		if f := a.Failed; f != nil {
			e.Failed = func(ctx context.Context, c *Call, tx store.Tx, cause error) error {
				return f(ctx, c, tx, input[In](c), cause)
			}
		}
		if f := a.Started; f != nil {
			e.Started = func(ctx context.Context, c *Call) error { return f(ctx, c, input[In](c)) }
		}
		if f := a.Also; f != nil {
			e.Also = func(c *Call) []Requirement { return f(c, input[In](c)) }
		}
		h.Admission = e
	}
	return h
}

// SetInput records the decoded input; the envelope calls it once.
func (c *Call) SetInput(v any) { c.input = v }

// input is the call's decoded input; a handler run without a decoded input
// (a test calling it directly) gets the zero value.
func input[In any](c *Call) In {
	in, _ := c.input.(In)
	return in
}

// Page is what a list handler read: its items, each with the resource it is
// decided on, and how to shape the answer from the kept items.
type Page struct {
	Items  []Item
	Answer func(kept []any) any
}

// Item is one listed value and the resource it is decided on.
type Item struct {
	Resource iam.Resource
	Value    any
}

// ListInput is the paging part of every list's input; list inputs embed it,
// so their schemas and documents say the same limit and cursor.
type ListInput struct {
	Limit  int    `json:"limit,omitempty" jsonschema:"minimum=1,maximum=500" jsonschema_description:"The page's size: at most 500 items, 100 when left out. A page may hold fewer items than the limit (items the caller may not read are left out) and still be followed by another."`
	Cursor string `json:"cursor,omitempty" jsonschema:"minLength=1,maxLength=512" jsonschema_description:"The nextCursor of the previous page; left out for the first page."`
}

// Page is the page the input asks for; a cursor this list did not answer is
// INVALID_INPUT naming the field cursor.
func (in ListInput) Page() (store.PageQuery, error) {
	q := store.PageQuery{Limit: in.Limit}
	if q.Limit == 0 {
		q.Limit = store.DefaultPageLimit
	}
	q.Limit = min(q.Limit, store.MaxPageLimit)
	if in.Cursor != "" {
		k, err := store.DecodeCursor(in.Cursor)
		if err != nil {
			return store.PageQuery{}, err
		}
		q.After = &k
	}
	return q, nil
}

// Paged is the page of rows read for q (at most q.Fetch() of them): the
// first q.Limit rows, and the cursor after the last of them when more rows
// followed ("" at the end of the list).
func Paged[T any](rows []T, q store.PageQuery, key func(T) store.Key) ([]T, string) {
	if len(rows) <= q.Limit {
		return rows, ""
	}
	rows = rows[:q.Limit]
	return rows, store.EncodeCursor(key(rows[len(rows)-1]))
}

// PageOf is the page of rows read for q, each decided on resource(row),
// answered as wrap(the rows kept, the next cursor). The cursor continues
// after the last row read, not the last kept, so rows a decision drops
// shorten the page without skipping or repeating any.
func PageOf[T any](rows []T, q store.PageQuery, key func(T) store.Key, resource func(T) iam.Resource,
	wrap func(kept []T, next string) any) Page {
	rows, next := Paged(rows, q, key)
	return PageFrom(rows, next, resource, wrap)
}

// PageFrom is PageOf of rows already cut to the page (Paged), for a list
// that drops rows by a rule of its own after reading them.
func PageFrom[T any](rows []T, next string, resource func(T) iam.Resource, wrap func(kept []T, next string) any) Page {
	p := Page{Items: make([]Item, len(rows)), Answer: func(kept []any) any {
		out := make([]T, len(kept))
		for i, k := range kept {
			out[i] = k.(T)
		}
		return wrap(out, next)
	}}
	for i, r := range rows {
		p.Items[i] = Item{Resource: resource(r), Value: r}
	}
	return p
}

// Check reports a handler whose shape does not fit its method's kind.
func Check(info Info, h *Handler) error {
	set := 0
	for _, b := range []bool{h.Direct != nil, h.Run != nil, h.Read != nil, h.List != nil, h.Admission != nil} {
		if b {
			set++
		}
	}
	switch {
	case set != 1:
		return fmt.Errorf("%s: set exactly one of Direct, Run, Read, List and Admission", info.Name)
	case h.Read != nil && info.Kind != core.KindRead:
		return fmt.Errorf("%s: Read serves reads only", info.Name)
	case (info.Kind == core.KindAdmission) != (h.Admission != nil):
		return fmt.Errorf("%s: an admission method needs an admission handler, and only it", info.Name)
	case h.After != nil && h.Run == nil:
		return fmt.Errorf("%s: After needs Run", info.Name)
	case h.DecideOn != nil && !strings.Contains(info.DecidedOn, " or "):
		return fmt.Errorf("%s: DecideOn needs alternatives in the decided-on cell", info.Name)
	}
	return nil
}

// NoInput is the input of a method that takes no fields.
type NoInput struct{}

// TenantListInput is the input of a list that takes only its tenant.
type TenantListInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	ListInput
}

// TenantInput is the input of a method that takes only its tenant.
type TenantInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
}

// Stream is an answer written as it is read, not held in memory (a usage
// export): the envelope answers 200 with ContentType and calls Write once
// the decision allowed the call. Write runs outside any transaction of the
// envelope's (it opens its own). An error once writing began can no longer
// change the status: the HTTP trailer StreamErrorTrailer carries it, and
// StreamRowsTrailer how many rows were written.
type Stream struct {
	ContentType string                                          `json:"-"`
	Write       func(ctx context.Context, w StreamWriter) error `json:"-"`
}

// StreamWriter is where a Stream writes its rows; Row counts one.
type StreamWriter interface {
	io.Writer
	Row()
}

// The trailers of a streamed answer.
const (
	StreamErrorTrailer = "Bc-Stream-Error"
	StreamRowsTrailer  = "Bc-Stream-Rows"
)
