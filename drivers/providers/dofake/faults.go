package dofake

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path"
	"strconv"
	"time"
)

// Always, as a fault's Count, makes it affect every matching request until
// the faults are cleared.
const Always = -1

// FaultKind is how a fault misbehaves.
type FaultKind string

const (
	// FaultStatus answers Status (429, 500, 503, …) without doing
	// anything.
	FaultStatus FaultKind = "status"
	// FaultDrop closes the connection without an answer, without doing
	// anything.
	FaultDrop FaultKind = "drop"
	// FaultApplyThenStatus does the request, then answers Status (500
	// when zero) instead of its answer: the caller cannot tell it worked.
	FaultApplyThenStatus FaultKind = "apply-then-status"
	// FaultApplyThenDrop does the request, then closes the connection
	// without an answer: an unknown outcome.
	FaultApplyThenDrop FaultKind = "apply-then-drop"
	// FaultSlow does the request and answers after Delay (real time;
	// sooner if the client goes away): for a client's timeout.
	FaultSlow FaultKind = "slow"
)

// applies reports whether the request takes effect before the fault shows.
func (k FaultKind) applies() bool {
	return k == FaultApplyThenStatus || k == FaultApplyThenDrop || k == FaultSlow
}

// Fault is one injected misbehaviour: the next Count requests matching
// Method and Path (after authentication and the rate limits) misbehave as
// Kind says. The first fault in injection order that matches a request
// takes it.
type Fault struct {
	// Method matches the request's method; any when empty.
	Method string
	// Path is a path.Match pattern over the request's path
	// ("/v2/droplets", "/v2/droplets/*/actions"); any when empty.
	Path string
	// Count is how many requests it affects (1 when zero; Always).
	Count int
	Kind  FaultKind
	// Status is the answer of FaultStatus (required) and
	// FaultApplyThenStatus (500 when zero).
	Status int
	// RetryAfter is the Retry-After of a 429 or 503 (1 s when zero; a
	// 429 also answers RateLimit-Remaining 0 until then).
	RetryAfter time.Duration
	// Delay is FaultSlow's wait.
	Delay time.Duration
}

func (ft Fault) normalized() (Fault, error) {
	if ft.Count == 0 {
		ft.Count = 1
	}
	if ft.Count < 0 {
		ft.Count = Always
	}
	if _, err := path.Match(ft.Path, "/"); err != nil {
		return ft, fmt.Errorf("dofake: fault path %q: %w", ft.Path, err)
	}
	switch ft.Kind {
	case FaultStatus:
		if ft.Status < 400 || ft.Status > 599 {
			return ft, fmt.Errorf("dofake: a %s fault needs a status from 400 to 599, not %d", ft.Kind, ft.Status)
		}
	case FaultApplyThenStatus:
		if ft.Status == 0 {
			ft.Status = http.StatusInternalServerError
		}
		if ft.Status < 400 || ft.Status > 599 {
			return ft, fmt.Errorf("dofake: a %s fault needs a status from 400 to 599, not %d", ft.Kind, ft.Status)
		}
	case FaultDrop, FaultApplyThenDrop:
	case FaultSlow:
		if ft.Delay <= 0 {
			return ft, errors.New("dofake: a slow fault needs a positive delay")
		}
	default:
		return ft, fmt.Errorf("dofake: unknown fault kind %q", ft.Kind)
	}
	if ft.RetryAfter <= 0 {
		ft.RetryAfter = time.Second
	}
	return ft, nil
}

func (ft Fault) matches(r *http.Request) bool {
	if ft.Method != "" && ft.Method != r.Method {
		return false
	}
	if ft.Path == "" {
		return true
	}
	ok, _ := path.Match(ft.Path, r.URL.Path)
	return ok
}

type faultJSON struct {
	Method     string    `json:"method,omitempty"`
	Path       string    `json:"path,omitempty"`
	Count      int       `json:"count"`
	Kind       FaultKind `json:"kind"`
	Status     int       `json:"status,omitempty"`
	RetryAfter string    `json:"retryAfter,omitempty"`
	Delay      string    `json:"delay,omitempty"`
}

// MarshalJSON writes durations as Go duration strings ("1.5s").
func (ft Fault) MarshalJSON() ([]byte, error) {
	j := faultJSON{Method: ft.Method, Path: ft.Path, Count: ft.Count, Kind: ft.Kind, Status: ft.Status}
	if ft.RetryAfter > 0 {
		j.RetryAfter = ft.RetryAfter.String()
	}
	if ft.Delay > 0 {
		j.Delay = ft.Delay.String()
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (ft *Fault) UnmarshalJSON(b []byte) error {
	var j faultJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	out := Fault{Method: j.Method, Path: j.Path, Count: j.Count, Kind: j.Kind, Status: j.Status}
	for _, d := range []struct {
		name, s string
		dst     *time.Duration
	}{{"retryAfter", j.RetryAfter, &out.RetryAfter}, {"delay", j.Delay, &out.Delay}} {
		if d.s == "" {
			continue
		}
		v, err := time.ParseDuration(d.s)
		if err != nil {
			return fmt.Errorf("fault %s: %w", d.name, err)
		}
		*d.dst = v
	}
	*ft = out
	return nil
}

type faultList struct {
	faults []Fault
}

// take uses one count of the first fault matching r.
func (fl *faultList) take(r *http.Request) (Fault, bool) {
	for i := range fl.faults {
		ft := &fl.faults[i]
		if !ft.matches(r) {
			continue
		}
		got := *ft
		if ft.Count != Always {
			ft.Count--
			if ft.Count == 0 {
				fl.faults = append(fl.faults[:i], fl.faults[i+1:]...)
			}
		}
		return got, true
	}
	return Fault{}, false
}

// Inject adds a fault after those already waiting.
func (f *Fake) Inject(ft Fault) error {
	ft, err := ft.normalized()
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.faults.faults = append(f.st.faults.faults, ft)
	return nil
}

// Faults answers the faults still waiting, with their remaining counts.
func (f *Fake) Faults() []Fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Fault{}, f.st.faults.faults...)
}

// ClearFaults removes every waiting fault.
func (f *Fake) ClearFaults() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.faults.faults = nil
}

// misbehave answers a fault that does not apply the request.
func (f *Fake) misbehave(w http.ResponseWriter, r *http.Request, route string, ft Fault, now time.Time, requestID string) {
	if ft.Kind == FaultDrop {
		f.drop(r, route, ft)
	}
	f.faultStatus(w, r, route, ft.Status, ft.RetryAfter, now, requestID)
}

// misbehaveAfter answers a fault once the request took effect with
// status and body.
func (f *Fake) misbehaveAfter(w http.ResponseWriter, r *http.Request, route string, ft Fault, now time.Time, requestID string, status int, body any) {
	switch ft.Kind {
	case FaultApplyThenDrop:
		f.drop(r, route, ft)
	case FaultApplyThenStatus:
		f.faultStatus(w, r, route, ft.Status, ft.RetryAfter, now, requestID)
	case FaultSlow:
		t := time.NewTimer(ft.Delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
		}
		f.answer(w, r, route, status, body)
	}
}

// drop closes the connection without an answer (net/http aborts the
// response and, on HTTP/1, closes the connection).
func (f *Fake) drop(r *http.Request, route string, ft Fault) {
	f.log.Info("dofake dropping the connection", "method", r.Method, "route", route, "kind", ft.Kind)
	panic(http.ErrAbortHandler)
}

func (f *Fake) faultStatus(w http.ResponseWriter, r *http.Request, route string, status int, retryAfter time.Duration, now time.Time, requestID string) {
	secs := strconv.Itoa(max(0, int((retryAfter+time.Second-1)/time.Second)))
	switch status {
	case http.StatusTooManyRequests:
		w.Header().Set("RateLimit-Remaining", "0")
		w.Header().Set("RateLimit-Reset", strconv.FormatInt(now.Add(retryAfter).Unix(), 10))
		w.Header().Set("Retry-After", secs)
		f.answer(w, r, route, status, errBody("too_many_requests", "API Rate limit exceeded.", requestID))
	case http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", secs)
		f.answer(w, r, route, status, errBody("service_unavailable", "The service is temporarily unavailable.", requestID))
	default:
		f.answer(w, r, route, status, errBody(errorID(status), "Server was unable to give you a response.", requestID))
	}
}
