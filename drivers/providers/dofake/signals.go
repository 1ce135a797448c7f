package dofake

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"
)

// Signals are our fake's design of a preview API in DigitalOcean's GenAI
// style (DigitalOcean's Managed Agents Signals have no public REST
// reference yet): GET /v2/gen-ai/signals, paged, answered only to a token
// with previews (Config.PreviewTokens, EnablePreviews); any other token is
// 403 with id "preview_required". Each signal is
//
//	{"id", "severity": "critical"|"warning"|"info", "title", "detail",
//	 "created_at": RFC 3339, "resource": {"type", "id"}}
//
// with resource types "database", "app", "functions_namespace" and
// "dedicated_inference". The fake answers what was added as it was added,
// so a test can add malformed signals its client must drop.

// errPreviewRequired is the id of the answer to a token without previews.
const errPreviewRequired = "preview_required"

// AddSignals adds signals as they will be answered; each must be a JSON
// object, and none is added unless all are.
func (f *Fake) AddSignals(signals ...json.RawMessage) error {
	objs := make([]map[string]any, 0, len(signals))
	for i, raw := range signals {
		var obj map[string]any
		if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
			return fmt.Errorf("dofake: signal %d is not a JSON object", i)
		}
		objs = append(objs, obj)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.signals = append(f.st.signals, objs...)
	return nil
}

// ClearSignals removes every signal.
func (f *Fake) ClearSignals() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.signals = nil
}

// EnablePreviews gives token previews (and accepts it).
func (f *Fake) EnablePreviews(token string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.tokens[token] = true
	f.st.previews[token] = true
}

func (f *Fake) listSignals(r *http.Request, _ time.Time) (int, any) {
	if token, _ := bearer(r); !f.st.previews[token] {
		return http.StatusForbidden, &errorBody{ID: errPreviewRequired, Message: "This API is a preview: enable previews on the account."}
	}
	return paged(r, "signals", slices.Clone(f.st.signals))
}
