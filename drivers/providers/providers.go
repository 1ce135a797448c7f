// Package providers is the seam to external capacity APIs (DigitalOcean
// today; AWS or GCP fit the same interface): one Provider per account
// credential, every call of every process that uses that credential
// passing through one shared Limiter. The instances and cloud-resources
// domains call providers only from activities, never inside a database
// transaction.
package providers

import (
	"context"
	"errors"
	"time"
)

// Provider is one account's view of a capacity API.
type Provider interface {
	// Kind names the provider ("digitalocean").
	Kind() string
	Regions(ctx context.Context) ([]Region, error)
	Sizes(ctx context.Context) ([]Size, error)
	// Images are the provider's public distribution images.
	Images(ctx context.Context) ([]Image, error)

	// CreateServer creates one machine. Its outcome may be unknown (a
	// timeout, a 5xx after the request was sent): callers use
	// EnsureServer, which looks the name up before creating again.
	CreateServer(ctx context.Context, req CreateServer) (Server, error)
	// GetServer reads one machine; ErrNotFound when it does not exist.
	GetServer(ctx context.Context, id string) (Server, error)
	// ServersTagged lists the machines carrying tag (all pages).
	ServersTagged(ctx context.Context, tag string) ([]Server, error)
	// DeleteServer deletes one machine; one already gone is not an error.
	DeleteServer(ctx context.Context, id string) error
	// PowerOn, PowerOff and Resize start an action on the machine.
	PowerOn(ctx context.Context, id string) (Action, error)
	PowerOff(ctx context.Context, id string) (Action, error)
	Resize(ctx context.Context, id, size string) (Action, error)
	// GetAction reads an action of the machine.
	GetAction(ctx context.Context, serverID, actionID string) (Action, error)
}

// Credential is what opens a Provider: the resolved token (never logged,
// never stored: the account keeps a secret:// reference) and, for tests
// and the dev stack, the API's base URL.
type Credential struct {
	Kind    string
	Token   string
	BaseURL string
}

// Factory opens a Provider for a credential; every Provider it opens for
// one token shares that token's Limiter.
type Factory interface {
	Open(ctx context.Context, c Credential) (Provider, error)
}

// Region is a provider region.
type Region struct {
	Slug      string   `json:"slug"`
	Name      string   `json:"name"`
	Available bool     `json:"available"`
	Sizes     []string `json:"sizes"`
}

// Size is a provider machine size with its price.
type Size struct {
	Slug      string `json:"slug"`
	VCPU      int    `json:"vcpu"`
	MemoryMiB int64  `json:"memoryMiB"`
	DiskGiB   int    `json:"diskGiB"`
	// GPUs and GPUModel describe a GPU size (0 and "" otherwise).
	GPUs         int      `json:"gpus,omitempty"`
	GPUModel     string   `json:"gpuModel,omitempty"`
	PriceHourly  float64  `json:"priceHourly"`
	PriceMonthly float64  `json:"priceMonthly"`
	Regions      []string `json:"regions"`
	Available    bool     `json:"available"`
}

// Image is a provider image.
type Image struct {
	ID           string   `json:"id"`
	Slug         string   `json:"slug,omitempty"`
	Name         string   `json:"name"`
	Distribution string   `json:"distribution,omitempty"`
	Regions      []string `json:"regions"`
}

// CreateServer is a machine to create.
type CreateServer struct {
	Name     string
	Region   string
	Size     string
	Image    string // slug or id
	Tags     []string
	UserData string
}

// Server states.
const (
	ServerNew     = "new"
	ServerActive  = "active"
	ServerOff     = "off"
	ServerArchive = "archive"
)

// Server is a machine at the provider.
type Server struct {
	ID          string   `json:"id"`
	Name        string   `json:"name"`
	Status      string   `json:"status"`
	Region      string   `json:"region"`
	Size        string   `json:"size"`
	VCPU        int      `json:"vcpu"`
	MemoryMiB   int64    `json:"memoryMiB"`
	Tags        []string `json:"tags"`
	PublicIPv4  string   `json:"publicIPv4,omitempty"`
	PrivateIPv4 string   `json:"privateIPv4,omitempty"`
	// CreatedAt is epoch ms.
	CreatedAt int64 `json:"createdAt"`
}

// Action states.
const (
	ActionInProgress = "in-progress"
	ActionCompleted  = "completed"
	ActionErrored    = "errored"
)

// Action is an asynchronous change of a machine.
type Action struct {
	ID     string `json:"id"`
	Type   string `json:"type"`
	Status string `json:"status"`
}

// Errors every Provider wraps (match with errors.Is; RateLimited with
// errors.As to read RetryAt).
var (
	ErrNotFound = errors.New("provider: not found")
	// ErrUnavailable is a 5xx, a timeout or a refused connection: the
	// request may or may not have taken effect.
	ErrUnavailable = errors.New("provider: unavailable")
	// ErrRefused is a 4xx other than 404 and 429: the request is wrong
	// and retrying it changes nothing.
	ErrRefused = errors.New("provider: refused")
)

// RateLimited is a 429, or the limiter's own refusal to wait past the
// caller's deadline.
type RateLimited struct {
	RetryAt time.Time
}

func (e *RateLimited) Error() string {
	return "provider: rate limited until " + e.RetryAt.UTC().Format(time.RFC3339)
}

// RetryTime is when the next call may go. A Limiter's own refusal may be
// any error with this method (store/ratelimits cannot name this type);
// the providers' transports turn it into a *RateLimited.
func (e *RateLimited) RetryTime() time.Time { return e.RetryAt }

// AsRateLimited finds a rate-limit refusal in err's chain: a *RateLimited
// or any error answering RetryTime.
func AsRateLimited(err error) (*RateLimited, bool) {
	var limited *RateLimited
	if errors.As(err, &limited) {
		return limited, true
	}
	var timed interface{ RetryTime() time.Time }
	if errors.As(err, &timed) {
		return &RateLimited{RetryAt: timed.RetryTime()}, true
	}
	return nil, false
}

// Limiter spaces one credential's calls, shared by every process and
// workflow that uses it. Key is a digest of the token, never the token.
type Limiter interface {
	// Wait blocks until the credential may make one call, or ctx ends.
	Wait(ctx context.Context, key string) error
	// Observe records what the provider's RateLimit-* headers said
	// (limit, remaining, reset) after a call.
	Observe(ctx context.Context, key string, limit, remaining int, reset time.Time)
	// Penalize stops the credential's calls until until (after a 429).
	Penalize(ctx context.Context, key string, until time.Time)
}

// More errors of the seam (extending the set above).
var (
	// ErrNotSent marks an ErrUnavailable whose request never left this
	// process (the connection was refused or not dialled): it certainly
	// took no effect.
	ErrNotSent = errors.New("provider: request not sent")
	// ErrOutcomeUnknown is EnsureServer's answer when a create was sent
	// whose outcome is unknown and the server is not listed yet: the
	// caller retries the lookup later and must not create again.
	ErrOutcomeUnknown = errors.New("provider: create outcome unknown")
)

// Window is one rate-limit window of a credential: at most Limit calls in
// any Period, refilled continuously (a token bucket of Limit tokens).
type Window struct {
	Name   string
	Limit  int
	Period time.Duration
}

// DigitalOceanWindows are DigitalOcean's published limits per token: 250
// requests a minute and 5,000 an hour.
func DigitalOceanWindows() []Window {
	return []Window{
		{Name: "minute", Limit: 250, Period: time.Minute},
		{Name: "hour", Limit: 5000, Period: time.Hour},
	}
}
