// Package digitalocean is the DigitalOcean Provider, over godo (the
// official client): droplets, sizes, regions, distribution images,
// droplet actions and tags. Every request goes through the credential's
// providers.Limiter (see transport.go); reads and deletes are retried a
// few times on outages and 429s, creates and actions never: the caller's
// providers.EnsureServer decides what an unknown outcome means.
package digitalocean

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/digitalocean/godo"

	"github.com/better-compute/better-compute/drivers/providers"
)

// Kind is the provider's name in accounts and credentials.
const Kind = "digitalocean"

// defaultBaseURL is DigitalOcean's API, used when a credential names none.
const defaultBaseURL = "https://api.digitalocean.com/"

// perPage is the page size of every list (DigitalOcean's maximum).
const perPage = 200

// maxPages bounds a listing, so a provider answering "next" forever
// cannot hold a call.
const maxPages = 500

// Factory opens DigitalOcean Providers whose calls share limiter, keyed by
// the digest of each token.
type Factory struct {
	limiter providers.Limiter
	client  *http.Client
	// readTries bounds the tries of one read (default 3).
	readTries uint
	// readBackoff is the first pause between them (default 250ms).
	readBackoff time.Duration
}

// NewFactory opens Providers over httpClient (nil: a client with a 30 s
// timeout) whose every request waits on limiter.
func NewFactory(limiter providers.Limiter, httpClient *http.Client) *Factory {
	if httpClient == nil {
		httpClient = &http.Client{Timeout: 30 * time.Second}
	}
	return &Factory{limiter: limiter, client: httpClient, readTries: 3, readBackoff: 250 * time.Millisecond}
}

// Open implements providers.Factory. The token is kept only in the
// returned Provider's transport.
func (f *Factory) Open(ctx context.Context, c providers.Credential) (providers.Provider, error) {
	client, err := f.Client(ctx, c)
	if err != nil {
		return nil, err
	}
	return &Provider{client: client, tries: f.readTries, backoff: f.readBackoff}, nil
}

// Client is the godo client a Provider of c uses (the credential's limiter
// and token in its transport), for other services of the same account
// (drivers/cloudresources/digitalocean).
func (f *Factory) Client(_ context.Context, c providers.Credential) (*godo.Client, error) {
	if c.Kind != Kind {
		return nil, fmt.Errorf("digitalocean: a %q credential: %w", c.Kind, providers.ErrRefused)
	}
	token := strings.TrimSpace(c.Token)
	if token == "" {
		return nil, fmt.Errorf("digitalocean: an empty token: %w", providers.ErrRefused)
	}
	base := f.client.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	baseURL := defaultBaseURL
	if c.BaseURL != "" {
		baseURL = c.BaseURL
		if !strings.HasSuffix(baseURL, "/") {
			baseURL += "/"
		}
	}
	u, err := url.Parse(baseURL)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, fmt.Errorf("digitalocean: the base URL %q: %w", c.BaseURL, providers.ErrRefused)
	}
	transport := &limitedTransport{
		base: base, limiter: f.limiter, key: providers.LimiterKey(token), token: token, host: u.Host, now: time.Now,
	}
	hc := &http.Client{Timeout: f.client.Timeout, CheckRedirect: f.client.CheckRedirect, Transport: transport}
	// godo.New, not NewFromToken: NewFromToken turns on go-retryablehttp,
	// which retries 429s and 5xx of every method, creates included.
	client, err := godo.New(hc, godo.SetUserAgent("better-compute"), godo.SetBaseURL(baseURL))
	if err != nil {
		return nil, fmt.Errorf("digitalocean: the base URL %q: %w", c.BaseURL, providers.ErrRefused)
	}
	return client, nil
}

// Provider is one DigitalOcean token's view.
type Provider struct {
	client  *godo.Client
	tries   uint
	backoff time.Duration
}

var _ providers.Provider = (*Provider)(nil)

// Kind implements providers.Provider.
func (p *Provider) Kind() string { return Kind }

// Regions implements providers.Provider.
func (p *Provider) Regions(ctx context.Context) ([]providers.Region, error) {
	regions, err := allPages(ctx, p, "listing regions", func(o *godo.ListOptions) ([]godo.Region, *godo.Response, error) {
		return p.client.Regions.List(ctx, o)
	})
	if err != nil {
		return nil, err
	}
	out := make([]providers.Region, 0, len(regions))
	for _, r := range regions {
		out = append(out, providers.Region{Slug: r.Slug, Name: r.Name, Available: r.Available, Sizes: nonNil(r.Sizes)})
	}
	return out, nil
}

// Sizes implements providers.Provider.
func (p *Provider) Sizes(ctx context.Context) ([]providers.Size, error) {
	sizes, err := allPages(ctx, p, "listing sizes", func(o *godo.ListOptions) ([]godo.Size, *godo.Response, error) {
		return p.client.Sizes.List(ctx, o)
	})
	if err != nil {
		return nil, err
	}
	out := make([]providers.Size, 0, len(sizes))
	for _, s := range sizes {
		size := providers.Size{
			Slug: s.Slug, VCPU: s.Vcpus, MemoryMiB: int64(s.Memory), DiskGiB: s.Disk,
			PriceHourly: s.PriceHourly, PriceMonthly: s.PriceMonthly, Regions: nonNil(s.Regions), Available: s.Available,
		}
		if s.GPUInfo != nil {
			size.GPUs, size.GPUModel = s.GPUInfo.Count, s.GPUInfo.Model
		}
		out = append(out, size)
	}
	return out, nil
}

// Images implements providers.Provider: the public distribution images.
func (p *Provider) Images(ctx context.Context) ([]providers.Image, error) {
	images, err := allPages(ctx, p, "listing images", func(o *godo.ListOptions) ([]godo.Image, *godo.Response, error) {
		return p.client.Images.ListDistribution(ctx, o)
	})
	if err != nil {
		return nil, err
	}
	out := make([]providers.Image, 0, len(images))
	for _, im := range images {
		out = append(out, providers.Image{
			ID: strconv.Itoa(im.ID), Slug: im.Slug, Name: im.Name, Distribution: im.Distribution, Regions: nonNil(im.Regions),
		})
	}
	return out, nil
}

// CreateServer implements providers.Provider. It is sent once: no retry.
func (p *Provider) CreateServer(ctx context.Context, req providers.CreateServer) (providers.Server, error) {
	image := godo.DropletCreateImage{Slug: req.Image}
	if id, err := strconv.Atoi(req.Image); err == nil {
		image = godo.DropletCreateImage{ID: id}
	}
	d, _, err := p.client.Droplets.Create(ctx, &godo.DropletCreateRequest{
		Name: req.Name, Region: req.Region, Size: req.Size, Image: image,
		// Empty slices, not nil: godo sends a nil slice as null.
		SSHKeys:  []godo.DropletCreateSSHKey{},
		Tags:     nonNil(req.Tags),
		UserData: req.UserData,
	})
	if err != nil {
		return providers.Server{}, MapError("creating droplet "+req.Name, err)
	}
	return server(d), nil
}

// GetServer implements providers.Provider.
func (p *Provider) GetServer(ctx context.Context, id string) (providers.Server, error) {
	n, err := dropletID(id)
	if err != nil {
		return providers.Server{}, err
	}
	return retried(ctx, p, "reading droplet "+id, func() (providers.Server, error) {
		d, _, err := p.client.Droplets.Get(ctx, n)
		if err != nil {
			return providers.Server{}, err
		}
		return server(d), nil
	})
}

// ServersTagged implements providers.Provider.
func (p *Provider) ServersTagged(ctx context.Context, tag string) ([]providers.Server, error) {
	droplets, err := allPages(ctx, p, "listing droplets tagged "+tag, func(o *godo.ListOptions) ([]godo.Droplet, *godo.Response, error) {
		return p.client.Droplets.ListByTag(ctx, tag, o)
	})
	if err != nil {
		return nil, err
	}
	out := make([]providers.Server, 0, len(droplets))
	for i := range droplets {
		out = append(out, server(&droplets[i]))
	}
	return out, nil
}

// DeleteServer implements providers.Provider; a droplet already gone is
// not an error. A delete is idempotent, so it is retried like a read.
func (p *Provider) DeleteServer(ctx context.Context, id string) error {
	n, err := dropletID(id)
	if errors.Is(err, providers.ErrNotFound) {
		return nil
	}
	_, err = retried(ctx, p, "deleting droplet "+id, func() (struct{}, error) {
		_, err := p.client.Droplets.Delete(ctx, n)
		return struct{}{}, err
	})
	if errors.Is(err, providers.ErrNotFound) {
		return nil
	}
	return err
}

// PowerOn implements providers.Provider.
func (p *Provider) PowerOn(ctx context.Context, id string) (providers.Action, error) {
	return p.act(ctx, id, "power_on", func(n int) (*godo.Action, *godo.Response, error) {
		return p.client.DropletActions.PowerOn(ctx, n)
	})
}

// PowerOff implements providers.Provider (a hard power off).
func (p *Provider) PowerOff(ctx context.Context, id string) (providers.Action, error) {
	return p.act(ctx, id, "power_off", func(n int) (*godo.Action, *godo.Response, error) {
		return p.client.DropletActions.PowerOff(ctx, n)
	})
}

// Resize implements providers.Provider: CPU and memory only (the disk is
// kept, so a smaller size can follow).
func (p *Provider) Resize(ctx context.Context, id, size string) (providers.Action, error) {
	return p.act(ctx, id, "resize", func(n int) (*godo.Action, *godo.Response, error) {
		return p.client.DropletActions.Resize(ctx, n, size, false)
	})
}

func (p *Provider) act(ctx context.Context, id, what string, do func(int) (*godo.Action, *godo.Response, error)) (providers.Action, error) {
	n, err := dropletID(id)
	if err != nil {
		return providers.Action{}, err
	}
	a, _, err := do(n)
	if err != nil {
		return providers.Action{}, MapError(what+" droplet "+id, err)
	}
	return action(a), nil
}

// GetAction implements providers.Provider.
func (p *Provider) GetAction(ctx context.Context, serverID, actionID string) (providers.Action, error) {
	n, err := dropletID(serverID)
	if err != nil {
		return providers.Action{}, err
	}
	an, err := strconv.Atoi(actionID)
	if err != nil {
		return providers.Action{}, fmt.Errorf("digitalocean: action %q: %w", actionID, providers.ErrNotFound)
	}
	return retried(ctx, p, "reading action "+actionID, func() (providers.Action, error) {
		a, _, err := p.client.DropletActions.Get(ctx, n, an)
		if err != nil {
			return providers.Action{}, err
		}
		return action(a), nil
	})
}

// retried runs a safe call (a read, a delete) up to the Provider's tries,
// again on an outage or a 429 (whose penalty the Limiter then waits out),
// and maps its error.
func retried[T any](ctx context.Context, p *Provider, what string, call func() (T, error)) (T, error) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = p.backoff
	b.MaxInterval = 8 * p.backoff
	v, err := backoff.Retry(ctx, func() (T, error) {
		v, err := call()
		if err == nil {
			return v, nil
		}
		mapped := MapError(what, err)
		if retryable(mapped) {
			return v, mapped
		}
		return v, backoff.Permanent(mapped)
	}, backoff.WithBackOff(b), backoff.WithMaxTries(p.tries), backoff.WithMaxElapsedTime(0))
	if err != nil && !mapped(err) {
		// The retry stopped on the caller's deadline: an outage to the caller.
		err = fmt.Errorf("digitalocean: %s: %w: %w", what, providers.ErrUnavailable, err)
	}
	return v, err
}

// mapped says err already is one of the seam's errors (backoff answers
// the context's own error when the caller's deadline stops it).
func mapped(err error) bool {
	var limited *providers.RateLimited
	return errors.Is(err, providers.ErrUnavailable) || errors.Is(err, providers.ErrNotFound) ||
		errors.Is(err, providers.ErrRefused) || errors.As(err, &limited)
}

// retryable is an outage or a provider's 429; the limiter's own refusal
// (the next call would pass the deadline) is not.
func retryable(err error) bool {
	var limited *providers.RateLimited
	if errors.As(err, &limited) {
		return !errors.Is(err, providers.ErrNotSent)
	}
	return errors.Is(err, providers.ErrUnavailable)
}

// allPages reads every page of a list, each page retried as a read.
func allPages[T any](ctx context.Context, p *Provider, what string, list func(*godo.ListOptions) ([]T, *godo.Response, error)) ([]T, error) {
	var all []T
	for page := 1; page <= maxPages; page++ {
		type result struct {
			items []T
			last  bool
		}
		r, err := retried(ctx, p, what, func() (result, error) {
			items, resp, err := list(&godo.ListOptions{Page: page, PerPage: perPage})
			if err != nil {
				return result{}, err
			}
			last := resp == nil || resp.Links == nil || resp.Links.IsLastPage() || len(items) == 0
			return result{items: items, last: last}, nil
		})
		if err != nil {
			return nil, err
		}
		all = append(all, r.items...)
		if r.last {
			return all, nil
		}
	}
	return nil, fmt.Errorf("digitalocean: %s: more than %d pages: %w", what, maxPages, providers.ErrUnavailable)
}

// MapError turns godo's and the transport's errors into the seam's: 404
// ErrNotFound, 429 *RateLimited, 5xx, timeouts and connection errors
// ErrUnavailable (with ErrNotSent when the request never left), other 4xx
// ErrRefused. The limiter's refusal stays a *RateLimited.
func MapError(what string, err error) error {
	var resp *godo.ErrorResponse
	if errors.As(err, &resp) && resp.Response != nil {
		status := resp.Response.StatusCode
		msg := resp.Message
		switch {
		case status == http.StatusNotFound:
			return fmt.Errorf("digitalocean: %s: %s: %w", what, msg, providers.ErrNotFound)
		case status == http.StatusTooManyRequests:
			return fmt.Errorf("digitalocean: %s: %w", what, &providers.RateLimited{RetryAt: retryAt(resp.Response.Header, time.Now())})
		case status >= 500:
			return fmt.Errorf("digitalocean: %s: %d %s: %w", what, status, msg, providers.ErrUnavailable)
		default:
			return fmt.Errorf("digitalocean: %s: %d %s: %w", what, status, msg, providers.ErrRefused)
		}
	}
	var limited *providers.RateLimited
	if errors.As(err, &limited) || errors.Is(err, providers.ErrRefused) {
		// The limiter's refusal, or the transport's (a redirect elsewhere).
		return fmt.Errorf("digitalocean: %s: %w", what, err)
	}
	return fmt.Errorf("digitalocean: %s: %w: %w", what, providers.ErrUnavailable, err)
}

func dropletID(id string) (int, error) {
	n, err := strconv.Atoi(id)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("digitalocean: droplet %q: %w", id, providers.ErrNotFound)
	}
	return n, nil
}

func server(d *godo.Droplet) providers.Server {
	s := providers.Server{
		ID: strconv.Itoa(d.ID), Name: d.Name, Status: d.Status, Size: d.SizeSlug,
		VCPU: d.Vcpus, MemoryMiB: int64(d.Memory), Tags: nonNil(d.Tags),
	}
	if s.Size == "" && d.Size != nil {
		s.Size = d.Size.Slug
	}
	if d.Region != nil {
		s.Region = d.Region.Slug
	}
	s.PublicIPv4, _ = d.PublicIPv4()
	s.PrivateIPv4, _ = d.PrivateIPv4()
	if at, err := time.Parse(time.RFC3339, d.Created); err == nil {
		s.CreatedAt = at.UnixMilli()
	}
	return s
}

func action(a *godo.Action) providers.Action {
	if a == nil {
		return providers.Action{}
	}
	return providers.Action{ID: strconv.Itoa(a.ID), Type: a.Type, Status: a.Status}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
