package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/api/reservations"
	"github.com/better-compute/better-compute/api/sandboxes"
	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/internal/testutil"
)

// axeVersion is the axe-core release the console's pages are checked with,
// installed from the npm registry once per machine.
const axeVersion = "4.14.1"

// axeSource installs axe-core with npm into the user cache (once) and
// answers its script.
func axeSource(t *testing.T) string {
	t.Helper()
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "better-compute-e2e", "axe-"+axeVersion)
	file := filepath.Join(dir, "node_modules", "axe-core", "axe.min.js")
	if _, err := os.Stat(file); err != nil {
		npm, err := exec.LookPath("npm")
		if err != nil {
			t.Fatal("the console tests need npm to install axe-core (.ci/run installs it)")
		}
		if out, err := exec.Command(npm, "install", "--no-audit", "--no-fund", "--prefix", dir, "axe-core@"+axeVersion).CombinedOutput(); err != nil {
			t.Fatalf("npm install axe-core: %v\n%s", err, out)
		}
	}
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return string(src)
}

// browser is one headless Chromium with its own cookies.
type browser struct {
	t    *testing.T
	ctx  context.Context
	base string
	axe  string
	shot string // where screenshots go
	who  string
}

func newBrowser(t *testing.T, base, axe, shots, who string) *browser {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("the console tests need Debian's chromium (.ci/run installs it)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.WindowSize(1366, 900), chromedp.UserDataDir(t.TempDir()))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	ctx, cancel2 := chromedp.NewContext(actx)
	t.Cleanup(cancel2)
	// axe-core is injected through the DevTools protocol: the console's
	// Content-Security-Policy rightly refuses any script of another origin.
	if _, err := chromedp.Call(ctx, page.SetBypassCSP, page.SetBypassCSPParams{Enabled: true}); err != nil {
		t.Fatal(err)
	}
	return &browser{t: t, ctx: ctx, base: base, axe: axe, shot: shots, who: who}
}

// do runs steps, a minute at most (the browser lives on).
func (b *browser) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.t.Fatalf("%s: %v\n%s", b.who, err, b.text())
	}
}

// eval runs a script, awaiting the promise it answers, into T.
func eval[T any](b *browser, js string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
	if err != nil {
		b.t.Fatalf("%s: %v", b.who, err)
	}
	return v
}

func (b *browser) login(token string) {
	b.t.Helper()
	b.do(chromedp.Navigate(b.base+"/console/"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), token), chromedp.Click(chromedp.CSS(`button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`nav[aria-label="Pages"]`)))
}

// poll waits until the script answers true.
func (b *browser) poll(js string, within time.Duration) error {
	_, err := chromedp.Run(b.ctx, chromedp.Poll[bool](js, chromedp.WithPollingTimeout(within)))
	return err
}

// open loads a page and waits until its script has rendered it.
func (b *browser) open(name string) {
	b.t.Helper()
	b.do(chromedp.Navigate(b.base + "/console/" + name))
	if err := b.poll(`(() => { const p = document.getElementById("page"); return !!p && !p.textContent.includes("Loading…"); })()`,
		30*time.Second); err != nil {
		b.t.Fatalf("%s: page %s never rendered: %v", b.who, name, err)
	}
}

// text is the page's visible text.
func (b *browser) text() string { return eval[string](b, `document.body.innerText`) }

// check runs axe-core on the page, fails on a serious or critical
// violation, and saves a screenshot.
func (b *browser) check(name string) {
	b.t.Helper()
	if _, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](b.axe+";true")); err != nil {
		b.t.Fatal(err)
	}
	violations := eval[[]string](b, `axe.run(document, {resultTypes: ["violations"]}).then(r => r.violations
		.filter(v => v.impact === "serious" || v.impact === "critical")
		.map(v => v.id + ": " + v.help + " (" + v.nodes.map(n => n.target.join(" ")).join(", ") + ")"))`)
	if len(violations) > 0 {
		b.t.Errorf("%s (%s): axe-core: %s", name, b.who, strings.Join(violations, "; "))
	}
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100)) // 100: PNG; less is JPEG
	if err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(b.shot, b.who+"-"+name+".png"), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// waitText waits until the element sel's text holds want.
func (b *browser) waitText(sel, want string, within time.Duration) {
	b.t.Helper()
	js := fmt.Sprintf(`(() => { const e = document.querySelector(%q); return !!e && e.textContent.includes(%q); })()`, sel, want)
	if err := b.poll(js, within); err != nil {
		b.t.Fatalf("%s: %s never showed %q: %v\n%s", b.who, sel, want, err, b.text())
	}
}

// TestConsole drives the console in a real headless Chromium against the
// dev stack: as the demo tenant, every tenant page passes axe-core, a
// reservation is checked, made through the form (whose limits come from
// the OpenAPI document), watched becoming active and released, a
// sandbox's command runs from its page over the exec tunnel, a cookie call
// without the CSRF token is refused, and no page shows the platform's
// nodes or reservations; as the operator, a node
// is cordoned; a person without a policy sees the API's denial. Screenshots
// of every page are saved under a temporary directory (logged).
func TestConsole(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the dev stack and a browser")
	}
	axe := axeSource(t)
	// The VPS dev stack: the demo image and a host agent, so the demo
	// tenant's sandbox template exists.
	s := startVPSStack(t).s
	ctx := context.Background()
	base := s.APIURL()
	shots, err := os.MkdirTemp("", "bc-console-shots-")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", shots)
	demoToken, err := s.DemoToken()
	if err != nil {
		t.Fatal(err)
	}
	adminToken, err := s.AdminToken()
	if err != nil {
		t.Fatal(err)
	}
	admin := api.NewClient(base, adminToken)

	// The platform's own rows, which the demo tenant must never see.
	rootNodes, err := nodes.List.Call(ctx, admin, nodes.ListInput{TenantID: "root"})
	if err != nil || len(rootNodes.Items) == 0 {
		t.Fatalf("root's nodes = %+v, %v", rootNodes, err)
	}
	theirs, err := reservations.Create.Call(ctx, admin, reservations.CreateInput{TenantID: "root", PoolID: s.Demo().PoolID,
		Duration: 3600, IdempotencyKey: "console-root", Devices: placement.Request{Class: placement.ClassGPU, Count: 1}})
	if err != nil {
		t.Fatal(err)
	}
	secret := []string{theirs.ID}
	for _, n := range rootNodes.Items {
		secret = append(secret, n.ID, n.Name)
	}

	demo := newBrowser(t, base, axe, shots, "demo")
	demo.login(demoToken)
	for _, p := range []string{"reservations", "capacity", "nodes", "instances", "sandboxes", "cloud-resources", "events"} {
		demo.open(p)
		demo.check(p)
		text := demo.text()
		for _, s := range secret {
			if strings.Contains(text, s) {
				t.Errorf("the demo tenant's %s page shows the platform's %q", p, s)
			}
		}
	}

	// Reserve through the form (its limits from the OpenAPI document:
	// reservations.create's duration maximum in hours), watch it become
	// active, release it.
	demo.open("reservations")
	if max := eval[string](demo, `document.getElementById("rsv-hours").max`); max != "8784" {
		t.Errorf("the form's hours maximum = %q, want 8784 (31,622,400 s) from the OpenAPI document", max)
	}
	demo.do(chromedp.SetValue(chromedp.ID("rsv-pool"), s.Demo().PoolID), chromedp.SetValue(chromedp.ID("rsv-gpus"), "2"),
		chromedp.Click(chromedp.ID("rsv-check")))
	demo.waitText("#rsv-fits", "Fits", 20*time.Second)
	demo.do(chromedp.Click(chromedp.ID("rsv-reserve")))
	demo.waitText("#rsv-result", "Reservation", 20*time.Second)
	rsv := eval[string](demo, `document.querySelector("#rsv-result .id").textContent`)
	began := time.Now()
	demo.waitText(fmt.Sprintf(`.state[data-id=%q]`, rsv), "active", 90*time.Second)
	t.Logf("reservation %s active in the console %v after the form's reserve", rsv, time.Since(began).Round(100*time.Millisecond))
	demo.check("reservations-active")
	demo.do(chromedp.Click(chromedp.CSS(fmt.Sprintf(`button[aria-label="Release %s"]`, rsv))))
	demo.waitText(fmt.Sprintf(`.state[data-id=%q]`, rsv), "release", 60*time.Second)
	got, err := reservations.Get.Call(ctx, api.NewClient(base, demoToken), reservations.ReservationInput{TenantID: "acme", ReservationID: rsv})
	if err != nil || (got.State != "releasing" && got.State != "released") {
		t.Fatalf("after the console's release: %+v, %v", got, err)
	}

	// A sandbox's command runs from its page, over the exec tunnel's
	// WebSocket, and its output comes back.
	demoAPI := api.NewClient(base, demoToken)
	sbx, err := sandboxes.Create.Call(ctx, demoAPI, sandboxes.CreateInput{TenantID: "acme", IdempotencyKey: "console-sbx",
		TemplateID: s.VPS().SandboxTemplateID, TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyNil(t, 2*time.Minute, func() error {
		got, err := sandboxes.Get.Call(ctx, demoAPI, sandboxes.SandboxInput{TenantID: "acme", SandboxID: sbx.ID})
		if err != nil || got.State != "running" {
			return fmt.Errorf("sandbox %s: %v", got.State, err)
		}
		return nil
	})
	demo.open("sandboxes")
	demo.do(chromedp.SetValue(chromedp.CSS(fmt.Sprintf(`input[aria-label="Command for %s"]`, sbx.ID)), "echo console-exec; exit 3"),
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`button[aria-label="Run in %s"]`, sbx.ID))))
	demo.waitText("#sbx-stdout", "console-exec", 30*time.Second)
	demo.waitText("#sbx-exit", "exit 3", 5*time.Second)
	demo.check("sandboxes-exec")

	// A call with the session cookie but without the page's CSRF token is
	// refused; with it, the same call is answered.
	statuses := eval[[]int](demo, `Promise.all([
		fetch("/api/compute/system/whoami", {method: "POST", credentials: "same-origin", headers: {"Content-Type": "application/json"}, body: "{}"}),
		fetch("/api/compute/system/whoami", {method: "POST", credentials: "same-origin", headers: {"Content-Type": "application/json",
			"X-Csrf-Token": document.querySelector('meta[name="bc-csrf"]').content}, body: "{}"}),
	]).then(rs => rs.map(r => r.status))`)
	if len(statuses) != 2 || statuses[0] != 403 || statuses[1] != 200 {
		t.Fatalf("whoami without and with the CSRF token = %v, want [403 200]", statuses)
	}

	// The operator cordons a node on the nodes page, and the pools page
	// shows the demo pool's offer.
	op := newBrowser(t, base, axe, shots, "operator")
	op.login(adminToken)
	node := rootNodes.Items[0]
	op.open("nodes")
	op.check("nodes")
	op.do(chromedp.Click(chromedp.CSS(fmt.Sprintf(`button[aria-label="Cordon %s"]`, node.Name))))
	op.waitText(fmt.Sprintf(`.cordon[data-id=%q]`, node.ID), "cordoned", 20*time.Second)
	if n, err := nodes.Get.Call(ctx, admin, nodes.NodeInput{TenantID: "root", NodeID: node.ID}); err != nil || !n.Cordoned {
		t.Fatalf("after the console's cordon: %+v, %v", n, err)
	}
	if _, err := nodes.Uncordon.Call(ctx, admin, nodes.NodeInput{TenantID: "root", NodeID: node.ID}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"sites", "pools", "capacity", "reservations"} {
		op.open(p)
		op.check(p)
	}
	if text := op.text(); !strings.Contains(text, theirs.ID) {
		t.Errorf("the operator's reservations page lacks the platform's reservation %s", theirs.ID)
	}

	// A person with no policy sees the API's denial, not a blank page.
	var idn iam.Identity
	iamAdmin(t, base, adminToken, "createIdentity", iam.CreateIdentityInput{TenantID: "acme", Kind: iam.KindPerson, Name: "console-nobody"}, &idn)
	var tok iam.CreatedToken
	iamAdmin(t, base, adminToken, "createToken", iam.CreateTokenInput{TenantID: "acme", IdentityID: idn.ID, SessionKind: iam.SessionUser}, &tok)
	nobody := newBrowser(t, base, axe, shots, "nobody")
	nobody.login(tok.Token)
	nobody.open("reservations")
	nobody.waitText("#page .error", "ACCESS_DENIED", 10*time.Second)
	nobody.check("denied")

	entries, _ := os.ReadDir(shots)
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	raw, _ := json.Marshal(names)
	t.Logf("%d screenshots: %s", len(names), raw)
}
