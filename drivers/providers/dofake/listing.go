package dofake

import (
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// DigitalOcean's paging: 20 per page unless per_page says otherwise, at
// most 200.
const (
	defaultPerPage = 20
	maxPerPage     = 200
)

type pages struct {
	First string `json:"first,omitempty"`
	Prev  string `json:"prev,omitempty"`
	Next  string `json:"next,omitempty"`
	Last  string `json:"last,omitempty"`
}

type links struct {
	Pages *pages `json:"pages,omitempty"`
}

type meta struct {
	Total int `json:"total"`
}

// paged answers one page of items under key, with DigitalOcean's links
// (absolute URLs keeping the request's other parameters; first and prev
// only after the first page, next and last only before the last) and
// meta.total.
func paged[T any](r *http.Request, key string, items []T) (int, any) {
	q := r.URL.Query()
	perPage, err := strconv.Atoi(q.Get("per_page"))
	if err != nil || perPage < 1 {
		perPage = defaultPerPage
	}
	perPage = min(perPage, maxPerPage)
	page, err := strconv.Atoi(q.Get("page"))
	if err != nil || page < 1 {
		page = 1
	}
	last := max(1, (len(items)+perPage-1)/perPage)
	lo := min(len(items), (page-1)*perPage)
	hi := min(len(items), lo+perPage)
	out := items[lo:hi]
	if out == nil {
		out = []T{}
	}

	link := func(p int) string {
		u := url.URL{Scheme: scheme(r), Host: r.Host, Path: r.URL.Path}
		v := url.Values{}
		for k, vs := range q {
			v[k] = vs
		}
		v.Set("page", strconv.Itoa(p))
		v.Set("per_page", strconv.Itoa(perPage))
		u.RawQuery = v.Encode()
		return u.String()
	}
	var l links
	if page > 1 || page < last {
		l.Pages = &pages{}
		if page > 1 {
			l.Pages.First, l.Pages.Prev = link(1), link(min(page-1, last))
		}
		if page < last {
			l.Pages.Next, l.Pages.Last = link(page+1), link(last)
		}
	}
	return http.StatusOK, map[string]any{key: out, "links": l, "meta": meta{Total: len(items)}}
}

func scheme(r *http.Request) string {
	if r.TLS != nil {
		return "https"
	}
	return "http"
}

// baseURL is the fake's own address as the request reached it.
func baseURL(r *http.Request) string { return scheme(r) + "://" + r.Host }

func (f *Fake) listRegions(r *http.Request, _ time.Time) (int, any) {
	return paged(r, "regions", f.st.regions)
}

func (f *Fake) listSizes(r *http.Request, _ time.Time) (int, any) {
	return paged(r, "sizes", f.st.sizes)
}

// listImages answers the public images; ?type= filters by kind, and
// private (user) images and tagged images are none.
func (f *Fake) listImages(r *http.Request, _ time.Time) (int, any) {
	q := r.URL.Query()
	out := []Image{}
	if q.Get("private") != "true" && q.Get("tag_name") == "" {
		for _, im := range f.st.images {
			if t := q.Get("type"); t != "" && t != im.Kind {
				continue
			}
			out = append(out, im)
		}
	}
	return paged(r, "images", out)
}

// getImage answers an image by id or by slug.
func (f *Fake) getImage(r *http.Request, _ time.Time) (int, any) {
	key := r.PathValue("id")
	im := f.st.imageBySlug(key)
	if id, err := strconv.Atoi(key); err == nil {
		im = f.st.imageByID(id)
	}
	if im == nil {
		return notFoundAnswer()
	}
	return http.StatusOK, map[string]any{"image": im}
}
