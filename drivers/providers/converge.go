package providers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Ownership tags every managed server carries (DigitalOcean tags allow
// letters, numbers, colons, dashes and underscores).
const (
	ManagedTag        = "better-compute-managed"
	instanceTagPrefix = "better-compute-instance:"
	tenantTagPrefix   = "better-compute-tenant:"
	serverNamePrefix  = "bc-i-"
	nameBodyLength    = 24
)

// ServerName is the deterministic name of an instance's server: "bc-i-"
// and NameBody of the id. Cloud resources name theirs "bc-r-" the same way.
func ServerName(instanceID string) string {
	return serverNamePrefix + NameBody(instanceID)
}

// NameBody is what deterministic provider names carry of an id: the first
// 24 characters of its body (what follows its prefix's underscore), lower
// case.
func NameBody(id string) string {
	body := id
	if i := strings.IndexByte(id, '_'); i >= 0 {
		body = id[i+1:]
	}
	body = strings.ToLower(body)
	if len(body) > nameBodyLength {
		body = body[:nameBodyLength]
	}
	return body
}

// InstanceTag is the tag that finds an instance's server again.
func InstanceTag(instanceID string) string { return instanceTagPrefix + TagValue(instanceID) }

// TenantTag is the tag of a tenant's servers.
func TenantTag(tenantID string) string { return tenantTagPrefix + TagValue(tenantID) }

// ServerTags are the ownership tags of an instance's server.
func ServerTags(instanceID, tenantID string) []string {
	return []string{ManagedTag, InstanceTag(instanceID), TenantTag(tenantID)}
}

// TagValue keeps what a tag allows and writes '_' for anything else, so
// an id of another alphabet still makes a valid, deterministic tag.
func TagValue(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == ':', r == '-', r == '_':
			return r
		}
		return '_'
	}, s)
}

// CreateJournal is the caller's durable record of the create it sent for
// one owner (the instance row). It is what makes a create happen at most
// once: EnsureServer records a create before sending it, and never sends
// another while the last one may still appear in the provider's listing.
type CreateJournal interface {
	// Pending answers whether a create is recorded as sent and how long
	// ago (measured on one clock, the database's).
	Pending(ctx context.Context) (sentAgo time.Duration, pending bool, err error)
	// Record durably records that a create is about to be sent, before
	// it is sent; when it fails, nothing is sent.
	Record(ctx context.Context) error
	// Forget records that the last create certainly created nothing (it
	// was refused, rate limited, or never sent).
	Forget(ctx context.Context) error
}

// Convergence holds the bounds of the idempotent helpers; the zero value
// takes the defaults.
type Convergence struct {
	// ListingLag bounds how long a created server may stay missing from
	// the provider's listing (default 5 minutes). A create is repeated
	// only once the last one was sent longer ago than this and the server
	// is still not listed.
	ListingLag time.Duration
	// PollInterval is the first pause between reads of an action or a
	// server (default 1s; later pauses grow to 10 times it).
	PollInterval time.Duration
	// ActionTimeout bounds one wait for an action or a status (default 5
	// minutes).
	ActionTimeout time.Duration
}

func (c Convergence) withDefaults() Convergence {
	if c.ListingLag <= 0 {
		c.ListingLag = 5 * time.Minute
	}
	if c.PollInterval <= 0 {
		c.PollInterval = time.Second
	}
	if c.ActionTimeout <= 0 {
		c.ActionTimeout = 5 * time.Minute
	}
	return c
}

// EnsureServer with the default bounds.
func EnsureServer(ctx context.Context, p Provider, req CreateServer, ownerTag string, journal CreateJournal) (Server, bool, error) {
	return Convergence{}.EnsureServer(ctx, p, req, ownerTag, journal)
}

// EnsureServer answers the server tagged ownerTag, creating it when there
// is none; created says this call's create made it. The rule that keeps it
// to one server per owner:
//
//  1. look up the servers tagged ownerTag; one found is the answer;
//  2. none found and the journal holds a create sent less than ListingLag
//     ago: ErrOutcomeUnknown (the server may not be listed yet; retry the
//     lookup later);
//  3. otherwise record the create in the journal, then send it;
//  4. a create that certainly did nothing (ErrRefused, *RateLimited,
//     ErrNotSent) is forgotten and its error answered; an unknown outcome
//     (ErrUnavailable, a timeout) is looked up once more, and when still
//     not listed answers ErrOutcomeUnknown, keeping the record.
//
// Calls for one owner must not run concurrently (the instance's workflow
// runs one activity at a time). With a nil journal only steps 1, 3 and 4
// apply within this call: a caller that crashes after sending may create
// twice.
func (c Convergence) EnsureServer(ctx context.Context, p Provider, req CreateServer, ownerTag string, journal CreateJournal) (Server, bool, error) {
	c = c.withDefaults()
	if ownerTag == "" || !slices.Contains(req.Tags, ownerTag) {
		return Server{}, false, fmt.Errorf("providers: ensure server %s: the request must carry the owner tag %q: %w", req.Name, ownerTag, ErrRefused)
	}
	if s, ok, err := c.lookup(ctx, p, ownerTag, req.Name); err != nil || ok {
		return s, false, err
	}
	if journal != nil {
		sentAgo, pending, err := journal.Pending(ctx)
		if err != nil {
			return Server{}, false, fmt.Errorf("providers: ensure server %s: reading the create journal: %w", req.Name, err)
		}
		if pending && sentAgo < c.ListingLag {
			return Server{}, false, fmt.Errorf("providers: ensure server %s: a create sent %v ago is not listed yet: %w",
				req.Name, sentAgo.Round(time.Millisecond), ErrOutcomeUnknown)
		}
		if err := journal.Record(ctx); err != nil {
			return Server{}, false, fmt.Errorf("providers: ensure server %s: recording the create: %w", req.Name, err)
		}
	}
	s, err := p.CreateServer(ctx, req)
	if err == nil {
		return s, true, nil
	}
	var limited *RateLimited
	if errors.Is(err, ErrRefused) || errors.Is(err, ErrNotSent) || errors.As(err, &limited) {
		if journal != nil {
			if ferr := journal.Forget(context.WithoutCancel(ctx)); ferr != nil {
				return Server{}, false, errors.Join(err, fmt.Errorf("providers: forgetting the create: %w", ferr))
			}
		}
		return Server{}, false, err
	}
	// The create may have happened: look again before anything else.
	if ctx.Err() == nil {
		if s, ok, lerr := c.lookup(ctx, p, ownerTag, req.Name); lerr == nil && ok {
			return s, true, nil
		}
	}
	return Server{}, false, fmt.Errorf("providers: ensure server %s: %w (create: %w)", req.Name, ErrOutcomeUnknown, err)
}

// lookup finds the owner's server: of several (which the rule prevents),
// the one named name, else the oldest.
func (c Convergence) lookup(ctx context.Context, p Provider, ownerTag, name string) (Server, bool, error) {
	servers, err := p.ServersTagged(ctx, ownerTag)
	if err != nil {
		return Server{}, false, fmt.Errorf("providers: listing servers tagged %s: %w", ownerTag, err)
	}
	if len(servers) == 0 {
		return Server{}, false, nil
	}
	best := servers[0]
	for _, s := range servers[1:] {
		if (s.Name == name) != (best.Name == name) {
			if s.Name == name {
				best = s
			}
			continue
		}
		if s.CreatedAt < best.CreatedAt || (s.CreatedAt == best.CreatedAt && s.ID < best.ID) {
			best = s
		}
	}
	return best, true, nil
}

// EnsurePower with the default bounds.
func EnsurePower(ctx context.Context, p Provider, id string, on bool) (Server, error) {
	return Convergence{}.EnsurePower(ctx, p, id, on)
}

// EnsurePower powers the server on or off and waits until it reads so. A
// server already so is left alone; a new one is waited for before acting.
func (c Convergence) EnsurePower(ctx context.Context, p Provider, id string, on bool) (Server, error) {
	c = c.withDefaults()
	want := ServerOff
	if on {
		want = ServerActive
	}
	s, err := p.GetServer(ctx, id)
	if err != nil {
		return Server{}, fmt.Errorf("providers: power %s: %w", id, err)
	}
	if s.Status == ServerNew {
		// A server being created takes no action: wait until it is up.
		if s, err = c.waitStatus(ctx, p, id, func(s Server) bool { return s.Status != ServerNew }); err != nil {
			return Server{}, err
		}
	}
	if s.Status == want {
		return s, nil
	}
	var a Action
	if on {
		a, err = p.PowerOn(ctx, id)
	} else {
		a, err = p.PowerOff(ctx, id)
	}
	if err != nil {
		return Server{}, fmt.Errorf("providers: power %s: %w", id, err)
	}
	if err := c.WaitAction(ctx, p, id, a); err != nil {
		return Server{}, err
	}
	return c.waitStatus(ctx, p, id, func(s Server) bool { return s.Status == want })
}

// EnsureSize with the default bounds.
func EnsureSize(ctx context.Context, p Provider, id, size string) (Server, error) {
	return Convergence{}.EnsureSize(ctx, p, id, size)
}

// EnsureSize resizes the server to size (CPU and memory; the disk is kept,
// so the resize can be undone). A provider resizes only a server that is
// off, so one that is on is powered off first and left off: the caller's
// next EnsurePower restores the power it wants.
func (c Convergence) EnsureSize(ctx context.Context, p Provider, id, size string) (Server, error) {
	c = c.withDefaults()
	s, err := p.GetServer(ctx, id)
	if err != nil {
		return Server{}, fmt.Errorf("providers: resize %s: %w", id, err)
	}
	if s.Size == size {
		return s, nil
	}
	if s.Status != ServerOff {
		if _, err := c.EnsurePower(ctx, p, id, false); err != nil {
			return Server{}, err
		}
	}
	a, err := p.Resize(ctx, id, size)
	if err != nil {
		return Server{}, fmt.Errorf("providers: resize %s to %s: %w", id, size, err)
	}
	if err := c.WaitAction(ctx, p, id, a); err != nil {
		return Server{}, err
	}
	return c.waitStatus(ctx, p, id, func(s Server) bool { return s.Size == size })
}

// EnsureDeleted with the default bounds.
func EnsureDeleted(ctx context.Context, p Provider, ownerTag string, journal CreateJournal) error {
	return Convergence{}.EnsureDeleted(ctx, p, ownerTag, journal)
}

// EnsureDeleted deletes every server tagged ownerTag (none is fine). While
// the journal holds a create sent less than ListingLag ago, a server may
// still appear: it answers ErrOutcomeUnknown after deleting what is
// listed, and the caller runs it again later.
func (c Convergence) EnsureDeleted(ctx context.Context, p Provider, ownerTag string, journal CreateJournal) error {
	c = c.withDefaults()
	if ownerTag == "" {
		return fmt.Errorf("providers: ensure deleted: an owner tag is required: %w", ErrRefused)
	}
	servers, err := p.ServersTagged(ctx, ownerTag)
	if err != nil {
		return fmt.Errorf("providers: ensure deleted %s: %w", ownerTag, err)
	}
	for _, s := range servers {
		if err := p.DeleteServer(ctx, s.ID); err != nil && !errors.Is(err, ErrNotFound) {
			return fmt.Errorf("providers: deleting %s (%s): %w", s.ID, ownerTag, err)
		}
	}
	if journal == nil {
		return nil
	}
	sentAgo, pending, err := journal.Pending(ctx)
	if err != nil {
		return fmt.Errorf("providers: ensure deleted %s: reading the create journal: %w", ownerTag, err)
	}
	if pending && sentAgo < c.ListingLag && len(servers) == 0 {
		return fmt.Errorf("providers: ensure deleted %s: a create sent %v ago may still be listed: %w",
			ownerTag, sentAgo.Round(time.Millisecond), ErrOutcomeUnknown)
	}
	return nil
}

// errNotYet is a poll that has not seen what it waits for.
var errNotYet = errors.New("not done within the wait's bound")

// WaitAction polls the action until it completes (nil), errors, or the
// bounds end. An action with no id (a provider that acts at once) is done.
func (c Convergence) WaitAction(ctx context.Context, p Provider, serverID string, a Action) error {
	c = c.withDefaults()
	if a.ID == "" || a.Status == ActionCompleted {
		return nil
	}
	_, err := poll(ctx, c, func() (Action, error) {
		got, err := p.GetAction(ctx, serverID, a.ID)
		switch {
		case err != nil:
			return got, transientOrPermanent(err)
		case got.Status == ActionCompleted:
			return got, nil
		case got.Status == ActionErrored:
			return got, backoff.Permanent(fmt.Errorf("providers: action %s %s on %s errored: %w", a.Type, a.ID, serverID, ErrRefused))
		}
		return got, errNotYet
	})
	if err != nil {
		return fmt.Errorf("providers: waiting for action %s %s on %s: %w", a.Type, a.ID, serverID, err)
	}
	return nil
}

func (c Convergence) waitStatus(ctx context.Context, p Provider, id string, done func(Server) bool) (Server, error) {
	s, err := poll(ctx, c, func() (Server, error) {
		s, err := p.GetServer(ctx, id)
		if err != nil {
			return s, transientOrPermanent(err)
		}
		if !done(s) {
			return s, errNotYet
		}
		return s, nil
	})
	if err != nil {
		return Server{}, fmt.Errorf("providers: waiting for server %s: %w", id, err)
	}
	return s, nil
}

// poll retries op while it answers errNotYet or a transient error, within
// ActionTimeout, backing off from PollInterval.
func poll[T any](ctx context.Context, c Convergence, op func() (T, error)) (T, error) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = c.PollInterval
	b.MaxInterval = 10 * c.PollInterval
	return backoff.Retry(ctx, op, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(c.ActionTimeout))
}

// transientOrPermanent keeps polling through outages and rate limits and
// stops on anything else.
func transientOrPermanent(err error) error {
	var limited *RateLimited
	if errors.Is(err, ErrUnavailable) || errors.As(err, &limited) {
		return err
	}
	return backoff.Permanent(err)
}

// MemoryJournal is a CreateJournal in memory (tests; a caller whose
// process lives as long as the owner).
type MemoryJournal struct {
	now func() time.Time

	mu     sync.Mutex
	sentAt time.Time
	sent   int
}

// NewMemoryJournal is an empty journal on the wall clock.
func NewMemoryJournal() *MemoryJournal { return &MemoryJournal{now: time.Now} }

// Pending implements CreateJournal.
func (j *MemoryJournal) Pending(context.Context) (time.Duration, bool, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.sentAt.IsZero() {
		return 0, false, nil
	}
	return j.now().Sub(j.sentAt), true, nil
}

// Record implements CreateJournal.
func (j *MemoryJournal) Record(context.Context) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.sentAt = j.now()
	j.sent++
	return nil
}

// Forget implements CreateJournal.
func (j *MemoryJournal) Forget(context.Context) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.sentAt = time.Time{}
	return nil
}

// Recorded is how many creates were recorded.
func (j *MemoryJournal) Recorded() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.sent
}
