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
	"github.com/better-compute/better-compute/api/instances"
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

// in is b acting for subtest t (its failures are t's).
func (b *browser) in(t *testing.T) *browser {
	c := *b
	c.t = t
	return &c
}

// TestConsole drives the console in a real headless Chromium against the
// VPS dev stack (real PostgreSQL, Temporal, worker, bcd agents, runc and
// gVisor), one subtest per page, each page checked with axe-core and
// screenshotted (under a temporary directory, logged). As the demo tenant:
// a reservation checked, made through the form (whose limits come from the
// OpenAPI document), watched becoming active and released; an instance
// stopped and started; a sandbox's command run over the exec tunnel; an
// event arriving while the events page is open; a cookie call without the
// CSRF token refused; no page showing the platform's nodes or
// reservations. As the operator: a node cordoned, its inventory and diff
// shown, the sites and pools pages. A person without a policy sees the
// API's denial.
func TestConsole(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the dev stack and a browser")
	}
	axe := axeSource(t)
	// The VPS dev stack: the demo image and a host agent, so the demo
	// tenant's instances and sandbox template exist.
	v := startVPSStack(t)
	s := v.s
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
	// What the demo tenant's pages act on: an instance and a sandbox.
	vps := s.VPS()
	inst := v.create(t, instances.CreateInput{IdempotencyKey: "console-web", PoolID: vps.HostPoolID, FlavorID: v.flavors["c1-m1"],
		ImageID: vps.ImageID, Name: "console-web"})
	sbx, err := sandboxes.Create.Call(ctx, v.demo, sandboxes.CreateInput{TenantID: "acme", IdempotencyKey: "console-sbx",
		TemplateID: vps.SandboxTemplateID, TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	v.await(t, inst.ID, "running")

	demo := newBrowser(t, base, axe, shots, "demo")
	demo.login(demoToken)
	private := func(b *browser, page string) {
		text := b.text()
		for _, s := range secret {
			if strings.Contains(text, s) {
				b.t.Errorf("the demo tenant's %s page shows the platform's %q", page, s)
			}
		}
	}

	t.Run("reservations", func(t *testing.T) {
		b := demo.in(t)
		b.open("reservations")
		b.check("reservations")
		private(b, "reservations")
		if max := eval[string](b, `document.getElementById("rsv-hours").max`); max != "8784" {
			t.Errorf("the form's hours maximum = %q, want 8784 (31,622,400 s) from the OpenAPI document", max)
		}
		b.do(chromedp.SetValue(chromedp.ID("rsv-pool"), s.Demo().PoolID), chromedp.SetValue(chromedp.ID("rsv-gpus"), "2"),
			chromedp.Click(chromedp.ID("rsv-check")))
		b.waitText("#rsv-fits", "Fits", 20*time.Second)
		b.do(chromedp.Click(chromedp.ID("rsv-reserve")))
		b.waitText("#rsv-result", "Reservation", 20*time.Second)
		rsv := eval[string](b, `document.querySelector("#rsv-result .id").textContent`)
		began := time.Now()
		b.waitText(fmt.Sprintf(`.state[data-id=%q]`, rsv), "active", 90*time.Second)
		t.Logf("reservation %s active in the console %v after the form's reserve", rsv, time.Since(began).Round(100*time.Millisecond))
		b.check("reservations-active")
		b.do(chromedp.Click(chromedp.CSS(fmt.Sprintf(`button[aria-label="Release %s"]`, rsv))))
		b.waitText(fmt.Sprintf(`.state[data-id=%q]`, rsv), "release", 60*time.Second)
		got, err := reservations.Get.Call(ctx, v.demo, reservations.ReservationInput{TenantID: "acme", ReservationID: rsv})
		if err != nil || (got.State != "releasing" && got.State != "released") {
			t.Fatalf("after the console's release: %+v, %v", got, err)
		}
	})

	t.Run("capacity", func(t *testing.T) {
		b := demo.in(t)
		b.open("capacity")
		b.check("capacity")
		private(b, "capacity")
		if n := eval[int](b, `document.querySelectorAll("svg rect.available").length`); n == 0 {
			t.Fatal("the capacity page draws no bucket")
		}
	})

	t.Run("instances", func(t *testing.T) {
		b := demo.in(t)
		b.open("instances")
		b.check("instances")
		private(b, "instances")
		b.do(chromedp.Click(chromedp.CSS(`button[aria-label="Stop console-web"]`)))
		v.await(t, inst.ID, "stopped")
		b.waitText("#page", "stopped (wants stopped)", 20*time.Second)
		b.do(chromedp.Click(chromedp.CSS(`button[aria-label="Start console-web"]`)))
		v.await(t, inst.ID, "running")
		b.waitText("#page", "running (wants running)", 20*time.Second)
	})

	t.Run("sandboxes", func(t *testing.T) {
		b := demo.in(t)
		testutil.EventuallyNil(t, 2*time.Minute, func() error {
			got, err := sandboxes.Get.Call(ctx, v.demo, sandboxes.SandboxInput{TenantID: "acme", SandboxID: sbx.ID})
			if err != nil || got.State != "running" {
				return fmt.Errorf("sandbox %s: %v", got.State, err)
			}
			return nil
		})
		b.open("sandboxes")
		b.check("sandboxes")
		private(b, "sandboxes")
		b.do(chromedp.SetValue(chromedp.CSS(fmt.Sprintf(`input[aria-label="Command for %s"]`, sbx.ID)), "echo console-exec; exit 3"),
			chromedp.Click(chromedp.CSS(fmt.Sprintf(`button[aria-label="Run in %s"]`, sbx.ID))))
		b.waitText("#sbx-stdout", "console-exec", 30*time.Second)
		b.waitText("#sbx-exit", "exit 3", 5*time.Second)
		b.check("sandboxes-exec")
	})

	t.Run("events", func(t *testing.T) {
		b := demo.in(t)
		b.open("events")
		b.check("events")
		private(b, "events")
		// An event published while the page is open appears in it.
		r, err := reservations.Create.Call(ctx, v.demo, reservations.CreateInput{TenantID: "acme", PoolID: s.Demo().PoolID,
			Duration: 600, IdempotencyKey: "console-live", Devices: placement.Request{Class: placement.ClassGPU, Count: 1}})
		if err != nil {
			t.Fatal(err)
		}
		b.waitText("#events-list", r.ID, 30*time.Second)
	})

	for _, p := range []string{"nodes", "cloud-resources"} {
		t.Run(p, func(t *testing.T) {
			b := demo.in(t)
			b.open(p)
			b.check(p)
			private(b, p)
		})
	}

	t.Run("csrf", func(t *testing.T) {
		// A call with the session cookie but without the page's CSRF token
		// is refused; with it, the same call is answered.
		statuses := eval[[]int](demo.in(t), `Promise.all([
		fetch("/api/compute/system/whoami", {method: "POST", credentials: "same-origin", headers: {"Content-Type": "application/json"}, body: "{}"}),
		fetch("/api/compute/system/whoami", {method: "POST", credentials: "same-origin", headers: {"Content-Type": "application/json",
			"X-Csrf-Token": document.querySelector('meta[name="bc-csrf"]').content}, body: "{}"}),
	]).then(rs => rs.map(r => r.status))`)
		if len(statuses) != 2 || statuses[0] != 403 || statuses[1] != 200 {
			t.Fatalf("whoami without and with the CSRF token = %v, want [403 200]", statuses)
		}
	})

	op := newBrowser(t, base, axe, shots, "operator")
	op.login(adminToken)
	t.Run("operator nodes", func(t *testing.T) {
		b := op.in(t)
		node := rootNodes.Items[0]
		for _, n := range rootNodes.Items {
			if n.GPUCount > 0 { // a node agent with an inventory (not the site agent)
				node = n
				break
			}
		}
		b.open("nodes")
		b.check("nodes")
		b.do(chromedp.Click(chromedp.CSS(fmt.Sprintf(`button[aria-label="Cordon %s"]`, node.Name))))
		b.waitText(fmt.Sprintf(`.cordon[data-id=%q]`, node.ID), "cordoned", 20*time.Second)
		if n, err := nodes.Get.Call(ctx, admin, nodes.NodeInput{TenantID: "root", NodeID: node.ID}); err != nil || !n.Cordoned {
			t.Fatalf("after the console's cordon: %+v, %v", n, err)
		}
		if _, err := nodes.Uncordon.Call(ctx, admin, nodes.NodeInput{TenantID: "root", NodeID: node.ID}); err != nil {
			t.Fatal(err)
		}
		b.do(chromedp.Click(chromedp.CSS(fmt.Sprintf(`button[aria-label="Inventory of %s"]`, node.Name))))
		b.waitText("#node-detail", "Inventory of "+node.Name, 20*time.Second)
		b.check("node-inventory")
	})
	for _, p := range []string{"sites", "pools", "capacity", "reservations"} {
		t.Run("operator "+p, func(t *testing.T) {
			b := op.in(t)
			b.open(p)
			b.check(p)
			if p == "reservations" && !strings.Contains(b.text(), theirs.ID) {
				t.Errorf("the operator's reservations page lacks the platform's reservation %s", theirs.ID)
			}
			if p == "pools" && !strings.Contains(b.text(), "Offers of") {
				t.Errorf("the pools page shows no offers:\n%s", b.text())
			}
		})
	}

	t.Run("denied", func(t *testing.T) {
		// A person with no policy sees the API's denial, not a blank page.
		var idn iam.Identity
		iamAdmin(t, base, adminToken, "createIdentity", iam.CreateIdentityInput{TenantID: "acme", Kind: iam.KindPerson, Name: "console-nobody"}, &idn)
		var tok iam.CreatedToken
		iamAdmin(t, base, adminToken, "createToken", iam.CreateTokenInput{TenantID: "acme", IdentityID: idn.ID, SessionKind: iam.SessionUser}, &tok)
		b := newBrowser(t, base, axe, shots, "nobody")
		b.login(tok.Token)
		b.open("reservations")
		b.waitText("#page .error", "ACCESS_DENIED", 10*time.Second)
		b.check("denied")
	})

	entries, _ := os.ReadDir(shots)
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	raw, _ := json.Marshal(names)
	t.Logf("%d screenshots: %s", len(names), raw)
}
