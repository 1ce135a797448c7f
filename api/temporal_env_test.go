package api_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"

	dtemporal "github.com/better-compute/better-compute/deploy/temporal"
)

// startTemporal starts a Temporal server of the test's own and answers a
// client of it (both stopped at the test's end) and its frontend address.
func startTemporal(t *testing.T) (client.Client, string) {
	t.Helper()
	ts, err := dtemporal.Start(context.Background(), dtemporal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ts.Stop)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	tc, err := client.DialContext(context.Background(), client.Options{HostPort: ts.FrontendAddr(), Logger: tlog.NewStructuredLogger(quiet)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tc.Close)
	return tc, ts.FrontendAddr()
}
