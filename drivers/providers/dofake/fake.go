// Package dofake is a stateful fake of the DigitalOcean API over real HTTP,
// the test peer of the DigitalOcean provider and the dev stack's provider.
// It speaks godo's wire format (github.com/digitalocean/godo works against
// it unchanged, through SetBaseURL) for what the instances domain uses:
// regions, sizes, images, droplets and their actions, tags; with
// DigitalOcean's per-token rate limits and switchable misbehaviour (Fault)
// for tests: injected 429s and 5xx, a create that takes effect but fails
// or drops the connection, slow actions, and a listing that lags behind
// creates. The admin surface under /_fake/ switches the same knobs over
// HTTP, so a test driving a separate process can flip them.
//
// State is in memory and safe for concurrent use. Time is read from
// Config.Now, so a test with a ManualClock sees droplets boot and actions
// complete when it advances the clock, without sleeping.
package dofake

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DigitalOcean's default rate limits per token.
const (
	DefaultPerMinute = 250
	DefaultPerHour   = 5000
)

// Settings are the knobs that may change while the fake runs.
type Settings struct {
	// BootDelay is how long a created droplet stays "new" before it is
	// "active" with its addresses (zero: active at the next request).
	BootDelay time.Duration
	// ActionDelay is how long a droplet action stays "in-progress"
	// (zero: completed at the next request). Raising it makes actions slow.
	ActionDelay time.Duration
	// ListLag is how long a created droplet stays out of listings (all,
	// by tag, by name, tag counts, delete by tag) while GET by id already
	// finds it: DigitalOcean's eventual consistency.
	ListLag time.Duration
	// DatabaseDelay is how long a database cluster or replica stays
	// "creating" (and a cluster "resizing") before it is "online".
	DatabaseDelay time.Duration
	// DeployDelay is how long an app's deployment takes to be ACTIVE and a
	// dedicated inference endpoint to be "active".
	DeployDelay time.Duration
	// PerMinute and PerHour are the rate limits per token (DigitalOcean's
	// 250 and 5,000 when zero or negative).
	PerMinute int
	PerHour   int
}

func (s Settings) normalized() Settings {
	if s.PerMinute <= 0 {
		s.PerMinute = DefaultPerMinute
	}
	if s.PerHour <= 0 {
		s.PerHour = DefaultPerHour
	}
	for _, d := range []*time.Duration{&s.BootDelay, &s.ActionDelay, &s.ListLag, &s.DatabaseDelay, &s.DeployDelay} {
		if *d < 0 {
			*d = 0
		}
	}
	return s
}

// Config is a fake's start.
type Config struct {
	Settings
	// Tokens are the bearer tokens the fake accepts; any other (or none)
	// is 401. AddToken accepts more later.
	Tokens []string
	// Now is the clock every delay and rate window is measured against;
	// time.Now when nil.
	Now func() time.Time
	// Regions, Sizes and Images are the catalog; DefaultRegions,
	// DefaultSizes and DefaultImages when nil. A region's Sizes are
	// derived from the sizes offered there.
	Regions []Region
	Sizes   []Size
	Images  []Image
	// OneClicks are the 1-Click apps (DefaultOneClicks when nil).
	OneClicks []OneClick
	// PreviewTokens are tokens (accepted too) whose account has previews
	// enabled: only they are answered the preview APIs (signals).
	PreviewTokens []string
	// Logger gets one line per request (never a token); discarded when nil.
	Logger *slog.Logger
}

// Fake is the fake API; it is an http.Handler.
type Fake struct {
	now  func() time.Time
	log  *slog.Logger
	mux  *http.ServeMux
	mu   sync.Mutex
	st   state
	rate rateLimits
}

// New makes a fake from cfg.
func New(cfg Config) *Fake {
	f := &Fake{now: cfg.Now, log: cfg.Logger}
	if f.now == nil {
		f.now = time.Now
	}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	f.st = newState(cfg)
	f.rate = newRateLimits()
	for _, t := range cfg.Tokens {
		f.st.tokens[t] = true
	}
	for _, t := range cfg.PreviewTokens {
		f.st.tokens[t], f.st.previews[t] = true, true
	}
	f.st.oneClicks = cfg.OneClicks
	if f.st.oneClicks == nil {
		f.st.oneClicks = DefaultOneClicks()
	}
	f.mux = http.NewServeMux()
	f.routes()
	return f
}

// ServeHTTP answers one request.
func (f *Fake) ServeHTTP(w http.ResponseWriter, r *http.Request) { f.mux.ServeHTTP(w, r) }

// AddToken makes the fake accept token.
func (f *Fake) AddToken(token string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.tokens[token] = true
}

// Settings answers the knobs in force.
func (f *Fake) Settings() Settings {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st.settings
}

// SetSettings changes the knobs; a droplet or action already under way
// keeps the delays it started with.
func (f *Fake) SetSettings(s Settings) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.settings = s.normalized()
}

// Stats are what tests count.
type Stats struct {
	// DropletsCreated counts droplets ever created, including creates
	// answered with an injected failure after they took effect.
	DropletsCreated int `json:"dropletsCreated"`
	// DropletsLive counts droplets not deleted.
	DropletsLive int `json:"dropletsLive"`
	// Requests counts the requests each route received (under /v2,
	// whatever their answer), keyed by its pattern: "POST /v2/droplets",
	// "GET /v2/droplets/{id}". Unknown paths count under "/".
	Requests map[string]int `json:"requests"`
	// Created counts the resources of each kind ever created ("droplets",
	// "databases", "databaseUsers", …; Kinds lists them), failed answers
	// included; Live those not deleted.
	Created map[string]int `json:"created"`
	Live    map[string]int `json:"live"`
	// DriftRewrites counts the reads a drift rule rewrote.
	DriftRewrites int `json:"driftRewrites"`
}

// Stats answers the counters.
func (f *Fake) Stats() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	req := make(map[string]int, len(f.st.requests))
	for k, v := range f.st.requests {
		req[k] = v
	}
	created, live := f.st.kindCounts()
	return Stats{
		DropletsCreated: f.st.created, DropletsLive: len(f.st.droplets), Requests: req,
		Created: created, Live: live, DriftRewrites: f.st.driftRewrites,
	}
}

// Requests answers how many requests route (a pattern, "POST /v2/droplets")
// received.
func (f *Fake) Requests(route string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st.requests[route]
}

// DropletsCreated answers how many droplets were ever created.
func (f *Fake) DropletsCreated() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st.created
}

// handler is a route's own work, called with the state's lock held and the
// state settled to now. It answers the status and the body (nil: none).
type handler func(r *http.Request, now time.Time) (int, any)

func (f *Fake) routes() {
	api := map[string]handler{
		"GET /v2/regions":                          f.listRegions,
		"GET /v2/sizes":                            f.listSizes,
		"GET /v2/images":                           f.listImages,
		"GET /v2/images/{id}":                      f.getImage,
		"POST /v2/droplets":                        f.createDroplets,
		"GET /v2/droplets":                         f.listDroplets,
		"DELETE /v2/droplets":                      f.deleteDropletsByTag,
		"GET /v2/droplets/{id}":                    f.getDroplet,
		"DELETE /v2/droplets/{id}":                 f.deleteDroplet,
		"POST /v2/droplets/{id}/actions":           f.postDropletAction,
		"GET /v2/droplets/{id}/actions":            f.listDropletActions,
		"GET /v2/droplets/{id}/actions/{actionId}": f.getDropletAction,
		"GET /v2/actions":                          f.listActions,
		"GET /v2/actions/{id}":                     f.getAction,
		"POST /v2/tags":                            f.createTag,
		"GET /v2/tags":                             f.listTags,
		"GET /v2/tags/{tag}":                       f.getTag,
		"DELETE /v2/tags/{tag}":                    f.deleteTag,
		"POST /v2/tags/{tag}/resources":            f.tagResources,
		"DELETE /v2/tags/{tag}/resources":          f.untagResources,
		"/":                                        f.notFound,
	}
	maps.Copy(api, f.databaseRoutes())
	maps.Copy(api, f.platformRoutes())
	for pattern, h := range api {
		f.mux.Handle(pattern, f.wrap(pattern, h))
	}
	f.adminRoutes()
}

// wrap runs what every API request goes through, in DigitalOcean's order:
// it is counted, authenticated, rate limited, then meets the first fault
// that matches it, then the route.
func (f *Fake) wrap(route string, h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requestID := newRequestID()
		w.Header().Set("X-Request-Id", requestID)
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)

		f.mu.Lock()
		// Read under the lock, so requests see time in the order they run.
		now := f.now()
		f.st.requests[route]++
		token, ok := bearer(r)
		if !ok || !f.st.tokens[token] {
			f.mu.Unlock()
			f.answer(w, r, route, http.StatusUnauthorized, errBody("unauthorized", "Unable to authenticate you", requestID))
			return
		}
		verdict := f.rate.take(token, f.st.settings, now)
		verdict.setHeaders(w.Header())
		if !verdict.allowed {
			f.mu.Unlock()
			w.Header().Set("Retry-After", strconv.Itoa(verdict.retryAfter))
			f.answer(w, r, route, http.StatusTooManyRequests, errBody("too_many_requests", "API Rate limit exceeded.", requestID))
			return
		}
		fault, faulted := f.st.faults.take(r)
		if faulted && !fault.Kind.applies() {
			f.mu.Unlock()
			f.misbehave(w, r, route, fault, now, requestID)
			return
		}
		f.st.settle(now)
		status, body := h(r, now)
		f.mu.Unlock()
		if e, isErr := body.(*errorBody); isErr {
			e.RequestID = requestID
		}
		if faulted {
			f.log.Info("dofake fault after apply", "method", r.Method, "route", route, "kind", fault.Kind, "appliedStatus", status)
			f.misbehaveAfter(w, r, route, fault, now, requestID, status, body)
			return
		}
		f.answer(w, r, route, status, body)
	})
}

const maxBody = 1 << 20

// answer writes a JSON body (or none) with status.
func (f *Fake) answer(w http.ResponseWriter, r *http.Request, route string, status int, body any) {
	f.log.Info("dofake request", "method", r.Method, "route", route, "status", status)
	if body == nil {
		w.WriteHeader(status)
		return
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // links' "&" as DigitalOcean writes it
	if err := enc.Encode(body); err != nil {
		status = http.StatusInternalServerError
		b.Reset()
		b.WriteString(`{"id":"server_error","message":"the fake could not encode its answer"}` + "\n")
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(b.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

func bearer(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", false
	}
	return token, true
}

func newRequestID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// errorBody is DigitalOcean's error answer.
type errorBody struct {
	ID        string `json:"id"`
	Message   string `json:"message"`
	RequestID string `json:"request_id,omitempty"`
}

func errBody(id, message, requestID string) *errorBody {
	return &errorBody{ID: id, Message: message, RequestID: requestID}
}

// fail is a handler's error answer; wrap fills in the request id.
func fail(status int, format string, args ...any) (int, any) {
	return status, &errorBody{ID: errorID(status), Message: fmt.Sprintf(format, args...)}
}

func errorID(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "bad_request"
	case http.StatusUnauthorized:
		return "unauthorized"
	case http.StatusForbidden:
		return "forbidden"
	case http.StatusNotFound:
		return "not_found"
	case http.StatusConflict:
		return "conflict"
	case http.StatusUnprocessableEntity:
		return "unprocessable_entity"
	case http.StatusTooManyRequests:
		return "too_many_requests"
	case http.StatusServiceUnavailable:
		return "service_unavailable"
	case http.StatusGatewayTimeout:
		return "gateway_timeout"
	default:
		if status >= 500 {
			return "server_error"
		}
		return "bad_request"
	}
}

func notFoundAnswer() (int, any) {
	return fail(http.StatusNotFound, "The resource you were accessing could not be found.")
}

func (f *Fake) notFound(*http.Request, time.Time) (int, any) { return notFoundAnswer() }

// decode reads a JSON body into v; a body that is not JSON is 400.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return fmt.Errorf("the request body is larger than %d bytes", maxBody)
		}
		return fmt.Errorf("the request body is not valid JSON: %v", err)
	}
	return nil
}
