package digitalocean_test

import (
	"context"

	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/drivers/providers"
	"github.com/better-compute/better-compute/drivers/providers/digitalocean"
)

const token = "dop_v1_test-token"

// recordingLimiter grants every Wait and records what the transport
// reports, in front of a real MemoryLimiter.
type recordingLimiter struct {
	inner *providers.MemoryLimiter

	mu        sync.Mutex
	waits     map[string]int
	observed  []observation
	penalties []time.Time
}

type observation struct {
	key              string
	limit, remaining int
	reset            time.Time
}

func newRecordingLimiter() *recordingLimiter {
	return &recordingLimiter{inner: providers.NewMemoryLimiter(), waits: map[string]int{}}
}

func (l *recordingLimiter) Wait(ctx context.Context, key string) error {
	l.mu.Lock()
	l.waits[key]++
	l.mu.Unlock()
	return l.inner.Wait(ctx, key)
}

func (l *recordingLimiter) Observe(ctx context.Context, key string, limit, remaining int, reset time.Time) {
	l.mu.Lock()
	l.observed = append(l.observed, observation{key, limit, remaining, reset})
	l.mu.Unlock()
	l.inner.Observe(ctx, key, limit, remaining, reset)
}

func (l *recordingLimiter) Penalize(ctx context.Context, key string, until time.Time) {
	l.mu.Lock()
	l.penalties = append(l.penalties, until)
	l.mu.Unlock()
	l.inner.Penalize(ctx, key, until)
}

func open(t *testing.T, s *doServer, l providers.Limiter) providers.Provider {
	t.Helper()
	p, err := digitalocean.NewFactory(l, nil).Open(context.Background(), providers.Credential{Kind: digitalocean.Kind, Token: token, BaseURL: s.srv.URL})
	require.NoError(t, err)
	return p
}

func TestReadsMapGodosWireFormat(t *testing.T) {
	s := newDOServer(t)
	s.pageSize = 2 // five images over three pages
	l := newRecordingLimiter()
	p := open(t, s, l)
	ctx := context.Background()

	sizes, err := p.Sizes(ctx)
	require.NoError(t, err)
	require.Equal(t, []providers.Size{
		{Slug: "s-1vcpu-1gb", VCPU: 1, MemoryMiB: 1024, DiskGiB: 25, PriceHourly: 0.00893, PriceMonthly: 6, Regions: []string{"nyc3"}, Available: true},
		{Slug: "gpu-h100x1-80gb", VCPU: 20, MemoryMiB: 245760, DiskGiB: 720, GPUs: 1, GPUModel: "nvidia_h100", PriceHourly: 3.39, PriceMonthly: 2488.32, Regions: []string{"tor1"}, Available: true},
	}, sizes)

	regions, err := p.Regions(ctx)
	require.NoError(t, err)
	require.Equal(t, []providers.Region{
		{Slug: "nyc3", Name: "New York 3", Available: true, Sizes: []string{"s-1vcpu-1gb"}},
		{Slug: "tor1", Name: "Toronto 1", Available: true, Sizes: []string{"gpu-h100x1-80gb"}},
	}, regions)

	images, err := p.Images(ctx)
	require.NoError(t, err)
	require.Len(t, images, 5, "every page")
	require.Equal(t, providers.Image{ID: "100", Slug: "ubuntu-20-04-x64", Name: "20.04 (LTS) x64", Distribution: "Ubuntu", Regions: []string{"nyc3"}}, images[0])

	created, err := p.CreateServer(ctx, providers.CreateServer{Name: "bc-i-abc", Region: "nyc3", Size: "s-1vcpu-1gb", Image: "ubuntu-24-04-x64",
		Tags: []string{"better-compute-managed"}, UserData: "#cloud-config\n"})
	require.NoError(t, err)
	got, err := p.GetServer(ctx, created.ID)
	require.NoError(t, err)
	require.Equal(t, "bc-i-abc", got.Name)
	require.Equal(t, providers.ServerActive, got.Status)
	require.Equal(t, "nyc3", got.Region)
	require.Equal(t, "s-1vcpu-1gb", got.Size)
	require.Equal(t, "203.0.113.7", got.PublicIPv4)
	require.Equal(t, "10.0.0.7", got.PrivateIPv4)
	require.Positive(t, got.CreatedAt, "epoch ms")
	require.Less(t, got.CreatedAt, int64(1e13), "epoch ms, not µs")

	tagged, err := p.ServersTagged(ctx, "better-compute-managed")
	require.NoError(t, err)
	require.Len(t, tagged, 1)
	none, err := p.ServersTagged(ctx, "better-compute-instance:other")
	require.NoError(t, err)
	require.Empty(t, none)

	// What went on the wire: an empty ssh_keys list (godo sends a nil
	// slice as null), the tags, the image by slug, the token as a bearer.
	body := s.createBodies[0]
	require.JSONEq(t, `[]`, string(body["ssh_keys"]))
	require.JSONEq(t, `["better-compute-managed"]`, string(body["tags"]))
	require.JSONEq(t, `"ubuntu-24-04-x64"`, string(body["image"]))
	require.JSONEq(t, `"#cloud-config\n"`, string(body["user_data"]))
	require.Equal(t, map[string]bool{"Bearer " + token: true}, s.auth)

	// Every request waited on the limiter under the token's digest.
	key := providers.LimiterKey(token)
	require.Len(t, key, 64)
	require.Equal(t, map[string]int{key: s.requests}, l.waits)
}

func TestImageByID(t *testing.T) {
	s := newDOServer(t)
	p := open(t, s, providers.NewMemoryLimiter())
	_, err := p.CreateServer(context.Background(), providers.CreateServer{Name: "n", Region: "nyc3", Size: "s-1vcpu-1gb", Image: "12345"})
	require.NoError(t, err)
	require.JSONEq(t, `12345`, string(s.createBodies[0]["image"]))
	require.JSONEq(t, `[]`, string(s.createBodies[0]["tags"]))
}

func TestErrorsMap(t *testing.T) {
	retryIn := func(secs int) http.Header { return http.Header{"Retry-After": {strconv.Itoa(secs)}} }
	tests := []struct {
		name string
		// fail answers status on the first `times` requests.
		status int
		times  int
		header http.Header
		call   func(p providers.Provider) error
		want   error
		// wantLimited: a *RateLimited whose RetryAt is about this far off.
		wantLimited time.Duration
		requests    int
	}{
		{name: "a missing droplet", status: http.StatusNotFound, times: 1, call: getServer, want: providers.ErrNotFound, requests: 1},
		{name: "a refused create", status: http.StatusUnprocessableEntity, times: 1, call: createServer, want: providers.ErrRefused, requests: 1},
		{name: "an unauthorized token", status: http.StatusUnauthorized, times: 1, call: getServer, want: providers.ErrRefused, requests: 1},
		{name: "a 5xx create is not retried", status: http.StatusInternalServerError, times: 5, call: createServer, want: providers.ErrUnavailable, requests: 1},
		{name: "a 429 create is not retried", status: http.StatusTooManyRequests, times: 5, header: retryIn(7), call: createServer, wantLimited: 7 * time.Second, requests: 1},
		{name: "a 5xx power action is not retried", status: http.StatusServiceUnavailable, times: 5, call: powerOn, want: providers.ErrUnavailable, requests: 1},
		{name: "a read retries a 503", status: http.StatusServiceUnavailable, times: 1, call: listTagged, requests: 2},
		{name: "a read gives up after three tries", status: http.StatusBadGateway, times: 5, call: listTagged, want: providers.ErrUnavailable, requests: 3},
		{name: "a read retries a 429 after its penalty", status: http.StatusTooManyRequests, times: 1, header: retryIn(0), call: listTagged, requests: 2},
		{name: "a delete of a missing droplet is done", status: http.StatusNotFound, times: 1, call: deleteServer, requests: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newDOServer(t)
			p := open(t, s, providers.NewMemoryLimiter())
			s.before = func(r *http.Request, n int) (int, http.Header) {
				if n <= tt.times {
					return tt.status, tt.header
				}
				return 0, nil
			}
			err := tt.call(p)
			switch {
			case tt.wantLimited > 0:
				var limited *providers.RateLimited
				require.ErrorAs(t, err, &limited)
				require.WithinDuration(t, time.Now().Add(tt.wantLimited), limited.RetryAt, 2*time.Second)
				require.NotErrorIs(t, err, providers.ErrUnavailable)
			case tt.want != nil:
				require.ErrorIs(t, err, tt.want)
			default:
				require.NoError(t, err)
			}
			require.Equal(t, tt.requests, s.requests)
			require.Zero(t, s.createCount(), "no injected failure created anything")
		})
	}
}

func getServer(p providers.Provider) error {
	_, err := p.GetServer(context.Background(), "4242")
	return err
}

func createServer(p providers.Provider) error {
	_, err := p.CreateServer(context.Background(), providers.CreateServer{Name: "n", Region: "nyc3", Size: "s-1vcpu-1gb", Image: "ubuntu-24-04-x64"})
	return err
}

func powerOn(p providers.Provider) error {
	_, err := p.PowerOn(context.Background(), "4242")
	return err
}

func listTagged(p providers.Provider) error {
	_, err := p.ServersTagged(context.Background(), "t")
	return err
}

func deleteServer(p providers.Provider) error {
	return p.DeleteServer(context.Background(), "4242")
}

func TestUnreachableProviderIsUnavailableAndNotSent(t *testing.T) {
	s := newDOServer(t)
	p := open(t, s, providers.NewMemoryLimiter())
	s.srv.Close()
	err := createServer(p)
	require.ErrorIs(t, err, providers.ErrUnavailable)
	require.ErrorIs(t, err, providers.ErrNotSent)
	require.NotContains(t, err.Error(), token)
}

func TestTheLimiterHearsTheHeaders(t *testing.T) {
	s := newDOServer(t)
	reset := time.Now().Add(20 * time.Minute).Truncate(time.Second)
	s.rateHeaders = http.Header{
		"Ratelimit-Limit":     {"5000"},
		"Ratelimit-Remaining": {"4321"},
		"Ratelimit-Reset":     {strconv.FormatInt(reset.Unix(), 10)},
	}
	l := newRecordingLimiter()
	p := open(t, s, l)
	require.NoError(t, listTagged(p))
	key := providers.LimiterKey(token)
	require.Equal(t, []observation{{key: key, limit: 5000, remaining: 4321, reset: reset}}, l.observed)

	// A 429 penalizes the credential until Retry-After; the limiter then
	// refuses a call whose deadline comes first, without sending it.
	s.before = func(*http.Request, int) (int, http.Header) {
		return http.StatusTooManyRequests, http.Header{"Retry-After": {"3600"}}
	}
	err := createServer(p)
	var limited *providers.RateLimited
	require.ErrorAs(t, err, &limited)
	require.Len(t, l.penalties, 1)
	require.WithinDuration(t, time.Now().Add(time.Hour), l.penalties[0], 5*time.Second)

	sent := s.requests
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = p.CreateServer(ctx, providers.CreateServer{Name: "n", Region: "nyc3", Size: "s-1vcpu-1gb", Image: "x"})
	require.ErrorAs(t, err, &limited)
	require.ErrorIs(t, err, providers.ErrNotSent)
	require.Equal(t, sent, s.requests, "refused before sending")
}

func TestTheTokenGoesOnlyToTheAPIsHost(t *testing.T) {
	elsewhere := newDOServer(t)
	s := newDOServer(t)
	s.before = func(r *http.Request, _ int) (int, http.Header) {
		return http.StatusFound, http.Header{"Location": {elsewhere.srv.URL + "/v2/droplets"}}
	}
	p := open(t, s, providers.NewMemoryLimiter())
	err := listTagged(p)
	require.ErrorIs(t, err, providers.ErrRefused)
	require.NotErrorIs(t, err, providers.ErrUnavailable)
	require.Equal(t, 1, s.requests, "a refusal is not retried")
	require.Zero(t, elsewhere.requests, "the redirect was not followed")
	require.NotContains(t, err.Error(), token)
}

func TestOpenRefusesBadCredentials(t *testing.T) {
	f := digitalocean.NewFactory(providers.NewMemoryLimiter(), nil)
	for _, c := range []providers.Credential{
		{Kind: "aws", Token: "x"},
		{Kind: digitalocean.Kind, Token: "  "},
		{Kind: digitalocean.Kind, Token: "x", BaseURL: "ftp://example.com"},
		{Kind: digitalocean.Kind, Token: "x", BaseURL: "/relative"},
	} {
		_, err := f.Open(context.Background(), c)
		require.ErrorIs(t, err, providers.ErrRefused, "%+v", c.Kind)
	}
}
