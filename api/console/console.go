// Package console serves the web console at /console/ (docs/console.md):
// server-rendered page shells whose small script calls the same
// POST /api/compute/<group>/<method> methods as the CLI, with the caller's
// own token kept in the HttpOnly session cookie and a CSRF token on every
// call, so IAM decides everything exactly as it does for any other client.
// The console holds no privilege of its own: it only renders what the
// caller's calls answer, errors included.
package console

import (
	"embed"
	"html/template"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
)

// PathPrefix is where the console is served.
const PathPrefix = "/console/"

//go:embed static templates
var files embed.FS

// pages are the console's pages, in the navigation's order: the tenant's,
// then the operator's (shown in the root tenant only; IAM decides them like
// any call).
var pages = []Page{
	{"reservations", "Reservations", false}, {"capacity", "Capacity", false}, {"nodes", "Nodes", false},
	{"instances", "Instances", false}, {"sandboxes", "Sandboxes", false}, {"cloud-resources", "Cloud resources", false},
	{"events", "Events", false}, {"sites", "Sites", true}, {"pools", "Pools, offers and quotas", true},
}

// Page is one page of the console.
type Page struct {
	Name, Title string
	Operator    bool
}

// Config configures the console.
type Config struct {
	// IAM authenticates the token a user pastes at login, and the cookie of
	// each page load.
	IAM iam.Port
	// RootTenant is the platform's tenant: its people see the operator pages.
	RootTenant string
	// InsecureCookies drops the cookie's Secure attribute: only for the dev
	// stack, served over plain HTTP on loopback.
	InsecureCookies bool
	// TemporalUI is the Temporal UI's base URL and Namespace its namespace,
	// for the links from long-running objects to their workflows ("": none).
	TemporalUI, Namespace string
}

// Console is the console's HTTP face.
type Console struct {
	cfg   Config
	pages *template.Template
}

// New builds the console.
func New(cfg Config) (*Console, error) {
	t, err := template.ParseFS(files, "templates/*.html")
	if err != nil {
		return nil, err
	}
	return &Console{cfg: cfg, pages: t}, nil
}

// Mount puts the console's routes on r.
func (c *Console) Mount(r gin.IRoutes) {
	static, _ := fs.Sub(files, "static")
	r.GET("/console", func(g *gin.Context) { g.Redirect(http.StatusSeeOther, PathPrefix) })
	r.GET(PathPrefix+"static/*file", func(g *gin.Context) {
		headers(g)
		g.Header("Cache-Control", "no-cache")
		g.FileFromFS(g.Param("file"), http.FS(static))
	})
	r.GET(PathPrefix, c.page)
	r.GET(PathPrefix+":page", c.page)
	r.POST(PathPrefix+"login", c.login)
	r.POST(PathPrefix+"logout", c.logout)
}

// headers are every console answer's: no framing, no sniffing, no
// referrer, and a policy that runs only the console's own script.
func headers(g *gin.Context) {
	g.Header("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	g.Header("X-Content-Type-Options", "nosniff")
	// same-origin, not no-referrer: under no-referrer a browser sends
	// "Origin: null" with the console's own forms.
	g.Header("Referrer-Policy", "same-origin")
	g.Header("X-Frame-Options", "DENY")
}

// shell is what a page's template renders.
type shell struct {
	Page, Title        string
	Pages              []Page
	Tenant, IdentityID string
	CSRF               string
	TemporalUI, NS     string
	Error              *core.Error
}

func (c *Console) render(g *gin.Context, status int, name string, data shell) {
	headers(g)
	g.Header("Cache-Control", "no-store")
	g.Status(status)
	g.Header("Content-Type", "text/html; charset=utf-8")
	if err := c.pages.ExecuteTemplate(g.Writer, name, data); err != nil {
		_ = g.Error(err)
	}
}

// credential is the request's session cookie as a credential.
func credential(g *gin.Context) (iam.Credential, bool) {
	ck, err := g.Request.Cookie(iam.SessionCookie)
	if err != nil || ck.Value == "" {
		return iam.Credential{}, false
	}
	cred := iam.Credential{Cookie: ck.Value, UserAgent: g.Request.UserAgent(), Origin: g.GetHeader("Origin")}
	if host, _, err := net.SplitHostPort(g.Request.RemoteAddr); err == nil {
		cred.SourceIP = host
	}
	return cred, true
}

// page renders a page's shell for the cookie's caller, or the login page.
func (c *Console) page(g *gin.Context) {
	name := g.Param("page")
	if name == "" {
		name = pages[0].Name
	}
	i := slices.IndexFunc(pages, func(p Page) bool { return p.Name == name })
	if i < 0 {
		c.render(g, http.StatusNotFound, "login.html", shell{Title: "Not found",
			Error: core.Errorf(core.CodeNotFound, "no console page %q", name)})
		return
	}
	cred, ok := credential(g)
	if !ok {
		c.render(g, http.StatusOK, "login.html", shell{Title: "Sign in"})
		return
	}
	caller, err := c.cfg.IAM.Authenticate(g.Request.Context(), cred)
	if err != nil {
		c.render(g, http.StatusUnauthorized, "login.html", shell{Title: "Sign in", Error: core.AsError(err)})
		return
	}
	operator := caller.TenantID == c.cfg.RootTenant
	var shown []Page
	for _, p := range pages {
		if !p.Operator || operator {
			shown = append(shown, p)
		}
	}
	c.render(g, http.StatusOK, "app.html", shell{Page: name, Title: pages[i].Title, Pages: shown, Tenant: caller.TenantID,
		IdentityID: caller.IdentityID, CSRF: iam.CSRFToken(cred.Cookie),
		TemporalUI: c.cfg.TemporalUI, NS: c.cfg.Namespace})
}

// sameOrigin refuses a form posted from another site (a login CSRF would
// sign the victim in as the attacker): the browser must say the request is
// same-origin (Sec-Fetch-Site), or send this host as its Origin.
func sameOrigin(g *gin.Context) bool {
	if site := g.GetHeader("Sec-Fetch-Site"); site != "" {
		return site == "same-origin"
	}
	o, err := url.Parse(g.GetHeader("Origin"))
	return err == nil && o.Host != "" && o.Host == g.Request.Host
}

func (c *Console) cookie(g *gin.Context, value string, maxAge int) {
	http.SetCookie(g.Writer, &http.Cookie{Name: iam.SessionCookie, Value: value, Path: "/", MaxAge: maxAge,
		HttpOnly: true, Secure: !c.cfg.InsecureCookies, SameSite: http.SameSiteStrictMode})
}

// login takes a pasted token, checks it with IAM, and keeps it in the
// session cookie; the token is never shown or logged again.
func (c *Console) login(g *gin.Context) {
	if !sameOrigin(g) {
		c.render(g, http.StatusForbidden, "login.html", shell{Title: "Sign in",
			Error: core.Errorf(core.CodeAccessDenied, "sign in from the console's own page")})
		return
	}
	token := strings.TrimSpace(g.PostForm("token"))
	caller, err := c.cfg.IAM.Authenticate(g.Request.Context(), iam.Credential{Authorization: "Bearer " + token,
		UserAgent: g.Request.UserAgent()})
	if token == "" || err != nil || caller == nil {
		if err == nil {
			err = core.Errorf(core.CodeUnauthn, "paste an API token")
		}
		c.render(g, http.StatusUnauthorized, "login.html", shell{Title: "Sign in", Error: core.AsError(err)})
		return
	}
	c.cookie(g, token, 0)
	g.Redirect(http.StatusSeeOther, PathPrefix)
}

// logout forgets the cookie (the token itself stays valid until revoked:
// `better-compute iam revokeToken`).
func (c *Console) logout(g *gin.Context) {
	cred, ok := credential(g)
	if !sameOrigin(g) || !ok || iam.CheckCSRF(cred, g.PostForm("csrf")) != nil {
		c.render(g, http.StatusForbidden, "login.html", shell{Title: "Sign in",
			Error: core.Errorf(core.CodeAccessDenied, "sign out from the console's own page")})
		return
	}
	c.cookie(g, "", -1)
	g.Redirect(http.StatusSeeOther, PathPrefix)
}
