package dofake

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"
)

// DropletRecord is a droplet as the fake keeps it, with what the API does
// not answer (its user data, when it joins listings): for tests to assert.
type DropletRecord struct {
	ID         int      `json:"id"`
	Name       string   `json:"name"`
	Status     string   `json:"status"`
	Region     string   `json:"region"`
	Size       string   `json:"size"`
	Image      string   `json:"image"`
	Tags       []string `json:"tags"`
	UserData   string   `json:"userData"`
	PublicIPv4 string   `json:"publicIPv4,omitempty"`
	// CreatedAt and ListedAt are epoch milliseconds.
	CreatedAt int64 `json:"createdAt"`
	ListedAt  int64 `json:"listedAt"`
}

// Droplets answers every droplet not deleted, by id, settled to now.
func (f *Fake) Droplets() []DropletRecord {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.settle(f.now())
	out := []DropletRecord{}
	for _, d := range f.st.droplets {
		out = append(out, DropletRecord{
			ID: d.id, Name: d.name, Status: d.status, Region: d.region, Size: d.size, Image: d.image.Slug,
			Tags: slices.Clone(d.tags), UserData: d.userData, PublicIPv4: d.publicV4,
			CreatedAt: d.created.UnixMilli(), ListedAt: d.listedAt.UnixMilli(),
		})
	}
	slices.SortFunc(out, func(a, b DropletRecord) int { return a.ID - b.ID })
	return out
}

// settingsJSON is the admin form of Settings: durations as Go duration
// strings; on PATCH, an absent field keeps its value.
type settingsJSON struct {
	BootDelay     *string `json:"bootDelay,omitempty"`
	ActionDelay   *string `json:"actionDelay,omitempty"`
	ListLag       *string `json:"listLag,omitempty"`
	DatabaseDelay *string `json:"databaseDelay,omitempty"`
	DeployDelay   *string `json:"deployDelay,omitempty"`
	PerMinute     *int    `json:"perMinute,omitempty"`
	PerHour       *int    `json:"perHour,omitempty"`
}

// MarshalJSON writes durations as strings ("1.5s").
func (s Settings) MarshalJSON() ([]byte, error) {
	str := func(d time.Duration) *string { v := d.String(); return &v }
	return json.Marshal(settingsJSON{
		BootDelay: str(s.BootDelay), ActionDelay: str(s.ActionDelay), ListLag: str(s.ListLag),
		DatabaseDelay: str(s.DatabaseDelay), DeployDelay: str(s.DeployDelay),
		PerMinute: &s.PerMinute, PerHour: &s.PerHour,
	})
}

// UnmarshalJSON reads what MarshalJSON writes; absent fields keep the
// value s had.
func (s *Settings) UnmarshalJSON(b []byte) error {
	var j settingsJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	out := *s
	for _, d := range []struct {
		name string
		s    *string
		dst  *time.Duration
	}{{"bootDelay", j.BootDelay, &out.BootDelay}, {"actionDelay", j.ActionDelay, &out.ActionDelay}, {"listLag", j.ListLag, &out.ListLag},
		{"databaseDelay", j.DatabaseDelay, &out.DatabaseDelay}, {"deployDelay", j.DeployDelay, &out.DeployDelay}} {
		if d.s == nil {
			continue
		}
		v, err := time.ParseDuration(*d.s)
		if err != nil {
			return fmt.Errorf("settings %s: %w", d.name, err)
		}
		*d.dst = v
	}
	if j.PerMinute != nil {
		out.PerMinute = *j.PerMinute
	}
	if j.PerHour != nil {
		out.PerHour = *j.PerHour
	}
	*s = out
	return nil
}

// adminRoutes serve the knobs over HTTP, without authentication or rate
// limits (the fake is a test peer: bind it to loopback):
//
//	GET    /_fake/stats     Stats
//	GET    /_fake/droplets  [DropletRecord]
//	GET    /_fake/faults    the waiting faults
//	POST   /_fake/faults    inject one Fault (or a JSON array of them)
//	DELETE /_fake/faults    clear them
//	GET    /_fake/settings  Settings
//	PATCH  /_fake/settings  change some (PUT: the same)
//	POST   /_fake/tokens    {"token": "…", "previews": bool} accept one more token
//	GET    /_fake/signals   the signals the preview API answers
//	POST   /_fake/signals   add a signal object (or a JSON array of them), malformed ones included
//	DELETE /_fake/signals   clear them
//	GET    /_fake/drift     the drift rules
//	POST   /_fake/drift     add a DriftRule (or a JSON array of them)
//	DELETE /_fake/drift     clear them
func (f *Fake) adminRoutes() {
	f.mux.HandleFunc("GET /_fake/stats", func(w http.ResponseWriter, r *http.Request) {
		adminAnswer(w, http.StatusOK, f.Stats())
	})
	f.mux.HandleFunc("GET /_fake/droplets", func(w http.ResponseWriter, r *http.Request) {
		adminAnswer(w, http.StatusOK, f.Droplets())
	})
	f.mux.HandleFunc("GET /_fake/faults", func(w http.ResponseWriter, r *http.Request) {
		adminAnswer(w, http.StatusOK, f.Faults())
	})
	f.mux.HandleFunc("POST /_fake/faults", func(w http.ResponseWriter, r *http.Request) {
		var raw json.RawMessage
		if err := decode(r, &raw); err != nil {
			adminAnswer(w, http.StatusBadRequest, errBody("bad_request", err.Error(), ""))
			return
		}
		var faults []Fault
		if err := json.Unmarshal(raw, &faults); err != nil {
			var one Fault
			if err := json.Unmarshal(raw, &one); err != nil {
				adminAnswer(w, http.StatusBadRequest, errBody("bad_request", err.Error(), ""))
				return
			}
			faults = []Fault{one}
		}
		for i := range faults {
			n, err := faults[i].normalized()
			if err != nil {
				adminAnswer(w, http.StatusUnprocessableEntity, errBody("unprocessable_entity", err.Error(), ""))
				return
			}
			faults[i] = n
		}
		for _, ft := range faults {
			_ = f.Inject(ft)
		}
		adminAnswer(w, http.StatusOK, f.Faults())
	})
	f.mux.HandleFunc("DELETE /_fake/faults", func(w http.ResponseWriter, r *http.Request) {
		f.ClearFaults()
		w.WriteHeader(http.StatusNoContent)
	})
	f.mux.HandleFunc("GET /_fake/settings", func(w http.ResponseWriter, r *http.Request) {
		adminAnswer(w, http.StatusOK, f.Settings())
	})
	patch := func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		s := f.st.settings
		err := decode(r, &s)
		if err == nil {
			f.st.settings = s.normalized()
		}
		s = f.st.settings
		f.mu.Unlock()
		if err != nil {
			adminAnswer(w, http.StatusBadRequest, errBody("bad_request", err.Error(), ""))
			return
		}
		adminAnswer(w, http.StatusOK, s)
	}
	f.mux.HandleFunc("PATCH /_fake/settings", patch)
	f.mux.HandleFunc("PUT /_fake/settings", patch)
	f.mux.HandleFunc("POST /_fake/tokens", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Token    string `json:"token"`
			Previews bool   `json:"previews"`
		}
		if err := decode(r, &req); err != nil || req.Token == "" {
			adminAnswer(w, http.StatusBadRequest, errBody("bad_request", "a body {\"token\": \"…\"} is required", ""))
			return
		}
		f.AddToken(req.Token)
		if req.Previews {
			f.EnablePreviews(req.Token)
		}
		w.WriteHeader(http.StatusNoContent)
	})
	f.mux.HandleFunc("GET /_fake/signals", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		out := slices.Clone(f.st.signals)
		f.mu.Unlock()
		if out == nil {
			out = []map[string]any{}
		}
		adminAnswer(w, http.StatusOK, out)
	})
	f.mux.HandleFunc("POST /_fake/signals", func(w http.ResponseWriter, r *http.Request) {
		var raw json.RawMessage
		if err := decode(r, &raw); err != nil {
			adminAnswer(w, http.StatusBadRequest, errBody("bad_request", err.Error(), ""))
			return
		}
		var list []json.RawMessage
		if json.Unmarshal(raw, &list) != nil {
			list = []json.RawMessage{raw}
		}
		if err := f.AddSignals(list...); err != nil {
			adminAnswer(w, http.StatusUnprocessableEntity, errBody("unprocessable_entity", err.Error(), ""))
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	f.mux.HandleFunc("DELETE /_fake/signals", func(w http.ResponseWriter, r *http.Request) {
		f.ClearSignals()
		w.WriteHeader(http.StatusNoContent)
	})
	f.mux.HandleFunc("GET /_fake/drift", func(w http.ResponseWriter, r *http.Request) {
		adminAnswer(w, http.StatusOK, f.DriftRules())
	})
	f.mux.HandleFunc("POST /_fake/drift", f.postDrift)
	f.mux.HandleFunc("DELETE /_fake/drift", func(w http.ResponseWriter, r *http.Request) {
		f.ClearDrift()
		w.WriteHeader(http.StatusNoContent)
	})
}

// postDrift adds one drift rule or an array of them; if one is invalid,
// none is added (422).
func (f *Fake) postDrift(w http.ResponseWriter, r *http.Request) {
	var raw json.RawMessage
	if err := decode(r, &raw); err != nil {
		adminAnswer(w, http.StatusBadRequest, errBody("bad_request", err.Error(), ""))
		return
	}
	var rules []DriftRule
	if err := json.Unmarshal(raw, &rules); err != nil {
		var one DriftRule
		if err := json.Unmarshal(raw, &one); err != nil {
			adminAnswer(w, http.StatusBadRequest, errBody("bad_request", err.Error(), ""))
			return
		}
		rules = []DriftRule{one}
	}
	for _, rule := range rules {
		if _, err := rule.normalized(); err != nil {
			adminAnswer(w, http.StatusUnprocessableEntity, errBody("unprocessable_entity", err.Error(), ""))
			return
		}
	}
	for _, rule := range rules {
		_ = f.Drift(rule)
	}
	adminAnswer(w, http.StatusOK, f.DriftRules())
}

func adminAnswer(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
