package dofake

import (
	"net/http"
	"time"
)

// 1-Click application types, as GET /v2/1-clicks?type= filters them.
const (
	OneClickDroplet    = "droplet"
	OneClickKubernetes = "kubernetes"
)

// OneClick is a 1-Click application as GET /v2/1-clicks answers it (godo's
// OneClick: DigitalOcean lists only a slug and a type).
type OneClick struct {
	Slug string `json:"slug"`
	Type string `json:"type"`
}

// DefaultOneClicks are the 1-Click apps a Fake lists when its Config names
// none: droplet ones whose slugs are application images of DefaultImages
// where one exists, and Kubernetes add-ons.
func DefaultOneClicks() []OneClick {
	return []OneClick{
		{Slug: "docker-20-04", Type: OneClickDroplet},
		{Slug: "wordpress-20-04", Type: OneClickDroplet},
		{Slug: "nvidia-cuda-24-04", Type: OneClickDroplet},
		{Slug: "monitoring", Type: OneClickKubernetes},
		{Slug: "ingress-nginx", Type: OneClickKubernetes},
	}
}

// listOneClicks answers the catalog, filtered by ?type= when given. Like
// DigitalOcean's, it is not paged.
func (f *Fake) listOneClicks(r *http.Request, _ time.Time) (int, any) {
	typ := r.URL.Query().Get("type")
	out := []OneClick{}
	for _, oc := range f.st.oneClicks {
		if typ == "" || oc.Type == typ {
			out = append(out, oc)
		}
	}
	return http.StatusOK, map[string]any{"1_clicks": out}
}
