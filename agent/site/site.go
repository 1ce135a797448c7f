// Package site is `bcd site`, the site agent: it authenticates with a site
// token, holds the site's boot lease (site:<siteId>:boot) with a fencing
// epoch, and while it holds the lease runs a Temporal worker on the site's
// task queue (site-<siteId>) serving the activities that must run inside
// the site's network: the health activity (sites.ActivitySiteHealth),
// which the control plane calls with sites.SiteHealthWorkflow, and the
// metal activities (workflows/metal.SiteActivities: BMC calls through the
// drivers, ramdisk boots served by the agent's boot server).
//
// Many agents may run for one site; only the lease holder serves. It
// renews the lease every third of its ttl and stops serving as soon as it
// loses the lease or, on its own clock, cannot renew before the lease would
// have expired (the API's lease expires no earlier, so two agents never
// both serve). It then goes back to acquiring, with backoff. When its
// context ends it stops serving and releases nothing: the lease expires.
package site

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/workers/temporalclient"
	"github.com/better-compute/better-compute/workflows/metal"
	"github.com/better-compute/better-compute/workflows/sites"
)

// Paths of the site agent's endpoints.
const (
	RegisterPath = protocol.SiteRegisterPath
	RenewPath    = protocol.SiteRenewPath
)

// ActivityHealth is the name of the health activity the agent serves.
const ActivityHealth = sites.ActivitySiteHealth

// Default backoff bounds between attempts to take the lease.
const (
	DefaultRetryMin = time.Second
	DefaultRetryMax = 10 * time.Second
)

const maxResponseBytes = 1 << 20

// Options configures Run.
type Options struct {
	// APIURL is the API's base URL, e.g. https://compute.example.com.
	APIURL string
	// Token is the site token (bcst_…). It is sent to the API only, never
	// logged.
	Token string
	// Holder names this agent instance (unique per process, e.g.
	// hostname-pid): the lease holder.
	Holder string
	// HTTPClient defaults to a client with a 30 s timeout.
	HTTPClient *http.Client
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Dial connects to Temporal; default temporalclient.Dial.
	Dial func(context.Context, temporalclient.Config) (client.Client, error)
	// RetryMin and RetryMax bound the backoff between attempts to take the
	// lease (defaults DefaultRetryMin, DefaultRetryMax).
	RetryMin, RetryMax time.Duration
	// OnState, when set, is called as the agent starts serving (after its
	// worker started) and stops (after its worker stopped).
	OnState func(State)
	// BMC serves the metal activities' BMC calls (the drivers' manager);
	// nil fails them as unsupported.
	BMC BMC
	// Boot configures the boot server.
	Boot BootOptions
}

// State is whether the agent serves the site's queue, and under which
// lease epoch.
type State struct {
	Serving bool
	SiteID  string
	Epoch   int64
	// BootURL is the boot server's URL ("" without one).
	BootURL string
}

// registration is the API's answer.
type registration protocol.SiteResult

func (r registration) ttl() time.Duration { return time.Duration(r.Lease.TTLMs) * time.Millisecond }

// errLeaseLost ends one term of serving; Run goes back to acquiring.
var errLeaseLost = errors.New("site lease lost")

type agent struct {
	o    Options
	log  *slog.Logger
	boot *bootServer
}

// Run is the agent: it takes the site's boot lease, serves the site's task
// queue while it holds it, and tries again (with backoff) when it does not.
// It returns nil when ctx ends, and an error when the token is refused
// (UNAUTHENTICATED) or the options or the API's answer are unusable.
func Run(ctx context.Context, o Options) error {
	if o.APIURL == "" || o.Token == "" || o.Holder == "" {
		return errors.New("site: the API URL, the site token and the holder are required")
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Timeout: 30 * time.Second}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Dial == nil {
		logger := o.Logger
		o.Dial = func(ctx context.Context, cfg temporalclient.Config) (client.Client, error) {
			return temporalclient.Dial(ctx, cfg, logger)
		}
	}
	if o.RetryMin <= 0 {
		o.RetryMin = DefaultRetryMin
	}
	if o.RetryMax < o.RetryMin {
		o.RetryMax = max(DefaultRetryMax, o.RetryMin)
	}
	a := &agent{o: o, log: o.Logger.With("component", "site-agent", "holder", o.Holder)}
	if o.Boot.Listen != "" {
		stop, err := a.startBootServer()
		if err != nil {
			return err
		}
		defer stop()
	}
	return a.run(ctx)
}

// startBootServer listens for the boot server for the whole run, so its
// address stays the same across lease terms; it serves only during one.
func (a *agent) startBootServer() (stop func(), err error) {
	b := a.o.Boot
	dir := b.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "bcd-site-boot-"); err != nil {
			return nil, fmt.Errorf("site: the boot server's directory: %w", err)
		}
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("site: the boot server's directory: %w", err)
	}
	ln, err := net.Listen("tcp", b.Listen)
	if err != nil {
		return nil, fmt.Errorf("site: the boot server: %w", err)
	}
	url := b.URL
	if url == "" {
		url = "http://" + ln.Addr().String()
	}
	apiURL := b.MachineAPIURL
	if apiURL == "" {
		apiURL = a.o.APIURL
	}
	log := a.log.With("component", "boot-server")
	a.boot = newBootServer(b, url, apiURL, dir, log)
	srv := &http.Server{Handler: a.boot.handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("the boot server stopped", "error", err.Error())
		}
	}()
	log.Info("boot server listening", "address", ln.Addr().String(), "url", url)
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		if b.Dir == "" {
			os.RemoveAll(dir)
		}
	}, nil
}

func (a *agent) run(ctx context.Context) error {
	var (
		tc     client.Client
		dialed temporalclient.Config
		// Waits double from RetryMin up to RetryMax, each drawn from
		// [cap/2, cap]: the library's ±1/3 around three quarters of the cap.
		retry = &backoff.ExponentialBackOff{InitialInterval: a.o.RetryMin * 3 / 4, RandomizationFactor: 1.0 / 3,
			Multiplier: 2, MaxInterval: a.o.RetryMax * 3 / 4}
	)
	retry.Reset()
	defer func() {
		if tc != nil {
			tc.Close()
		}
	}()
	wait := func() bool {
		t := time.NewTimer(retry.NextBackOff())
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	for {
		sent := time.Now()
		var reg registration
		err := a.post(ctx, RegisterPath, protocol.SiteRegisterRequest{Token: a.o.Token, Holder: a.o.Holder}, &reg)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			if permanent(err) {
				return err
			}
			if core.AsError(err).Code == core.CodeConflict {
				a.log.Debug("the site lease is held by another agent; waiting")
			} else {
				a.log.Warn("site registration failed; retrying", "error", err.Error())
			}
			if !wait() {
				return nil
			}
			continue
		}
		if reg.SiteID == "" || reg.TaskQueue == "" || reg.Lease.Epoch < 1 || reg.ttl() <= 0 {
			return errors.New("site: the API's registration answer is incomplete")
		}
		cfg := temporalclient.Config{Address: reg.Temporal.Address, Namespace: reg.Temporal.Namespace}
		if tc != nil && cfg != dialed {
			tc.Close()
			tc = nil
		}
		if tc == nil {
			if tc, err = a.o.Dial(ctx, cfg); err != nil {
				tc = nil
				a.log.Warn("could not reach Temporal; retrying", "address", cfg.Address, "error", err.Error())
				if !wait() {
					return nil
				}
				continue
			}
			dialed = cfg
		}
		retry.Reset()
		a.log.Info("took the site lease; serving", "site", reg.SiteID, "taskQueue", reg.TaskQueue, "epoch", reg.Lease.Epoch)
		err = a.serve(ctx, tc, reg, sent.Add(reg.ttl()))
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, errLeaseLost):
			a.log.Warn("lost the site lease; stopped serving", "site", reg.SiteID, "epoch", reg.Lease.Epoch)
		case permanent(err):
			return err
		case err != nil:
			a.log.Warn("stopped serving", "site", reg.SiteID, "error", err.Error())
		}
		if !wait() {
			return nil
		}
	}
}

// permanent errors end Run: a refused token or a refused request will not
// get better by retrying.
func permanent(err error) bool {
	var e *core.Error
	if !errors.As(err, &e) {
		return false
	}
	return e.Code == core.CodeUnauthn || e.Code == core.CodeInvalidInput || e.Code == core.CodeAccessDenied
}

// serve runs the worker of one lease term: until ctx ends, the lease is
// lost (CONFLICT) or deadline — the lease's end on this machine's clock,
// measured from before the request that took or renewed it — passes
// without a renewal.
func (a *agent) serve(ctx context.Context, tc client.Client, reg registration, deadline time.Time) error {
	h := &health{siteID: reg.SiteID, holder: a.o.Holder, epoch: reg.Lease.Epoch}
	h.valid.Store(true)
	termCtx, endTerm := context.WithCancel(ctx)
	t := &term{siteID: reg.SiteID, epoch: reg.Lease.Epoch, ctx: termCtx, a: a}
	w := worker.New(tc, reg.TaskQueue, worker.Options{Identity: a.o.Holder + "@" + reg.TaskQueue})
	sites.RegisterAgent(w, h.SiteHealth)
	metal.RegisterAgent(w, &metalActivities{t: t, bmc: a.o.BMC, boot: a.boot})
	if a.boot != nil {
		a.boot.startTerm(t)
	}
	if err := w.Start(); err != nil {
		endTerm()
		if a.boot != nil {
			a.boot.endTerm()
		}
		return fmt.Errorf("site: start the worker: %w", err)
	}
	state := State{SiteID: reg.SiteID, Epoch: reg.Lease.Epoch}
	if a.boot != nil {
		state.BootURL = a.boot.url
	}
	defer func() {
		// The term ends before the worker stops: calls in flight fail as
		// lease lost rather than finish for an agent that lost the site.
		h.valid.Store(false)
		endTerm()
		if a.boot != nil {
			a.boot.endTerm()
		}
		w.Stop()
		if a.o.OnState != nil {
			a.o.OnState(state)
		}
	}()
	if a.o.OnState != nil {
		serving := state
		serving.Serving = true
		a.o.OnState(serving)
	}
	ttl := reg.ttl()
	next := time.Now().Add(ttl / 3)
	for {
		t := time.NewTimer(time.Until(minTime(next, deadline)))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		if !time.Now().Before(deadline) {
			return errLeaseLost
		}
		sent := time.Now()
		rctx, cancel := context.WithDeadline(ctx, deadline)
		var got registration
		err := a.post(rctx, RenewPath, protocol.SiteRenewRequest{Token: a.o.Token, Holder: a.o.Holder, Epoch: reg.Lease.Epoch},
			&got)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil && got.Lease.Epoch == reg.Lease.Epoch:
			deadline = sent.Add(ttl)
			next = sent.Add(ttl / 3)
		case err == nil:
			return errLeaseLost
		case core.AsError(err).Code == core.CodeConflict:
			return errLeaseLost
		case permanent(err):
			return err
		default:
			a.log.Warn("site lease renewal failed; retrying", "error", err.Error())
			next = time.Now().Add(min(a.o.RetryMin, ttl/6))
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// post sends body to the API and decodes a 200 answer into out; any other
// answer is its *core.Error when it is one.
func (a *agent) post(ctx context.Context, path string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(a.o.APIURL, "/")+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.o.HTTPClient.Do(req)
	if err != nil {
		// The URL error repeats no body: the token is not in it.
		return fmt.Errorf("site: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return fmt.Errorf("site: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error *core.Error `json:"error"`
		}
		if json.Unmarshal(raw, &e) == nil && e.Error != nil {
			return e.Error
		}
		return fmt.Errorf("site: %s: HTTP %d", path, resp.StatusCode)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("site: %s: %w", path, err)
	}
	return nil
}

// health is the activity side of SiteHealthWorkflow for one lease term.
type health struct {
	siteID, holder string
	epoch          int64
	valid          atomic.Bool
}

// SiteHealth answers who serves the site, under which epoch, and when. It
// fails once the term ended, so a task that reaches a stopping worker is
// retried on the new holder's.
func (h *health) SiteHealth(_ context.Context, siteID string) (sites.SiteHealth, error) {
	if siteID != h.siteID {
		return sites.SiteHealth{}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("this agent serves site %s, not %s", h.siteID, siteID), "WrongSite", nil)
	}
	if !h.valid.Load() {
		return sites.SiteHealth{}, errLeaseLost
	}
	return sites.SiteHealth{SiteID: h.siteID, Holder: h.holder, Epoch: h.epoch, Time: time.Now().UTC()}, nil
}
