package reservations

import (
	"context"
	"testing"
	"time"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The bound ahead is the server's setting, DefaultMaxAhead when unset;
// the tolerance behind is StartTolerance; both on the database's clock.
func TestCheckStartHonoursTheServersBound(t *testing.T) {
	s := testenv.Store(t)
	ctx := context.Background()
	var now time.Time
	if err := s.Pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		start    time.Time
		maxAhead time.Duration
		reason   string // "" when accepted
	}{
		{"a day ahead, default bound", now.Add(24 * time.Hour), 0, ""},
		{"a day ahead, bound of an hour", now.Add(24 * time.Hour), time.Hour, "tooFarAhead"},
		{"past the default year", now.Add(DefaultMaxAhead + time.Hour), 0, "tooFarAhead"},
		{"within a two-year bound", now.Add(DefaultMaxAhead + time.Hour), 2 * DefaultMaxAhead, ""},
		{"within the tolerance", now.Add(-StartTolerance / 2), 0, ""},
		{"past the tolerance", now.Add(-2 * StartTolerance), 0, "past"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := tc.start.UnixMilli()
			err := s.InTx(ctx, store.ReadOnly, func(tx store.Tx) error { return checkStart(ctx, tx, &start, tc.maxAhead) })
			ce := core.AsError(err)
			switch {
			case tc.reason == "" && err != nil:
				t.Fatalf("checkStart = %v, want accepted", err)
			case tc.reason != "" && (ce.Code != core.CodeInvalidInput || ce.Details["field"] != "start" || ce.Details["reason"] != tc.reason):
				t.Fatalf("checkStart = %v %+v, want INVALID_INPUT start %s", err, ce.Details, tc.reason)
			}
		})
	}
}
