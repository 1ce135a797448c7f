package dofake

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"time"
)

// App deployment phases (godo's DeploymentPhase values).
const (
	PhaseBuilding   = "BUILDING"
	PhaseActive     = "ACTIVE"
	PhaseSuperseded = "SUPERSEDED"
	PhaseCanceled   = "CANCELED"
)

// appRegion is an App Platform region.
type appRegion struct {
	Slug        string   `json:"slug"`
	Label       string   `json:"label"`
	Flag        string   `json:"flag"`
	Continent   string   `json:"continent"`
	DataCenters []string `json:"data_centers"`
}

var appRegions = []appRegion{
	{"nyc", "New York", "usa", "North America", []string{"nyc1", "nyc3"}},
	{"sfo", "San Francisco", "usa", "North America", []string{"sfo3"}},
	{"tor", "Toronto", "canada", "North America", []string{"tor1"}},
	{"ams", "Amsterdam", "netherlands", "Europe", []string{"ams3"}},
	{"fra", "Frankfurt", "germany", "Europe", []string{"fra1"}},
	{"lon", "London", "uk", "Europe", []string{"lon1"}},
	{"sgp", "Singapore", "singapore", "Asia", []string{"sgp1"}},
}

// defaultAppRegion is where an app whose spec names no region runs.
const defaultAppRegion = "nyc"

var appNameRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,30}[a-z0-9]$`)

// appComponents are the spec's keys that hold components; an app needs at
// least one.
var appComponents = []string{"services", "static_sites", "workers", "jobs", "functions", "databases"}

type app struct {
	id               string
	spec             map[string]any
	projectID        string
	created, updated time.Time
	listedAt         time.Time
	deployments      []*deployment // oldest first
	lastActiveAt     time.Time
	seq              int
}

type deployment struct {
	id               string
	spec             map[string]any
	phase            string
	created, updated time.Time
	due              time.Time
}

func (a *app) name() string { s, _ := a.spec["name"].(string); return s }

func (a *app) region() string {
	if s, _ := a.spec["region"].(string); s != "" {
		return s
	}
	return defaultAppRegion
}

// settle makes the newest deployment ACTIVE once due, superseding the one
// active before.
func (a *app) settle(now time.Time) {
	for _, d := range a.deployments {
		if d.phase != PhaseBuilding || d.due.After(now) {
			continue
		}
		for _, old := range a.deployments {
			if old.phase == PhaseActive {
				old.phase, old.updated = PhaseSuperseded, d.due
			}
		}
		d.phase, d.updated = PhaseActive, d.due
		a.lastActiveAt = d.due
	}
}

func (a *app) deployment(phase string) *deployment {
	for _, d := range slices.Backward(a.deployments) {
		if d.phase == phase {
			return d
		}
	}
	return nil
}

type wireDeployment struct {
	ID                 string         `json:"id"`
	Spec               map[string]any `json:"spec"`
	Phase              string         `json:"phase"`
	PhaseLastUpdatedAt string         `json:"phase_last_updated_at"`
	CreatedAt          string         `json:"created_at"`
	UpdatedAt          string         `json:"updated_at"`
	Cause              string         `json:"cause"`
	TierSlug           string         `json:"tier_slug"`
}

func (d *deployment) wire(appID string) *wireDeployment {
	return &wireDeployment{
		ID: d.id, Spec: answeredSpec(appID, d.spec), Phase: d.phase, PhaseLastUpdatedAt: stamp(d.updated),
		CreatedAt: stamp(d.created), UpdatedAt: stamp(d.updated), Cause: "app spec updated", TierSlug: "basic",
	}
}

type wireApp struct {
	ID                      string          `json:"id"`
	OwnerUUID               string          `json:"owner_uuid"`
	Spec                    map[string]any  `json:"spec"`
	DefaultIngress          string          `json:"default_ingress,omitempty"`
	LiveURL                 string          `json:"live_url,omitempty"`
	LiveURLBase             string          `json:"live_url_base,omitempty"`
	LiveDomain              string          `json:"live_domain,omitempty"`
	CreatedAt               string          `json:"created_at"`
	UpdatedAt               string          `json:"updated_at"`
	LastDeploymentCreatedAt string          `json:"last_deployment_created_at"`
	LastDeploymentActiveAt  string          `json:"last_deployment_active_at,omitempty"`
	ActiveDeployment        *wireDeployment `json:"active_deployment,omitempty"`
	InProgressDeployment    *wireDeployment `json:"in_progress_deployment,omitempty"`
	Region                  *appRegion      `json:"region"`
	TierSlug                string          `json:"tier_slug"`
	ProjectID               string          `json:"project_id"`
}

// ownerUUID is the fake account's owner.
const ownerUUID = "3c9d2b1a-0e8f-4a7b-9c6d-5e4f3a2b1c0d"

func (a *app) wire() wireApp {
	w := wireApp{
		ID: a.id, OwnerUUID: ownerUUID, Spec: answeredSpec(a.id, a.spec), CreatedAt: stamp(a.created), UpdatedAt: stamp(a.updated),
		TierSlug: "basic", ProjectID: a.projectID,
	}
	if n := len(a.deployments); n > 0 {
		w.LastDeploymentCreatedAt = stamp(a.deployments[n-1].created)
	}
	for i := range appRegions {
		if appRegions[i].Slug == a.region() {
			r := appRegions[i]
			w.Region = &r
		}
	}
	if d := a.deployment(PhaseActive); d != nil {
		w.ActiveDeployment = d.wire(a.id)
		domain := fmt.Sprintf("%s-%s.app.dofake.invalid", a.name(), a.id[:5])
		w.LiveDomain, w.LiveURL, w.LiveURLBase, w.DefaultIngress = domain, "https://"+domain, "https://"+domain, "https://"+domain
		w.LastDeploymentActiveAt = stamp(a.lastActiveAt)
	}
	if d := a.deployment(PhaseBuilding); d != nil {
		w.InProgressDeployment = d.wire(a.id)
	}
	return w
}

func (f *Fake) platformRoutes() map[string]handler {
	return map[string]handler{
		"POST /v2/apps":                              f.createApp,
		"GET /v2/apps":                               f.listApps,
		"GET /v2/apps/{id}":                          f.getApp,
		"PUT /v2/apps/{id}":                          f.updateApp,
		"DELETE /v2/apps/{id}":                       f.deleteApp,
		"GET /v2/apps/{id}/deployments":              f.listDeployments,
		"GET /v2/apps/{id}/deployments/{deployment}": f.getDeployment,
		"POST /v2/functions/namespaces":              f.createNamespace,
		"GET /v2/functions/namespaces":               f.listNamespaces,
		"GET /v2/functions/namespaces/{id}":          f.getNamespace,
		"DELETE /v2/functions/namespaces/{id}":       f.deleteNamespace,
		"POST /v2/dedicated-inferences":              f.createInference,
		"GET /v2/dedicated-inferences":               f.listInferences,
		"GET /v2/dedicated-inferences/{id}":          f.getInference,
		"PATCH /v2/dedicated-inferences/{id}":        f.updateInference,
		"DELETE /v2/dedicated-inferences/{id}":       f.deleteInference,
		"GET /v2/1-clicks":                           f.listOneClicks,
		"GET /v2/gen-ai/signals":                     f.listSignals,
	}
}

// checkAppSpec answers what is wrong with spec ("" when nothing).
func (st *state) checkAppSpec(spec map[string]any, self *app) string {
	if spec == nil {
		return "spec is required."
	}
	name, _ := spec["name"].(string)
	if !appNameRE.MatchString(name) {
		return "spec.name must be 2 to 32 lowercase letters, digits and dashes, starting with a letter."
	}
	for _, other := range st.apps {
		if other != self && other.name() == name {
			return fmt.Sprintf("an app named %q already exists.", name)
		}
	}
	if region, ok := spec["region"]; ok {
		slug, _ := region.(string)
		if !slices.ContainsFunc(appRegions, func(r appRegion) bool { return r.Slug == slug }) {
			return fmt.Sprintf("spec.region %v is not an App Platform region.", region)
		}
	}
	for _, key := range appComponents {
		if list, _ := spec[key].([]any); len(list) > 0 {
			return ""
		}
	}
	return "the app needs at least one component (services, static_sites, workers, jobs, functions or databases)."
}

// startDeployment deploys spec; a deployment still building is canceled.
func (st *state) startDeployment(a *app, now time.Time) {
	for _, d := range a.deployments {
		if d.phase == PhaseBuilding {
			d.phase, d.updated = PhaseCanceled, now
		}
	}
	id, _ := st.newID("deployments")
	a.deployments = append(a.deployments, &deployment{
		id: id, spec: cloneSpec(a.spec), phase: PhaseBuilding, created: now, updated: now,
		due: now.Add(st.settings.DeployDelay),
	})
}

// cloneSpec copies a spec deeply (a JSON round trip), so a deployment
// keeps the spec it was made from.
func cloneSpec(spec map[string]any) map[string]any {
	b, _ := json.Marshal(spec)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return out
}

func (f *Fake) createApp(r *http.Request, now time.Time) (int, any) {
	st := &f.st
	var req struct {
		Spec      map[string]any `json:"spec"`
		ProjectID string         `json:"project_id"`
	}
	if err := decode(r, &req); err != nil {
		return fail(http.StatusBadRequest, "%v", err)
	}
	if msg := st.checkAppSpec(req.Spec, nil); msg != "" {
		return fail(http.StatusUnprocessableEntity, "%s", msg)
	}
	if !decryptSecrets(nil, req.Spec) {
		return fail(http.StatusUnprocessableEntity, "an encrypted env value is not one of this app's.")
	}
	id, seq := st.newID(KindApps)
	a := &app{id: id, spec: req.Spec, projectID: req.ProjectID, created: now, updated: now, listedAt: now.Add(st.settings.ListLag), seq: seq}
	if a.projectID == "" {
		a.projectID = defaultProjectID
	}
	st.startDeployment(a, now)
	st.apps[a.id] = a
	return http.StatusOK, map[string]any{"app": a.wire()}
}

func (f *Fake) listApps(r *http.Request, now time.Time) (int, any) {
	var listed []*app
	for _, a := range f.st.apps {
		if listedBy(a.listedAt, now) {
			listed = append(listed, a)
		}
	}
	slices.SortFunc(listed, func(x, y *app) int { return x.seq - y.seq })
	out := []wireApp{}
	for _, a := range listed {
		f.st.drifted(KindApps, a.id, a)
		out = append(out, a.wire())
	}
	return paged(r, "apps", out)
}

func (f *Fake) getApp(r *http.Request, _ time.Time) (int, any) {
	a := f.st.apps[r.PathValue("id")]
	if a == nil {
		return notFoundAnswer()
	}
	f.st.drifted(KindApps, a.id, a)
	return http.StatusOK, map[string]any{"app": a.wire()}
}

func (f *Fake) updateApp(r *http.Request, now time.Time) (int, any) {
	st := &f.st
	a := st.apps[r.PathValue("id")]
	if a == nil {
		return notFoundAnswer()
	}
	var req struct {
		Spec map[string]any `json:"spec"`
	}
	if err := decode(r, &req); err != nil {
		return fail(http.StatusBadRequest, "%v", err)
	}
	if msg := st.checkAppSpec(req.Spec, a); msg != "" {
		return fail(http.StatusUnprocessableEntity, "%s", msg)
	}
	if !decryptSecrets(a, req.Spec) {
		return fail(http.StatusUnprocessableEntity, "an encrypted env value is not one of this app's.")
	}
	a.spec, a.updated = req.Spec, now
	st.startDeployment(a, now)
	return http.StatusOK, map[string]any{"app": a.wire()}
}

func (f *Fake) deleteApp(r *http.Request, _ time.Time) (int, any) {
	a := f.st.apps[r.PathValue("id")]
	if a == nil {
		return notFoundAnswer()
	}
	delete(f.st.apps, a.id)
	return http.StatusOK, map[string]any{"id": a.id}
}

func (f *Fake) listDeployments(r *http.Request, _ time.Time) (int, any) {
	a := f.st.apps[r.PathValue("id")]
	if a == nil {
		return notFoundAnswer()
	}
	out := []*wireDeployment{}
	for _, d := range slices.Backward(a.deployments) {
		out = append(out, d.wire(a.id))
	}
	return paged(r, "deployments", out)
}

func (f *Fake) getDeployment(r *http.Request, _ time.Time) (int, any) {
	a := f.st.apps[r.PathValue("id")]
	if a == nil {
		return notFoundAnswer()
	}
	for _, d := range a.deployments {
		if d.id == r.PathValue("deployment") {
			return http.StatusOK, map[string]any{"deployment": d.wire(a.id)}
		}
	}
	return notFoundAnswer()
}
