package webhooks

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/better-compute/better-compute/core"
)

func TestCheckURLRefusesWhatIsNotPublic(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		url, reason   string
		allowLoopback bool
	}{
		{"https://93.184.216.34/hook", "", false},
		{"https://[2606:2800:220:1:248:1893:25c8:1946]:8443/hook", "", false},
		{"https://10.0.0.1/hook", "privateAddress", false},
		{"https://192.168.1.20/hook", "privateAddress", true},
		{"https://172.16.0.1/hook", "privateAddress", false},
		{"https://169.254.169.254/latest/meta-data", "privateAddress", true},
		{"https://100.64.0.1/hook", "privateAddress", false},
		{"https://0.0.0.0/hook", "privateAddress", false},
		{"https://127.0.0.1/hook", "privateAddress", false},
		{"https://[::1]/hook", "privateAddress", false},
		{"https://[::ffff:10.0.0.1]/hook", "privateAddress", false},
		{"https://[fd00::1]/hook", "privateAddress", false},
		{"https://localhost/hook", "privateAddress", false},
		{"http://127.0.0.1:9000/hook", "", true},
		{"http://localhost:9000/hook", "", true},
		{"http://93.184.216.34/hook", "scheme", true},
		{"ftp://93.184.216.34/hook", "scheme", false},
		{"https://user:pw@93.184.216.34/hook", "credentials", false},
		{"/relative", "format", false},
		{"https://no-such-host.invalid/hook", "unresolvable", false},
	} {
		err := New(tc.allowLoopback, 0).CheckURL(ctx, tc.url)
		if tc.reason == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.url, err)
			}
			continue
		}
		if ce := core.AsError(err); ce == nil || ce.Code != core.CodeInvalidInput || ce.Details["reason"] != tc.reason {
			t.Errorf("%s (loopback %v) = %v, want INVALID_INPUT %s", tc.url, tc.allowLoopback, err, tc.reason)
		}
	}
}

func TestSendSignsAndTheGuardHoldsAtConnect(t *testing.T) {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	var got http.Header
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, body = r.Header.Clone(), must(io.ReadAll(r.Body))
		if r.URL.Path == "/redirect" {
			http.Redirect(w, r, "http://169.254.169.254/", http.StatusFound)
			return
		}
		io.WriteString(w, strings.Repeat("x", 2*ResponseLimit))
	}))
	defer srv.Close()
	ctx := context.Background()
	m := Message{URL: srv.URL + "/hook", ID: "msg_1", Body: []byte(`{"type":"webhook.ping"}`), Secrets: []string{secret, "whsec_" + "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}}

	// The guard refuses a loopback receiver unless allowed: at connect time,
	// whatever CheckURL said before.
	if res := New(false, 0).Send(ctx, m); res.OK || !strings.Contains(res.Err, "prohibited") {
		t.Fatalf("send to loopback without leave = %+v", res)
	}
	res := New(true, 0).Send(ctx, m)
	if !res.OK || res.Status != 200 || len(res.Response) != ResponseLimit {
		t.Fatalf("send = %+v", res)
	}
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	if err := wh.Verify(body, got); err != nil || got.Get("webhook-id") != "msg_1" {
		t.Fatalf("verify: %v (headers %v)", err, got)
	}
	// A redirect is answered, not followed.
	m.URL = srv.URL + "/redirect"
	if res := New(true, 0).Send(ctx, m); res.Status != http.StatusFound || res.OK {
		t.Fatalf("redirect = %+v", res)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
