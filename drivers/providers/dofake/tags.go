package dofake

import (
	"net/http"
	"slices"
	"sort"
	"strconv"
	"time"
)

type wireTagged struct {
	Count         int    `json:"count"`
	LastTaggedURI string `json:"last_tagged_uri,omitempty"`
}

type wireTagResources struct {
	Count           int        `json:"count"`
	LastTaggedURI   string     `json:"last_tagged_uri,omitempty"`
	Droplets        wireTagged `json:"droplets"`
	Images          wireTagged `json:"images"`
	Volumes         wireTagged `json:"volumes"`
	VolumeSnapshots wireTagged `json:"volume_snapshots"`
	Databases       wireTagged `json:"databases"`
}

type wireTag struct {
	Name      string           `json:"name"`
	Resources wireTagResources `json:"resources"`
}

// wireTag counts the listed droplets and clusters carrying name (a droplet still
// hidden by the listing lag is not counted, as the tag index lags too).
func (st *state) wireTag(r *http.Request, name string, now time.Time) wireTag {
	t := wireTag{Name: name}
	last := 0
	for _, d := range st.listed(now) {
		if slices.Contains(d.tags, name) {
			t.Resources.Droplets.Count++
			last = d.id
		}
	}
	lastDB := ""
	for _, c := range st.listedClusters(now) {
		if slices.Contains(c.tags, name) {
			t.Resources.Databases.Count++
			lastDB = c.id
		}
	}
	t.Resources.Count = t.Resources.Droplets.Count + t.Resources.Databases.Count
	if lastDB != "" {
		t.Resources.Databases.LastTaggedURI = baseURL(r) + "/v2/databases/" + lastDB
	}
	if last != 0 {
		uri := baseURL(r) + "/v2/droplets/" + strconv.Itoa(last)
		t.Resources.LastTaggedURI, t.Resources.Droplets.LastTaggedURI = uri, uri
	}
	return t
}

func (f *Fake) createTag(r *http.Request, now time.Time) (int, any) {
	var req struct {
		Name string `json:"name"`
	}
	if err := decode(r, &req); err != nil {
		return fail(http.StatusBadRequest, "%v", err)
	}
	if !tagRE.MatchString(req.Name) {
		return fail(http.StatusUnprocessableEntity, "Tags may contain letters, numbers, colons, dashes, and underscores (at most 255).")
	}
	f.st.tags[req.Name] = true
	return http.StatusCreated, map[string]any{"tag": f.st.wireTag(r, req.Name, now)}
}

func (f *Fake) listTags(r *http.Request, now time.Time) (int, any) {
	names := make([]string, 0, len(f.st.tags))
	for n := range f.st.tags {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]wireTag, 0, len(names))
	for _, n := range names {
		out = append(out, f.st.wireTag(r, n, now))
	}
	return paged(r, "tags", out)
}

func (f *Fake) getTag(r *http.Request, now time.Time) (int, any) {
	name := r.PathValue("tag")
	if !f.st.tags[name] {
		return notFoundAnswer()
	}
	return http.StatusOK, map[string]any{"tag": f.st.wireTag(r, name, now)}
}

func (f *Fake) deleteTag(r *http.Request, _ time.Time) (int, any) {
	name := r.PathValue("tag")
	if !f.st.tags[name] {
		return notFoundAnswer()
	}
	delete(f.st.tags, name)
	for _, d := range f.st.droplets {
		d.tags = slices.DeleteFunc(d.tags, func(t string) bool { return t == name })
	}
	for _, c := range f.st.clusters {
		c.tags = slices.DeleteFunc(c.tags, func(t string) bool { return t == name })
	}
	return http.StatusNoContent, nil
}

type tagResourcesRequest struct {
	Resources []struct {
		ID   string `json:"resource_id"`
		Type string `json:"resource_type"`
	} `json:"resources"`
}

// taggedResources checks a tag-resources body: the tag exists, every
// resource is a droplet or a database cluster that exists. It answers
// their tag lists; nothing changes unless all are found.
func (f *Fake) taggedResources(r *http.Request) ([]*[]string, int, any) {
	name := r.PathValue("tag")
	if !f.st.tags[name] {
		s, b := notFoundAnswer()
		return nil, s, b
	}
	var req tagResourcesRequest
	if err := decode(r, &req); err != nil {
		s, b := fail(http.StatusBadRequest, "%v", err)
		return nil, s, b
	}
	if len(req.Resources) == 0 {
		s, b := fail(http.StatusUnprocessableEntity, "resources must name at least one resource.")
		return nil, s, b
	}
	var out []*[]string
	for _, res := range req.Resources {
		switch res.Type {
		case "droplet":
			id, err := strconv.Atoi(res.ID)
			d := f.st.droplets[id]
			if err != nil || d == nil {
				s, b := notFoundAnswer()
				return nil, s, b
			}
			out = append(out, &d.tags)
		case "database":
			c := f.st.clusters[res.ID]
			if c == nil {
				s, b := notFoundAnswer()
				return nil, s, b
			}
			out = append(out, &c.tags)
		default:
			s, b := fail(http.StatusUnprocessableEntity, "The fake tags droplets and databases only, not %q.", res.Type)
			return nil, s, b
		}
	}
	return out, 0, nil
}

func (f *Fake) tagResources(r *http.Request, _ time.Time) (int, any) {
	lists, status, body := f.taggedResources(r)
	if lists == nil {
		return status, body
	}
	name := r.PathValue("tag")
	for _, tags := range lists {
		if !slices.Contains(*tags, name) {
			*tags = append(*tags, name)
		}
	}
	return http.StatusNoContent, nil
}

func (f *Fake) untagResources(r *http.Request, _ time.Time) (int, any) {
	lists, status, body := f.taggedResources(r)
	if lists == nil {
		return status, body
	}
	name := r.PathValue("tag")
	for _, tags := range lists {
		*tags = slices.DeleteFunc(*tags, func(t string) bool { return t == name })
	}
	return http.StatusNoContent, nil
}
