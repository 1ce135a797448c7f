package digitalocean_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// doServer is a small DigitalOcean API over httptest in godo's wire format,
// for the few endpoints these tests use, with switchable misbehaviour. The
// project's full fake is drivers/providers/dofake.
type doServer struct {
	t   *testing.T
	srv *httptest.Server

	mu       sync.Mutex
	droplets []*droplet
	actions  map[int]*action
	nextID   int
	creates  int
	requests int
	// createBodies are the raw create requests.
	createBodies []map[string]json.RawMessage
	auth         map[string]bool

	// before answers a request itself when it returns a status (0: go on).
	before func(r *http.Request, n int) (status int, header http.Header)
	// failAfterCreate answers 500 to this many creates after making them.
	failAfterCreate int
	// listLag hides a created droplet from this many listings.
	listLag int
	// actionPolls is how many reads an action stays in-progress.
	actionPolls int
	// rateHeaders are added to every answer.
	rateHeaders http.Header
	// bootReads is how many reads a new droplet stays "new".
	bootReads int
	// pageSize overrides the client's per_page (0: the client's).
	pageSize int
}

type droplet struct {
	ID        int      `json:"id"`
	Name      string   `json:"name"`
	Memory    int      `json:"memory"`
	Vcpus     int      `json:"vcpus"`
	Disk      int      `json:"disk"`
	Status    string   `json:"status"`
	SizeSlug  string   `json:"size_slug"`
	Tags      []string `json:"tags"`
	CreatedAt string   `json:"created_at"`
	Region    struct {
		Slug string `json:"slug"`
	} `json:"region"`
	Networks struct {
		V4 []map[string]string `json:"v4"`
	} `json:"networks"`
	hiddenFor int
	newFor    int
}

type action struct {
	ID         int    `json:"id"`
	Status     string `json:"status"`
	Type       string `json:"type"`
	ResourceID int    `json:"resource_id"`
	polls      int
	apply      func()
}

func newDOServer(t *testing.T) *doServer {
	s := &doServer{t: t, actions: map[int]*action{}, nextID: 1000, auth: map[string]bool{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v2/droplets", s.listDroplets)
	mux.HandleFunc("POST /v2/droplets", s.createDroplet)
	mux.HandleFunc("GET /v2/droplets/{id}", s.getDroplet)
	mux.HandleFunc("DELETE /v2/droplets/{id}", s.deleteDroplet)
	mux.HandleFunc("POST /v2/droplets/{id}/actions", s.postAction)
	mux.HandleFunc("GET /v2/droplets/{id}/actions/{aid}", s.getAction)
	mux.HandleFunc("GET /v2/sizes", func(w http.ResponseWriter, r *http.Request) {
		s.page(w, r, "sizes", []map[string]any{
			{"slug": "s-1vcpu-1gb", "memory": 1024, "vcpus": 1, "disk": 25, "price_monthly": 6.0, "price_hourly": 0.00893, "regions": []string{"nyc3"}, "available": true},
			{"slug": "gpu-h100x1-80gb", "memory": 245760, "vcpus": 20, "disk": 720, "price_monthly": 2488.32, "price_hourly": 3.39, "regions": []string{"tor1"}, "available": true,
				"gpu_info": map[string]any{"count": 1, "model": "nvidia_h100", "vram": map[string]any{"amount": 80, "unit": "gib"}}},
		})
	})
	mux.HandleFunc("GET /v2/regions", func(w http.ResponseWriter, r *http.Request) {
		s.page(w, r, "regions", []map[string]any{
			{"slug": "nyc3", "name": "New York 3", "available": true, "sizes": []string{"s-1vcpu-1gb"}},
			{"slug": "tor1", "name": "Toronto 1", "available": true, "sizes": []string{"gpu-h100x1-80gb"}},
		})
	})
	mux.HandleFunc("GET /v2/images", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("type") != "distribution" {
			s.fail(w, http.StatusBadRequest, "bad_request", "type must be distribution here")
			return
		}
		var images []map[string]any
		for i := range 5 {
			images = append(images, map[string]any{"id": 100 + i, "slug": fmt.Sprintf("ubuntu-2%d-04-x64", i), "name": fmt.Sprintf("2%d.04 (LTS) x64", i),
				"distribution": "Ubuntu", "regions": []string{"nyc3"}, "public": true, "type": "base"})
		}
		s.page(w, r, "images", images)
	})
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.requests++
		n := s.requests
		s.auth[r.Header.Get("Authorization")] = true
		before := s.before
		for k, v := range s.rateHeaders {
			w.Header()[k] = v
		}
		s.mu.Unlock()
		if before != nil {
			if status, h := before(r, n); status != 0 {
				for k, v := range h {
					w.Header()[k] = v
				}
				s.fail(w, status, "injected", "injected failure")
				return
			}
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *doServer) fail(w http.ResponseWriter, status int, id, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"id": id, "message": msg, "request_id": "req-1"})
}

func (s *doServer) write(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(body); err != nil {
		s.t.Errorf("encoding an answer: %v", err)
	}
}

// page answers items in godo's paged envelope, honouring page and per_page.
func (s *doServer) page(w http.ResponseWriter, r *http.Request, key string, items any) {
	raw, _ := json.Marshal(items)
	var all []json.RawMessage
	_ = json.Unmarshal(raw, &all)
	page, _ := strconv.Atoi(r.URL.Query().Get("page"))
	per, _ := strconv.Atoi(r.URL.Query().Get("per_page"))
	if page < 1 {
		page = 1
	}
	if per < 1 {
		per = 20
	}
	s.mu.Lock()
	if s.pageSize > 0 {
		per = s.pageSize
	}
	s.mu.Unlock()
	lo, hi := min((page-1)*per, len(all)), min(page*per, len(all))
	links := map[string]any{}
	if hi < len(all) {
		next := *r.URL
		q := next.Query()
		q.Set("page", strconv.Itoa(page+1))
		next.RawQuery = q.Encode()
		links["pages"] = map[string]string{"next": "http://" + r.Host + next.String()}
	}
	s.write(w, http.StatusOK, map[string]any{key: all[lo:hi], "links": links, "meta": map[string]int{"total": len(all)}})
}

func (s *doServer) listDroplets(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	tag := r.URL.Query().Get("tag_name")
	var out []*droplet
	for _, d := range s.droplets {
		if tag != "" && !slices.Contains(d.Tags, tag) {
			continue
		}
		if d.hiddenFor > 0 {
			d.hiddenFor--
			continue
		}
		out = append(out, d)
	}
	s.mu.Unlock()
	if out == nil {
		out = []*droplet{}
	}
	s.page(w, r, "droplets", out)
}

func (s *doServer) createDroplet(w http.ResponseWriter, r *http.Request) {
	var body map[string]json.RawMessage
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		s.fail(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	var req struct {
		Name   string   `json:"name"`
		Region string   `json:"region"`
		Size   string   `json:"size"`
		Tags   []string `json:"tags"`
	}
	raw, _ := json.Marshal(body)
	_ = json.Unmarshal(raw, &req)
	if req.Name == "" || req.Size == "" {
		s.fail(w, http.StatusUnprocessableEntity, "unprocessable_entity", "name and size are required")
		return
	}
	s.mu.Lock()
	s.creates++
	s.createBodies = append(s.createBodies, body)
	s.nextID++
	d := &droplet{ID: s.nextID, Name: req.Name, Memory: 1024, Vcpus: 1, Disk: 25, Status: "active", SizeSlug: req.Size, Tags: req.Tags,
		CreatedAt: time.Now().UTC().Format(time.RFC3339), hiddenFor: s.listLag, newFor: s.bootReads}
	if d.newFor > 0 {
		d.Status = "new"
	}
	d.Region.Slug = req.Region
	d.Networks.V4 = []map[string]string{{"ip_address": "203.0.113.7", "type": "public"}, {"ip_address": "10.0.0.7", "type": "private"}}
	s.droplets = append(s.droplets, d)
	fail := s.failAfterCreate > 0
	if fail {
		s.failAfterCreate--
	}
	s.mu.Unlock()
	if fail {
		s.fail(w, http.StatusInternalServerError, "server_error", "something went wrong after the create")
		return
	}
	s.write(w, http.StatusAccepted, map[string]any{"droplet": d, "links": map[string]any{}})
}

func (s *doServer) find(w http.ResponseWriter, r *http.Request) (*droplet, bool) {
	id, _ := strconv.Atoi(r.PathValue("id"))
	for _, d := range s.droplets {
		if d.ID == id {
			return d, true
		}
	}
	s.fail(w, http.StatusNotFound, "not_found", "The resource you were accessing could not be found.")
	return nil, false
}

func (s *doServer) getDroplet(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	d, ok := s.find(w, r)
	var copy droplet
	if ok {
		if d.newFor > 0 {
			if d.newFor--; d.newFor == 0 {
				d.Status = "active"
			}
		}
		copy = *d
	}
	s.mu.Unlock()
	if ok {
		s.write(w, http.StatusOK, map[string]any{"droplet": copy})
	}
}

func (s *doServer) deleteDroplet(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.find(w, r)
	if !ok {
		return
	}
	s.droplets = slices.DeleteFunc(s.droplets, func(o *droplet) bool { return o == d })
	w.WriteHeader(http.StatusNoContent)
}

func (s *doServer) postAction(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Type string `json:"type"`
		Size string `json:"size"`
		Disk bool   `json:"disk"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		s.fail(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.find(w, r)
	if !ok {
		return
	}
	a := &action{ID: len(s.actions) + 1, Status: "in-progress", Type: req.Type, ResourceID: d.ID, polls: s.actionPolls}
	switch req.Type {
	case "power_on":
		a.apply = func() { d.Status = "active" }
	case "power_off":
		a.apply = func() { d.Status = "off" }
	case "resize":
		if d.Status != "off" {
			s.fail(w, http.StatusUnprocessableEntity, "unprocessable_entity", "Droplet is currently on. Please power it off to run this event.")
			return
		}
		if req.Disk {
			s.fail(w, http.StatusBadRequest, "bad_request", "the tests resize without the disk")
			return
		}
		a.apply = func() { d.SizeSlug = req.Size }
	default:
		s.fail(w, http.StatusUnprocessableEntity, "unprocessable_entity", "unknown action "+req.Type)
		return
	}
	s.actions[a.ID] = a
	s.advance(a)
	s.write(w, http.StatusCreated, map[string]any{"action": a})
}

func (s *doServer) advance(a *action) {
	if a.Status != "in-progress" {
		return
	}
	if a.polls > 0 {
		a.polls--
		return
	}
	a.apply()
	a.Status = "completed"
}

func (s *doServer) getAction(w http.ResponseWriter, r *http.Request) {
	aid, _ := strconv.Atoi(r.PathValue("aid"))
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.actions[aid]
	if !ok {
		s.fail(w, http.StatusNotFound, "not_found", "no such action")
		return
	}
	s.advance(a)
	s.write(w, http.StatusOK, map[string]any{"action": a})
}

func (s *doServer) createCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.creates
}

func (s *doServer) dropletCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.droplets)
}
