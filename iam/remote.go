package iam

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/netip"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/cedar-policy/cedar-go/types"

	"github.com/better-compute/better-compute/core"

	"github.com/better-compute/better-compute/store"
)

// Remote mode ("How the resolver answers" in the actions-and-resources
// spec): the API servers ask a separate IAM host over HTTP (HostHandler, in
// host.go) through RemotePort. The wire protocol, all POST with JSON bodies
// under HostPathPrefix:
//
//	authenticate   no body                                            → Caller
//	authorize      {tenantId, action, resource{type,id}, context, requestId} → Decision
//	require        the same                                           → {"ok":true}, or ACCESS_DENIED
//	authorizeMany  {"requests":[…up to MaxBatch of the above]}        → {"decisions":[…]}
//	refresh        {tenantId, type, id, lsn} signed (X-BC-Signature)  → {"ok":true}
//
// The caller's credential travels as headers, never in a body: Authorization,
// Cookie (bc_session only, and only when there is no bearer), Origin,
// User-Agent, X-Request-Id, and its verified source address
// (Credential.SourceIP) as the only X-Forwarded-For value. Errors come back
// in the API's error shape {"error":{"code","message","details"}} with the
// code's status.

// HostPathPrefix is where HostHandler serves and RemotePort calls.
const HostPathPrefix = "/iam/v1/"

// Paths of the IAM host's methods.
const (
	HostPathAuthenticate  = HostPathPrefix + "authenticate"
	HostPathAuthorize     = HostPathPrefix + "authorize"
	HostPathRequire       = HostPathPrefix + "require"
	HostPathAuthorizeMany = HostPathPrefix + "authorizeMany"
	HostPathRefresh       = HostPathPrefix + "refresh"
)

// Signed refresh. The port signs the exact body it sends:
//
//	X-BC-Signature: t=<unix milliseconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>
//
// and the host refuses a missing or malformed header (401 UNAUTHENTICATED),
// a MAC that does not match or a timestamp more than RefreshMaxSkew from its
// clock, either way (403 ACCESS_DENIED).
const (
	RefreshSignatureHeader = "X-BC-Signature"
	RefreshMaxSkew         = 60 * time.Second
	// MinRefreshSecret is the shortest refresh secret accepted, in bytes.
	MinRefreshSecret = 32
)

// DefaultRemoteTimeout bounds one call of RemotePort to the IAM host
// (within the caller's own deadline). It exceeds the host's refresh wait
// (DefaultRefreshWait) plus its projection's DefaultRefreshTimeout.
const DefaultRemoteTimeout = 5 * time.Second

// maxHostAnswer is the largest answer RemotePort reads from the host.
const maxHostAnswer = 1 << 20

// LSN is a PostgreSQL WAL position; the refresh protocol carries it in
// PostgreSQL's text form.
type LSN = store.LSN

// ---- the remote port ----

// RemoteConfig configures NewRemotePort.
type RemoteConfig struct {
	// BaseURL is the IAM host's address, e.g. "https://iam.internal:8443";
	// the port calls BaseURL + HostPathPrefix + method. Required.
	BaseURL string
	// HTTPClient, optional, makes the calls; by default a client of its own
	// that keeps up to 64 idle connections to the host, uses no proxy from
	// the environment and follows no redirect.
	HTTPClient *http.Client
	// Refresh, optional, makes the port a Refresher: without it admissions
	// decide on the host replica's copy, up to the replica lag plus the
	// projection's tail interval old.
	Refresh *RemoteRefresh
	// Timeout bounds each call, within the caller's deadline;
	// DefaultRemoteTimeout when zero.
	Timeout time.Duration
}

// RemoteRefresh configures the signed refresh of RemotePort.
type RemoteRefresh struct {
	// URL is the host's refresh handler; BaseURL + HostPathRefresh when "".
	URL string
	// Secret is the HMAC-SHA256 key shared with the host
	// (HostConfig.RefreshSecret), at least MinRefreshSecret bytes.
	Secret []byte
	// PrimaryLSN reads the compute primary's current WAL position
	// (pg_current_wal_lsn()). Required.
	PrimaryLSN func(ctx context.Context) (LSN, error)
}

// RemotePort is the IamPort of remote mode: every call goes to an IAM host
// (HostHandler) over HTTP. A Caller it returns carries the credential it was
// authenticated with, and a decision forwards that credential, which the host
// authenticates again and decides for: a Caller made by any other port, or
// by hand, is UNAUTHENTICATED here. Any failure to reach the host, and any
// answer that is not the protocol's, is core UNAVAILABLE (fail closed);
// the host's own errors come back with their code.
//
// RemotePort itself has no RefreshResource: NewRemotePort returns a view
// that implements Refresher only when RemoteConfig.Refresh is set.
type RemotePort struct {
	base    string
	client  *http.Client
	timeout time.Duration
	refresh *remoteRefresher
	tenants knownTenants
}

type remoteRefresher struct {
	url    string
	secret []byte
	lsn    func(ctx context.Context) (LSN, error)
}

var _ Port = (*RemotePort)(nil)

// refreshingRemotePort is a RemotePort with its signed refresh.
type refreshingRemotePort struct{ *RemotePort }

var _ Refresher = refreshingRemotePort{}

// RefreshResource asks the IAM host to re-read r once its replica has
// replayed the compute primary's current WAL position (see RemoteRefresh).
func (p refreshingRemotePort) RefreshResource(ctx context.Context, tenantID string, r Resource) error {
	return p.refreshResource(ctx, tenantID, r)
}

// NewRemotePort makes the remote port. It returns a *RemotePort, or with
// RemoteConfig.Refresh a view of one that also implements Refresher. A
// missing or malformed BaseURL or refresh URL, a short secret or no
// PrimaryLSN is INVALID_CONFIG.
func NewRemotePort(cfg RemoteConfig) (Port, error) {
	base, err := remoteURL(cfg.BaseURL, "BaseURL")
	if err != nil {
		return nil, err
	}
	p := &RemotePort{base: strings.TrimRight(base, "/"), client: cfg.HTTPClient, timeout: cfg.Timeout, tenants: newKnownTenants()}
	if p.client == nil {
		p.client = defaultRemoteClient()
	}
	if p.timeout <= 0 {
		p.timeout = DefaultRemoteTimeout
	}
	if cfg.Refresh == nil {
		return p, nil
	}
	rf := cfg.Refresh
	if len(rf.Secret) < MinRefreshSecret {
		return nil, core.Errorf(core.CodeInvalidConfig, "iam: the refresh secret must be at least %d bytes", MinRefreshSecret)
	}
	if rf.PrimaryLSN == nil {
		return nil, core.Errorf(core.CodeInvalidConfig, "iam: the remote refresh needs PrimaryLSN")
	}
	u := p.base + HostPathRefresh
	if rf.URL != "" {
		if u, err = remoteURL(rf.URL, "Refresh.URL"); err != nil {
			return nil, err
		}
	}
	p.refresh = &remoteRefresher{url: u, secret: bytes.Clone(rf.Secret), lsn: rf.PrimaryLSN}
	return refreshingRemotePort{p}, nil
}

func remoteURL(s, field string) (string, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return "", core.Errorf(core.CodeInvalidConfig, "iam: the remote port's %s %q is not an http(s) URL", field, s)
	}
	return u.String(), nil
}

func defaultRemoteClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	// No HTTP(S)_PROXY from the environment: credentials go to the host
	// directly, and no proxy may add a forwarding header.
	t.Proxy = nil
	t.MaxIdleConns = 256
	t.MaxIdleConnsPerHost = 64
	return &http.Client{
		Transport: t,
		// A redirect is not the protocol's: its 3xx fails closed.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// wireRequest is one decision request in a body. The caller is not in it:
// the host authenticates the forwarded credential.
type wireRequest struct {
	TenantID  string         `json:"tenantId"`
	Action    string         `json:"action"`
	Resource  Resource       `json:"resource"`
	Context   map[string]any `json:"context,omitempty"`
	RequestID string         `json:"requestId,omitempty"`
}

type wireBatch struct {
	Requests []wireRequest `json:"requests"`
}

type wireDecisions struct {
	Decisions []Decision `json:"decisions"`
}

type wireOK struct {
	OK bool `json:"ok"`
}

type wireRefresh struct {
	TenantID string `json:"tenantId"`
	Type     string `json:"type"`
	ID       string `json:"id"`
	LSN      LSN    `json:"lsn"`
}

type wireError struct {
	Error *core.Error `json:"error"`
}

// wireOf is r as the host gets it. Its context travels as JSON, so values
// are checked first: what the embedded port could not turn into Cedar, and
// Cedar values other than strings, longs and booleans (whose JSON form
// would not read back as the same value), are INVALID_INPUT as the embedded
// port answers. Nil values and the keys the port sets itself (sourceIp,
// mfa, …), which the embedded port ignores, are left out.
func wireOf(r *Request) (wireRequest, error) {
	w := wireRequest{TenantID: r.TenantID, Action: r.Action, Resource: r.Resource, RequestID: r.RequestID}
	if len(r.Context) == 0 {
		return w, nil
	}
	w.Context = make(map[string]any, len(r.Context))
	for k, v := range r.Context {
		if v == nil || cedarReservedContextKey(k) {
			continue
		}
		if err := wireValue(v); err != nil {
			return w, core.Errorf(core.CodeInvalidInput, "request context %q: %v", k, err).
				WithDetails(map[string]any{"field": "context." + k})
		}
		w.Context[k] = v
	}
	return w, nil
}

// wireValue checks that a context value reads back from JSON as the same
// Cedar value.
func wireValue(v any) error {
	switch x := v.(type) {
	case nil, string, bool, []string, json.Number, types.String, types.Long, types.Boolean:
		return nil
	case float32:
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return fmt.Errorf("%v has no Cedar form", x)
		}
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Errorf("%v has no Cedar form", x)
		}
	case types.Value:
		return fmt.Errorf("a Cedar %T cannot be sent to a remote IAM", v)
	}
	if _, ok := cedarNumber(v); ok {
		return nil
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Slice, reflect.Array:
		for i := range rv.Len() {
			if err := wireValue(rv.Index(i).Interface()); err != nil {
				return err
			}
		}
		return nil
	case reflect.Map:
		if rv.Type().Key().Kind() != reflect.String {
			break
		}
		for it := rv.MapRange(); it.Next(); {
			if err := wireValue(it.Value().Interface()); err != nil {
				return fmt.Errorf("%s: %w", it.Key().String(), err)
			}
		}
		return nil
	}
	return fmt.Errorf("a %T has no Cedar form", v)
}

func unauthenticated() error { return core.Errorf(core.CodeUnauthn, "the credential is not valid") }

// Authenticate asks the host who presents cred. The Caller keeps cred (less
// its SourceIP and RequestID, which each decision supplies) for decisions.
func (p *RemotePort) Authenticate(ctx context.Context, cred Credential) (*Caller, error) {
	if !cred.Present() {
		return nil, unauthenticated()
	}
	h, err := forwardHeaders(cred, cred.SourceIP, cred.RequestID)
	if err != nil {
		return nil, err
	}
	var c Caller
	if err := p.call(ctx, HostPathAuthenticate, h, nil, &c); err != nil {
		return nil, err
	}
	if c.IdentityID == "" || c.TenantID == "" {
		return nil, core.Errorf(core.CodeUnavailable, "IAM is unavailable: the host answered no caller")
	}
	kept := cred
	kept.SourceIP, kept.RequestID = "", ""
	c.SourceIP = cred.SourceIP
	c.credential = &kept
	return &c, nil
}

// decisionHeaders are the headers of a decision for r's caller: its
// credential, its SourceIP and r's RequestID.
func decisionHeaders(r *Request) (http.Header, error) {
	if r.Caller == nil || r.Caller.credential == nil {
		return nil, core.Errorf(core.CodeUnauthn, "no authenticated caller")
	}
	return forwardHeaders(*r.Caller.credential, r.Caller.SourceIP, r.RequestID)
}

// Authorize asks the host for a read's decision.
func (p *RemotePort) Authorize(ctx context.Context, req Request) (Decision, error) {
	h, err := decisionHeaders(&req)
	if err != nil {
		return Decision{}, err
	}
	in, err := wireOf(&req)
	if err != nil {
		return Decision{}, err
	}
	var d Decision
	if err := p.call(ctx, HostPathAuthorize, h, in, &d); err != nil {
		return Decision{}, err
	}
	return d, nil
}

// Require asks the host for a mutation's decision: nil when allowed,
// ACCESS_DENIED otherwise.
func (p *RemotePort) Require(ctx context.Context, req Request) error {
	h, err := decisionHeaders(&req)
	if err != nil {
		return err
	}
	in, err := wireOf(&req)
	if err != nil {
		return err
	}
	var ok wireOK
	if err := p.call(ctx, HostPathRequire, h, in, &ok); err != nil {
		return err
	}
	if !ok.OK {
		return core.Errorf(core.CodeUnavailable, "IAM is unavailable: the host's answer is not an allow")
	}
	return nil
}

// AuthorizeMany asks the host for up to MaxBatch decisions, answered in
// order (more is the host's INVALID_INPUT, as with the embedded port).
// Requests of different callers (or of one caller from different addresses)
// go as one call each; a NOT_FOUND of any aborts the whole batch.
func (p *RemotePort) AuthorizeMany(ctx context.Context, reqs []Request) ([]Decision, error) {
	out := make([]Decision, len(reqs))
	if len(reqs) == 0 {
		return out, nil
	}
	type group struct {
		h   http.Header
		idx []int
	}
	var groups []*group
	byKey := map[string]*group{}
	wire := make([]wireRequest, len(reqs))
	for i := range reqs {
		h, err := decisionHeaders(&reqs[i])
		if err != nil {
			return nil, err
		}
		if wire[i], err = wireOf(&reqs[i]); err != nil {
			return nil, err
		}
		// X-Request-Id comes from the group's first request: each request's
		// own id is in the body.
		key := strings.Join([]string{h.Get("Authorization"), h.Get("Cookie"), h.Get("Origin"),
			h.Get("User-Agent"), h.Get("X-Forwarded-For")}, "\x00")
		g, ok := byKey[key]
		if !ok {
			g = &group{h: h}
			byKey[key] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
	}
	for _, g := range groups {
		batch := wireBatch{Requests: make([]wireRequest, len(g.idx))}
		for j, i := range g.idx {
			batch.Requests[j] = wire[i]
		}
		var ds wireDecisions
		if err := p.call(ctx, HostPathAuthorizeMany, g.h, batch, &ds); err != nil {
			return nil, err
		}
		if len(ds.Decisions) != len(g.idx) {
			return nil, core.Errorf(core.CodeUnavailable, "IAM is unavailable: the host answered %d decisions for %d requests",
				len(ds.Decisions), len(g.idx))
		}
		for j, i := range g.idx {
			out[i] = ds.Decisions[j]
		}
	}
	return out, nil
}

// refreshResource posts the signed {tenantId, type, id, lsn} with the
// primary's current WAL position. Every failure is UNAVAILABLE.
func (p *RemotePort) refreshResource(ctx context.Context, tenantID string, r Resource) error {
	rf := p.refresh
	if rf == nil { // unreachable: only the refreshing view calls it
		return core.Errorf(core.CodeUnavailable, "IAM refresh is not configured")
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	lsn, err := rf.lsn(ctx)
	if err != nil {
		return core.Wrap(core.CodeUnavailable, err, "the IAM refresh is unavailable: the primary's WAL position could not be read")
	}
	body, err := json.Marshal(wireRefresh{TenantID: tenantID, Type: r.Type, ID: r.ID, LSN: lsn})
	if err != nil {
		return core.Wrap(core.CodeUnavailable, err, "the IAM refresh is unavailable")
	}
	h := http.Header{}
	h.Set(RefreshSignatureHeader, signRefresh(rf.secret, time.Now(), body))
	var ok wireOK
	if err := p.post(ctx, rf.url, h, body, &ok); err != nil {
		// A refusal (a bad signature, a bad body) fails closed as well.
		if e := core.AsError(err); e.Code != core.CodeUnavailable {
			return core.Wrap(core.CodeUnavailable, err, "the IAM refresh was refused")
		}
		return err
	}
	if !ok.OK {
		return core.Errorf(core.CodeUnavailable, "the IAM refresh is unavailable: the host did not confirm it")
	}
	return nil
}

// signRefresh is the X-BC-Signature value of body at t.
func signRefresh(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.UnixMilli(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(refreshMAC(secret, ts, body))
}

func refreshMAC(secret []byte, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// call posts in (nil: an empty body) to the host's path and decodes its
// answer into out.
func (p *RemotePort) call(ctx context.Context, path string, h http.Header, in, out any) error {
	var body []byte
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			// A context value JSON cannot carry; the embedded port refuses
			// what Cedar cannot carry the same way.
			return core.Errorf(core.CodeInvalidInput, "the request cannot be sent to IAM: %v", err).
				WithDetails(map[string]any{"field": "context"})
		}
		body = b
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	return p.post(ctx, p.base+path, h, body, out)
}

// post sends one request and maps the answer: a 2xx decodes into out; an
// error in the API's shape whose code matches its 4xx status comes back as
// that *core.Error; anything else (a transport failure, a 5xx, a body that
// is not the protocol's) is UNAVAILABLE.
func (p *RemotePort) post(ctx context.Context, u string, h http.Header, body []byte, out any) error {
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return core.Wrap(core.CodeUnavailable, err, "IAM is unavailable")
	}
	hreq.Header = h
	if h == nil {
		hreq.Header = http.Header{}
	}
	if _, ok := hreq.Header["User-Agent"]; !ok {
		hreq.Header["User-Agent"] = []string{""} // no Go-http-client default: the host sees none
	}
	if body != nil {
		hreq.Header.Set("Content-Type", "application/json")
	}
	resp, err := p.client.Do(hreq)
	if err != nil {
		return core.Wrap(core.CodeUnavailable, err, "IAM is unavailable")
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxHostAnswer+1))
	if err != nil {
		return core.Wrap(core.CodeUnavailable, err, "IAM is unavailable")
	}
	if len(data) > maxHostAnswer {
		return core.Errorf(core.CodeUnavailable, "IAM is unavailable: the host's answer is larger than %d bytes", maxHostAnswer)
	}
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		if err := json.Unmarshal(data, out); err != nil {
			return core.Wrap(core.CodeUnavailable, err, "IAM is unavailable: the host's answer does not decode")
		}
		return nil
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		var we wireError
		if json.Unmarshal(data, &we) == nil && we.Error != nil && knownCode(we.Error.Code) &&
			we.Error.Code.HTTPStatus() == resp.StatusCode {
			e := core.Errorf(we.Error.Code, "%s", we.Error.Message)
			if len(we.Error.Details) > 0 {
				e = e.WithDetails(we.Error.Details)
			}
			return e
		}
		return core.Errorf(core.CodeUnavailable, "IAM is unavailable: the host answered %d", resp.StatusCode)
	default:
		cause := fmt.Errorf("the IAM host answered %d", resp.StatusCode)
		var we wireError
		if json.Unmarshal(data, &we) == nil && we.Error != nil {
			cause = fmt.Errorf("the IAM host answered %d: %s: %s", resp.StatusCode, we.Error.Code, we.Error.Message)
		}
		return core.Wrap(core.CodeUnavailable, cause, "IAM is unavailable")
	}
}

// knownCode reports whether c is a code of the API contract that a host may
// answer with a 4xx.
func knownCode(c core.Code) bool {
	switch c {
	case core.CodeInvalidInput, core.CodeUnauthn, core.CodeAccessDenied, core.CodeNotFound, core.CodeConflict,
		core.CodeInvalidState, core.CodeUnsupported, core.CodeQuotaExceeded:
		return true
	}
	return false
}

// ---- forwarded headers ----

// forwardHeaders builds the only headers a call carries for a caller:
// Authorization, Cookie (bc_session, only when there is no bearer), Origin,
// User-Agent, X-Request-Id, and X-Forwarded-For: sourceIP when it is an IP
// address. It reads nothing but cred: a client's own forwarding headers
// cannot reach the host. A value that cannot travel in a header is left out,
// except a bearer's, which is UNAUTHENTICATED as the embedded port would
// answer.
func forwardHeaders(cred Credential, sourceIP, requestID string) (http.Header, error) {
	h := make(http.Header, 6)
	auth := strings.TrimSpace(cred.Authorization)
	scheme, _, _ := strings.Cut(auth, " ")
	bearer := strings.EqualFold(scheme, "bearer")
	switch {
	case auth == "":
	case headerSafe(auth):
		h["Authorization"] = []string{auth}
	case bearer:
		return nil, unauthenticated()
	}
	if !bearer {
		if tok := cookieToken(cred.Cookie); tok != "" && cookieSafe(tok) {
			h["Cookie"] = []string{SessionCookie + "=" + tok}
		}
	}
	if len(h) == 0 {
		return nil, unauthenticated()
	}
	if v := strings.TrimSpace(cred.Origin); v != "" && headerSafe(v) {
		h["Origin"] = []string{v}
	}
	if v := strings.TrimSpace(cred.UserAgent); v != "" && headerSafe(v) {
		h["User-Agent"] = []string{v}
	}
	if v := strings.TrimSpace(requestID); v != "" && headerSafe(v) {
		h["X-Request-Id"] = []string{v}
	}
	if ip, err := netip.ParseAddr(strings.TrimSpace(sourceIP)); err == nil {
		h["X-Forwarded-For"] = []string{ip.String()}
	}
	return h, nil
}

// cookieToken is the session token of Credential.Cookie: the value itself,
// or bc_session's value from a whole Cookie header.
func cookieToken(c string) string {
	c = strings.TrimSpace(c)
	if !strings.Contains(c, "=") {
		return c
	}
	cookies, err := http.ParseCookie(c)
	if err != nil {
		return ""
	}
	for _, ck := range cookies {
		if ck.Name == SessionCookie {
			return ck.Value
		}
	}
	return ""
}

// headerSafe: no control characters (a header value's only hard limit).
func headerSafe(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// cookieSafe: the characters a cookie value may hold (RFC 6265 cookie-octet).
func cookieSafe(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= 0x20 || c == '"' || c == ',' || c == ';' || c == '\\' || c >= 0x7f {
			return false
		}
	}
	return true
}
