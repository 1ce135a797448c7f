package dofake

import (
	"fmt"
	"net/http"
	"slices"
	"time"
)

type namespace struct {
	id, uuid, label, region string
	key                     string
	created, listedAt       time.Time
	seq                     int
}

// wireNamespace is godo's FunctionsNamespace; the key only where withKey.
type wireNamespace struct {
	APIHost   string `json:"api_host"`
	Namespace string `json:"namespace"`
	CreatedAt string `json:"created_at"`
	UpdatedAt string `json:"updated_at"`
	Label     string `json:"label"`
	Region    string `json:"region"`
	UUID      string `json:"uuid"`
	Key       string `json:"key,omitempty"`
}

func (n *namespace) wire(withKey bool) wireNamespace {
	w := wireNamespace{
		APIHost:   fmt.Sprintf("https://faas-%s-%s.functions.dofake.invalid", n.region, n.uuid[:8]),
		Namespace: n.id, CreatedAt: stamp(n.created), UpdatedAt: stamp(n.created),
		Label: n.label, Region: n.region, UUID: n.uuid,
	}
	if withKey {
		w.Key = n.key
	}
	return w
}

func (f *Fake) createNamespace(r *http.Request, now time.Time) (int, any) {
	st := &f.st
	var req struct {
		Label  string `json:"label"`
		Region string `json:"region"`
	}
	if err := decode(r, &req); err != nil {
		return fail(http.StatusBadRequest, "%v", err)
	}
	if req.Label == "" || len(req.Label) > 64 {
		return fail(http.StatusUnprocessableEntity, "label must be 1 to 64 characters.")
	}
	if region := st.region(req.Region); region == nil || !region.Available {
		return fail(http.StatusUnprocessableEntity, "region %q is not available.", req.Region)
	}
	uuid, seq := st.newID(KindFunctionsNamespaces)
	n := &namespace{
		id: "fn-" + uuid, uuid: uuid, label: req.Label, region: req.Region, key: newSecret("dof_v1_"),
		created: now, listedAt: now.Add(st.settings.ListLag), seq: seq,
	}
	st.namespaces[n.id] = n
	return http.StatusOK, map[string]any{"namespace": n.wire(true)}
}

func (f *Fake) listNamespaces(r *http.Request, now time.Time) (int, any) {
	var listed []*namespace
	for _, n := range f.st.namespaces {
		if listedBy(n.listedAt, now) {
			listed = append(listed, n)
		}
	}
	slices.SortFunc(listed, func(a, b *namespace) int { return a.seq - b.seq })
	out := []wireNamespace{}
	for _, n := range listed {
		f.st.drifted(KindFunctionsNamespaces, n.id, n)
		out = append(out, n.wire(false))
	}
	// Not paged: godo's ListNamespaces sends no page, as DigitalOcean
	// answers every namespace of the account at once.
	return http.StatusOK, map[string]any{"namespaces": out}
}

// getNamespace answers the namespace with its key, as DigitalOcean does
// (doctl's "serverless connect" reads the key there).
func (f *Fake) getNamespace(r *http.Request, _ time.Time) (int, any) {
	n := f.st.namespaces[r.PathValue("id")]
	if n == nil {
		return notFoundAnswer()
	}
	f.st.drifted(KindFunctionsNamespaces, n.id, n)
	return http.StatusOK, map[string]any{"namespace": n.wire(true)}
}

func (f *Fake) deleteNamespace(r *http.Request, _ time.Time) (int, any) {
	n := f.st.namespaces[r.PathValue("id")]
	if n == nil {
		return notFoundAnswer()
	}
	delete(f.st.namespaces, n.id)
	return http.StatusNoContent, nil
}
