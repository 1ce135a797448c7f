package digitalocean_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/drivers/providers"
)

// fast polls actions every millisecond; its listing lag is long enough
// that no case outlives it unless it says so.
var fast = providers.Convergence{PollInterval: time.Millisecond, ActionTimeout: 10 * time.Second, ListingLag: time.Hour}

const instanceID = "inst_01jabcdefghjkmnpqrstvwxyz0"

func request() (providers.CreateServer, string) {
	tag := providers.InstanceTag(instanceID)
	return providers.CreateServer{
		Name: providers.ServerName(instanceID), Region: "nyc3", Size: "s-1vcpu-1gb", Image: "ubuntu-24-04-x64",
		Tags: providers.ServerTags(instanceID, "ten_acme"),
	}, tag
}

// TestEnsureServerCreatesExactlyOnce drives EnsureServer as the instance's
// activity does (again after each error) against a provider that
// misbehaves, and counts the creates the provider received.
func TestEnsureServerCreatesExactlyOnce(t *testing.T) {
	tests := []struct {
		name  string
		setup func(s *doServer)
		// errs are the errors of the calls before the one that answers the
		// server (matched with ErrorIs, or a *RateLimited for nil).
		errs []error
		// createdBy is which call's answer says created (-1: none).
		createdBy int
	}{
		{name: "a healthy provider", setup: func(*doServer) {}, createdBy: 0},
		{
			name: "429 then OK",
			setup: func(s *doServer) {
				s.before = func(r *http.Request, n int) (int, http.Header) {
					if r.Method == http.MethodPost && n <= 2 {
						return http.StatusTooManyRequests, http.Header{"Retry-After": {"0"}}
					}
					return 0, nil
				}
			},
			errs:      []error{nil},
			createdBy: 1,
		},
		{
			name:      "a 5xx after creating, listed at once",
			setup:     func(s *doServer) { s.failAfterCreate = 1 },
			createdBy: 0, // the lookup after the unknown outcome finds it
		},
		{
			name:      "a 5xx after creating and a listing that lags",
			setup:     func(s *doServer) { s.failAfterCreate = 1; s.listLag = 2 },
			errs:      []error{providers.ErrOutcomeUnknown, providers.ErrOutcomeUnknown},
			createdBy: -1, // found by a later call's lookup
		},
		{
			name: "an outage while listing",
			setup: func(s *doServer) {
				s.before = func(r *http.Request, n int) (int, http.Header) {
					if r.Method == http.MethodGet && n <= 3 {
						return http.StatusServiceUnavailable, nil
					}
					return 0, nil
				}
			},
			errs:      []error{providers.ErrUnavailable},
			createdBy: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newDOServer(t)
			tt.setup(s)
			p := open(t, s, providers.NewMemoryLimiter())
			journal := providers.NewMemoryJournal()
			req, tag := request()
			ctx := context.Background()
			var got providers.Server
			for call := 0; ; call++ {
				require.Less(t, call, 10, "EnsureServer never converged")
				srv, created, err := fast.EnsureServer(ctx, p, req, tag, journal)
				if call < len(tt.errs) {
					if tt.errs[call] == nil {
						var limited *providers.RateLimited
						require.ErrorAs(t, err, &limited, "call %d", call)
					} else {
						require.ErrorIs(t, err, tt.errs[call], "call %d", call)
					}
					continue
				}
				require.NoError(t, err, "call %d", call)
				require.Equal(t, call == tt.createdBy, created, "call %d says created", call)
				got = srv
				break
			}
			require.Equal(t, 1, s.createCount(), "creates the provider received")
			require.Equal(t, 1, s.dropletCount())
			require.Equal(t, req.Name, got.Name)

			// Converged: later calls find it and create nothing.
			again, created, err := fast.EnsureServer(ctx, p, req, tag, journal)
			require.NoError(t, err)
			require.False(t, created)
			require.Equal(t, got.ID, again.ID)
			require.Equal(t, 1, s.createCount())
		})
	}
}

func TestEnsureServerRepeatsACreateOnlyPastTheListingLag(t *testing.T) {
	s := newDOServer(t)
	p := open(t, s, providers.NewMemoryLimiter())
	req, tag := request()
	ctx := context.Background()

	// A create recorded by a caller that crashed before sending it.
	journal := providers.NewMemoryJournal()
	require.NoError(t, journal.Record(ctx))

	_, _, err := fast.EnsureServer(ctx, p, req, tag, journal)
	require.ErrorIs(t, err, providers.ErrOutcomeUnknown, "within the lag it waits")
	require.Zero(t, s.createCount())

	short := fast
	short.ListingLag = time.Nanosecond
	srv, created, err := short.EnsureServer(ctx, p, req, tag, journal)
	require.NoError(t, err, "past the lag the create is sent")
	require.True(t, created)
	require.Equal(t, 1, s.createCount())
	require.Equal(t, req.Name, srv.Name)
}

func TestEnsureServerForgetsCreatesThatCertainlyFailed(t *testing.T) {
	tests := []struct {
		name   string
		status int
		want   error
	}{
		{name: "refused", status: http.StatusUnprocessableEntity, want: providers.ErrRefused},
		{name: "never sent", status: -1, want: providers.ErrNotSent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newDOServer(t)
			p := open(t, s, providers.NewMemoryLimiter())
			req, tag := request()
			journal := providers.NewMemoryJournal()
			if tt.status < 0 {
				// Lookups answer; the create's dial fails.
				p = createUnreachable{Provider: p, unreachable: open(t, closedServer(t), providers.NewMemoryLimiter())}
			} else {
				s.before = func(r *http.Request, _ int) (int, http.Header) {
					if r.Method == http.MethodPost {
						return tt.status, nil
					}
					return 0, nil
				}
			}
			_, _, err := fast.EnsureServer(context.Background(), p, req, tag, journal)
			require.ErrorIs(t, err, tt.want)
			_, pending, err := journal.Pending(context.Background())
			require.NoError(t, err)
			require.False(t, pending, "a create that certainly did nothing is forgotten")
			require.Equal(t, 1, journal.Recorded())
		})
	}
}

// createUnreachable sends creates to an unreachable provider.
type createUnreachable struct {
	providers.Provider
	unreachable providers.Provider
}

func (c createUnreachable) CreateServer(ctx context.Context, req providers.CreateServer) (providers.Server, error) {
	return c.unreachable.CreateServer(ctx, req)
}

func closedServer(t *testing.T) *doServer {
	s := newDOServer(t)
	s.srv.Close()
	return s
}

func TestEnsureServerRefusesARequestWithoutItsOwnerTag(t *testing.T) {
	s := newDOServer(t)
	p := open(t, s, providers.NewMemoryLimiter())
	req, _ := request()
	_, _, err := fast.EnsureServer(context.Background(), p, req, "better-compute-instance:someone-else", nil)
	require.ErrorIs(t, err, providers.ErrRefused)
	require.Zero(t, s.requests)
}

func TestEnsurePowerAndSize(t *testing.T) {
	s := newDOServer(t)
	s.actionPolls = 2 // every action is read in progress twice
	p := open(t, s, providers.NewMemoryLimiter())
	req, tag := request()
	ctx := context.Background()
	srv, _, err := fast.EnsureServer(ctx, p, req, tag, nil)
	require.NoError(t, err)

	actions := func() int { s.mu.Lock(); defer s.mu.Unlock(); return len(s.actions) }
	steps := []struct {
		name    string
		do      func() (providers.Server, error)
		status  string
		size    string
		actions int // actions sent so far
	}{
		{name: "on while on", do: func() (providers.Server, error) { return fast.EnsurePower(ctx, p, srv.ID, true) }, status: "active", size: "s-1vcpu-1gb"},
		{name: "off", do: func() (providers.Server, error) { return fast.EnsurePower(ctx, p, srv.ID, false) }, status: "off", size: "s-1vcpu-1gb", actions: 1},
		{name: "off again", do: func() (providers.Server, error) { return fast.EnsurePower(ctx, p, srv.ID, false) }, status: "off", size: "s-1vcpu-1gb", actions: 1},
		{name: "on", do: func() (providers.Server, error) { return fast.EnsurePower(ctx, p, srv.ID, true) }, status: "active", size: "s-1vcpu-1gb", actions: 2},
		{name: "resize while on powers off first", do: func() (providers.Server, error) { return fast.EnsureSize(ctx, p, srv.ID, "s-2vcpu-4gb") }, status: "off", size: "s-2vcpu-4gb", actions: 4},
		{name: "resize again", do: func() (providers.Server, error) { return fast.EnsureSize(ctx, p, srv.ID, "s-2vcpu-4gb") }, status: "off", size: "s-2vcpu-4gb", actions: 4},
		{name: "on after the resize", do: func() (providers.Server, error) { return fast.EnsurePower(ctx, p, srv.ID, true) }, status: "active", size: "s-2vcpu-4gb", actions: 5},
	}
	for _, st := range steps {
		got, err := st.do()
		require.NoError(t, err, st.name)
		require.Equal(t, st.status, got.Status, st.name)
		require.Equal(t, st.size, got.Size, st.name)
		require.Equal(t, st.actions, actions(), st.name)
	}

	_, err = fast.EnsurePower(ctx, p, "999999", true)
	require.ErrorIs(t, err, providers.ErrNotFound)
}

func TestEnsureDeleted(t *testing.T) {
	s := newDOServer(t)
	p := open(t, s, providers.NewMemoryLimiter())
	req, tag := request()
	ctx := context.Background()
	other := req
	other.Name, other.Tags = "someone-else", []string{providers.ManagedTag, providers.InstanceTag("inst_other")}
	for _, r := range []providers.CreateServer{req, req, other} { // two of ours, as if a duplicate slipped through
		_, err := p.CreateServer(ctx, r)
		require.NoError(t, err)
	}

	require.NoError(t, fast.EnsureDeleted(ctx, p, tag, nil))
	require.Equal(t, 1, s.dropletCount(), "only the other owner's server is left")
	require.NoError(t, fast.EnsureDeleted(ctx, p, tag, nil), "none is fine")

	// A create still within its listing lag: nothing listed is not proof.
	journal := providers.NewMemoryJournal()
	require.NoError(t, journal.Record(ctx))
	require.ErrorIs(t, fast.EnsureDeleted(ctx, p, tag, journal), providers.ErrOutcomeUnknown)

	require.ErrorIs(t, fast.EnsureDeleted(ctx, p, "", nil), providers.ErrRefused)
}

func TestEnsureHelpersWaitOutAnOutageWhilePolling(t *testing.T) {
	s := newDOServer(t)
	s.actionPolls = 1
	p := open(t, s, providers.NewMemoryLimiter())
	req, tag := request()
	ctx := context.Background()
	srv, _, err := fast.EnsureServer(ctx, p, req, tag, nil)
	require.NoError(t, err)
	// Action reads fail for a while (beyond the driver's own three tries).
	s.mu.Lock()
	base := s.requests
	s.mu.Unlock()
	s.before = func(r *http.Request, n int) (int, http.Header) {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/actions/") && n < base+8 {
			return http.StatusBadGateway, nil
		}
		return 0, nil
	}
	got, err := fast.EnsurePower(ctx, p, srv.ID, false)
	require.NoError(t, err)
	require.Equal(t, providers.ServerOff, got.Status)
}

func TestEnsurePowerWaitsForANewServer(t *testing.T) {
	tests := []struct {
		name    string
		on      bool
		actions int
	}{
		{name: "on", on: true},
		{name: "off", on: false, actions: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newDOServer(t)
			s.bootReads = 3
			p := open(t, s, providers.NewMemoryLimiter())
			req, tag := request()
			ctx := context.Background()
			srv, _, err := fast.EnsureServer(ctx, p, req, tag, nil)
			require.NoError(t, err)
			require.Equal(t, providers.ServerNew, srv.Status)
			got, err := fast.EnsurePower(ctx, p, srv.ID, tt.on)
			require.NoError(t, err)
			want := providers.ServerOff
			if tt.on {
				want = providers.ServerActive
			}
			require.Equal(t, want, got.Status)
			s.mu.Lock()
			defer s.mu.Unlock()
			require.Len(t, s.actions, tt.actions, "no action on a server still being created")
		})
	}
}
