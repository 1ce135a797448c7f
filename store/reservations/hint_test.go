package reservations

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
)

// A start sent in epoch seconds is refused as past, with a hint that names
// the unit and the millisecond value meant; a start in the past in
// milliseconds gets no hint.
func TestCheckStartHintsAtSeconds(t *testing.T) {
	s := testenv.Store(t)
	ctx := context.Background()
	var now time.Time
	if err := s.Pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		start int64
		hint  string
	}{
		{"an hour ahead in seconds", now.Add(time.Hour).Unix(),
			fmt.Sprintf("start is epoch milliseconds; did you mean %d?", now.Add(time.Hour).Unix()*1000)},
		{"an hour ago in milliseconds", now.Add(-time.Hour).UnixMilli(), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := tc.start
			err := s.InTx(ctx, store.ReadOnly, func(tx store.Tx) error { return checkStart(ctx, tx, &start, 0) })
			ce := core.AsError(err)
			if ce == nil || ce.Code != core.CodeInvalidInput || ce.Details["reason"] != "past" {
				t.Fatalf("checkStart(%d) = %v, want INVALID_INPUT past", start, err)
			}
			if got, _ := ce.Details["hint"].(string); got != tc.hint {
				t.Fatalf("hint %q, want %q", got, tc.hint)
			}
		})
	}
}
