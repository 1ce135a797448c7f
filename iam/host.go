package iam

import (
	"bytes"
	"context"
	"crypto/hmac"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/better-compute/core"
)

// DefaultRefreshWait is how long the IAM host's refresh handler waits at
// most for its compute replica to replay a refresh's LSN.
const DefaultRefreshWait = 2 * time.Second

// MaxHostBody is the largest request body HostHandler reads.
const MaxHostBody = 1 << 20

// refreshPoll is how often the refresh handler reads the replica's position
// while it waits.
const refreshPoll = 10 * time.Millisecond

// HostConfig configures HostHandler.
type HostConfig struct {
	// Port answers: the embedded IAM, normally behind a CachingPort (so the
	// re-authentication of every decision's credential is cached). Required.
	Port Port
	// Projection is the compute projection the host's resolver reads, loaded
	// from the host's own compute database connection (normally a streaming
	// replica). The refresh handler re-reads rows in it. Required with
	// RefreshSecret.
	Projection *Projection
	// ReplicaLSN reads how far the host's compute database has replayed
	// (pg_last_wal_replay_lsn() on a replica; pg_current_wal_lsn() on a
	// primary). Required with RefreshSecret.
	ReplicaLSN func(ctx context.Context) (LSN, error)
	// RefreshSecret is the HMAC-SHA256 key of signed refreshes
	// (RemoteRefresh.Secret), at least MinRefreshSecret bytes. Without it
	// the refresh handler refuses every call with UNAVAILABLE.
	RefreshSecret []byte
	// RefreshWait bounds the wait for the replica; DefaultRefreshWait when
	// zero.
	RefreshWait time.Duration
	Logger      *slog.Logger
}

// iamHost is the handler HostHandler returns.
type iamHost struct {
	port   Port
	proj   *Projection
	replay func(ctx context.Context) (LSN, error)
	secret []byte
	wait   time.Duration
	log    *slog.Logger
	now    func() time.Time
}

// HostHandler serves an IAM host for RemotePort: POST, JSON, under
// HostPathPrefix (the protocol is described in remote.go):
//
//	/iam/v1/authenticate  /iam/v1/authorize  /iam/v1/require
//	/iam/v1/authorizeMany  /iam/v1/refresh
//
// The caller's credential is read from the Authorization header, the
// bc_session cookie, Origin, User-Agent and X-Request-Id, and its source
// address ONLY from X-Forwarded-For, which RemotePort sets to the address the
// API server verified (Credential.SourceIP); a header that is not exactly one
// IP address gives no address. The socket peer is never used: it is an API
// server. For that reason the host must be reachable only by trusted API
// servers (a private network, mutual TLS or an authenticating proxy that
// strips forwarding headers); deployments must never expose it to clients,
// who could otherwise choose the address policies see.
//
// authorize, require and authorizeMany authenticate the forwarded credential
// again, through Port (so a CachingPort answers from its cache), and decide
// for that Caller: the body carries only tenantId, action, resource, context
// and requestId (any other field is INVALID_INPUT), never an identity.
// Errors answer in the API's error shape {"error":{"code","message",
// "details"}} with the code's status; a denial of require is an opaque
// ACCESS_DENIED, a resource that does not exist NOT_FOUND (it aborts a whole
// authorizeMany), a batch of more than MaxBatch INVALID_INPUT (as the
// embedded port answers, even when Port would take more); 405 for another
// HTTP method.
//
// refresh takes a signed {tenantId, type, id, lsn} (RefreshSignatureHeader),
// waits at most RefreshWait until ReplicaLSN reaches lsn and re-reads that
// row (Projection.Refresh). A missing or malformed signature is 401, a wrong
// or stale one (RefreshMaxSkew) 403, and the projection is then untouched;
// a replica that does not catch up in time, or a failed re-read, is 503
// UNAVAILABLE. A signed body may be replayed within RefreshMaxSkew: a
// refresh only re-reads a row, so that is harmless.
//
// A nil Port, or a RefreshSecret shorter than MinRefreshSecret or without
// Projection and ReplicaLSN, is INVALID_CONFIG.
func HostHandler(cfg HostConfig) (http.Handler, error) {
	if cfg.Port == nil {
		return nil, core.Errorf(core.CodeInvalidConfig, "iam: the IAM host needs a port")
	}
	h := &iamHost{port: cfg.Port, proj: cfg.Projection, replay: cfg.ReplicaLSN, wait: cfg.RefreshWait,
		log: cfg.Logger, now: time.Now}
	if len(cfg.RefreshSecret) > 0 {
		if len(cfg.RefreshSecret) < MinRefreshSecret {
			return nil, core.Errorf(core.CodeInvalidConfig, "iam: the refresh secret must be at least %d bytes", MinRefreshSecret)
		}
		if cfg.Projection == nil || cfg.ReplicaLSN == nil {
			return nil, core.Errorf(core.CodeInvalidConfig, "iam: the IAM host's refresh needs the projection and ReplicaLSN")
		}
		h.secret = bytes.Clone(cfg.RefreshSecret)
	}
	if h.wait <= 0 {
		h.wait = DefaultRefreshWait
	}
	if h.log == nil {
		h.log = slog.Default()
	}
	return h, nil
}

func (h *iamHost) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		hostWriteError(w, http.StatusMethodNotAllowed, core.Errorf(core.CodeInvalidInput, "use POST"))
		return
	}
	switch r.URL.Path {
	case HostPathAuthenticate:
		h.authenticate(w, r)
	case HostPathAuthorize:
		h.decide(w, r, func(ctx context.Context, req Request) (any, error) {
			return h.port.Authorize(ctx, req)
		})
	case HostPathRequire:
		h.decide(w, r, func(ctx context.Context, req Request) (any, error) {
			if err := h.port.Require(ctx, req); err != nil {
				return nil, err
			}
			return wireOK{OK: true}, nil
		})
	case HostPathAuthorizeMany:
		h.authorizeMany(w, r)
	case HostPathRefresh:
		h.refresh(w, r)
	case HostPathTenant:
		h.tenantKnown(w, r)
	default:
		h.writeErr(w, r, core.Errorf(core.CodeNotFound, "no IAM host method %q", r.URL.Path))
	}
}

// credential reads the forwarded credential. The source address is the one
// X-Forwarded-For value, when it is an IP address.
func (h *iamHost) credential(r *http.Request) Credential {
	cred := Credential{
		Authorization: r.Header.Get("Authorization"),
		RequestID:     r.Header.Get("X-Request-Id"),
		Origin:        r.Header.Get("Origin"),
		UserAgent:     r.Header.Get("User-Agent"),
	}
	if c, err := r.Cookie(SessionCookie); err == nil {
		cred.Cookie = c.Value
	}
	if xff := r.Header.Values("X-Forwarded-For"); len(xff) > 0 {
		ip, err := netip.ParseAddr(strings.TrimSpace(xff[0]))
		if len(xff) == 1 && err == nil {
			cred.SourceIP = ip.String()
		} else {
			h.log.WarnContext(r.Context(), "iam host: X-Forwarded-For is not one IP address; deciding without a source address "+
				"(is a proxy between the API servers and the IAM host appending to it?)")
		}
	}
	return cred
}

// caller authenticates the forwarded credential through the port.
func (h *iamHost) caller(r *http.Request) (*Caller, error) {
	cred := h.credential(r)
	if !cred.Present() {
		return nil, core.Errorf(core.CodeUnauthn, "a credential is required")
	}
	return h.port.Authenticate(r.Context(), cred)
}

func (h *iamHost) authenticate(w http.ResponseWriter, r *http.Request) {
	c, err := h.caller(r)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	hostWriteJSON(w, http.StatusOK, c)
}

func requestOf(c *Caller, in *wireRequest) Request {
	return Request{Caller: c, TenantID: in.TenantID, Action: in.Action, Resource: in.Resource,
		Context: in.Context, RequestID: in.RequestID}
}

func (h *iamHost) decide(w http.ResponseWriter, r *http.Request, fn func(context.Context, Request) (any, error)) {
	c, err := h.caller(r)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	var in wireRequest
	if err := readStrict(w, r, &in); err != nil {
		h.writeErr(w, r, err)
		return
	}
	out, err := fn(r.Context(), requestOf(c, &in))
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	hostWriteJSON(w, http.StatusOK, out)
}

func (h *iamHost) authorizeMany(w http.ResponseWriter, r *http.Request) {
	c, err := h.caller(r)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	var in wireBatch
	if err := readStrict(w, r, &in); err != nil {
		h.writeErr(w, r, err)
		return
	}
	if len(in.Requests) > MaxBatch { // bounded work per call, whatever Port would take
		h.writeErr(w, r, core.Errorf(core.CodeInvalidInput, "at most %d requests in one batch, got %d", MaxBatch, len(in.Requests)).
			WithDetails(map[string]any{"field": "requests", "max": MaxBatch}))
		return
	}
	reqs := make([]Request, len(in.Requests))
	for i := range in.Requests {
		reqs[i] = requestOf(c, &in.Requests[i])
	}
	ds, err := h.port.AuthorizeMany(r.Context(), reqs)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	if ds == nil {
		ds = []Decision{}
	}
	hostWriteJSON(w, http.StatusOK, wireDecisions{Decisions: ds})
}

// refresh serves a signed refresh: signature first, then the body, then the
// wait for the replica, then the re-read.
func (h *iamHost) refresh(w http.ResponseWriter, r *http.Request) {
	if h.secret == nil {
		h.writeErr(w, r, core.Errorf(core.CodeUnavailable, "refresh is not configured on this IAM host"))
		return
	}
	body, err := readBody(w, r)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	if err := h.verify(r.Header.Values(RefreshSignatureHeader), body); err != nil {
		h.log.WarnContext(r.Context(), "iam host: refresh refused", "error", err.Error())
		h.writeErr(w, r, err)
		return
	}
	var in wireRefresh
	if err := decodeStrict(body, &in); err != nil {
		h.writeErr(w, r, err)
		return
	}
	if in.TenantID == "" || in.Type == "" || in.ID == "" || in.LSN == 0 {
		h.writeErr(w, r, core.Errorf(core.CodeInvalidInput, "a refresh needs tenantId, type, id and lsn"))
		return
	}
	ctx := r.Context()
	if err := h.waitReplay(ctx, in.LSN); err != nil {
		h.log.WarnContext(ctx, "iam host: refresh failed: the replica did not catch up", "lsn", in.LSN.String(),
			"wait", h.wait.String(), "error", err.Error())
		h.writeErr(w, r, err)
		return
	}
	if err := h.proj.Refresh(ctx, in.Type, in.ID, in.TenantID); err != nil {
		h.writeErr(w, r, err)
		return
	}
	hostWriteJSON(w, http.StatusOK, wireOK{OK: true})
}

// verify checks a refresh's signature header: UNAUTHENTICATED when it is
// missing or malformed, ACCESS_DENIED when it does not match or its
// timestamp is more than RefreshMaxSkew away.
func (h *iamHost) verify(values []string, body []byte) error {
	if len(values) != 1 {
		return core.Errorf(core.CodeUnauthn, "a refresh must carry one %s header", RefreshSignatureHeader)
	}
	var ts, mac string
	for _, part := range strings.Split(values[0], ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			mac = v
		}
	}
	ms, err := strconv.ParseInt(ts, 10, 64)
	sum, herr := hex.DecodeString(mac)
	if err != nil || herr != nil || len(sum) != 32 {
		return core.Errorf(core.CodeUnauthn, "the %s header is malformed", RefreshSignatureHeader)
	}
	if !hmac.Equal(sum, refreshMAC(h.secret, ts, body)) {
		return core.Errorf(core.CodeAccessDenied, "the refresh's signature does not match")
	}
	if skew := h.now().Sub(time.UnixMilli(ms)); skew > RefreshMaxSkew || skew < -RefreshMaxSkew {
		return core.Errorf(core.CodeAccessDenied, "the refresh's timestamp is %s away from this host's clock", skew.Round(time.Millisecond))
	}
	return nil
}

// waitReplay waits until the replica has replayed lsn, polling every
// refreshPoll, at most h.wait and within ctx. Failures are UNAVAILABLE.
func (h *iamHost) waitReplay(ctx context.Context, lsn LSN) error {
	ctx, cancel := context.WithTimeout(ctx, h.wait)
	defer cancel()
	tick := time.NewTicker(refreshPoll)
	defer tick.Stop()
	var last LSN
	var lastErr error
	for {
		cur, err := h.replay(ctx)
		if err == nil && cur >= lsn {
			return nil
		}
		if err == nil {
			last = cur
		} else {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			cause := ctx.Err()
			if lastErr != nil {
				cause = errors.Join(cause, lastErr)
			}
			return core.Wrap(core.CodeUnavailable, cause, "IAM's replica has not caught up with compute").
				WithDetails(map[string]any{"lsn": lsn.String(), "replayed": last.String()})
		case <-tick.C:
		}
	}
}

func (h *iamHost) writeErr(w http.ResponseWriter, r *http.Request, err error) {
	e := core.AsError(err)
	switch e.Code {
	case core.CodeInternal:
		h.log.ErrorContext(r.Context(), "iam host: call failed", "path", r.URL.Path, "error", err.Error())
	case core.CodeUnavailable:
		h.log.WarnContext(r.Context(), "iam host: unavailable", "path", r.URL.Path, "error", err.Error())
	}
	hostWriteError(w, e.Code.HTTPStatus(), e)
}

func hostWriteError(w http.ResponseWriter, status int, e *core.Error) {
	hostWriteJSON(w, status, wireError{Error: e})
}

func hostWriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxHostBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, core.Errorf(core.CodeInvalidInput, "the body is larger than %d bytes", MaxHostBody)
		}
		return nil, core.Errorf(core.CodeInvalidInput, "the body could not be read")
	}
	return body, nil
}

func readStrict(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := readBody(w, r)
	if err != nil {
		return err
	}
	return decodeStrict(body, v)
}

// decodeStrict decodes one JSON value, refusing unknown fields and trailing
// data; numbers stay json.Number so that integers keep every digit.
func decodeStrict(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return core.Errorf(core.CodeInvalidInput, "the body is not a valid input: %v", err)
	}
	if dec.More() {
		return core.Errorf(core.CodeInvalidInput, "the body holds more than one JSON value")
	}
	return nil
}
