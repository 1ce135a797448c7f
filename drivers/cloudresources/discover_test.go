package cloudresources

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/drivers/providers"
)

func TestManagedBy(t *testing.T) {
	mine := Owner{ResourceID: "cres_01jmine", TenantID: "ten_a"}
	tests := []struct {
		name    string
		labels  []string
		id      string
		managed bool
		another bool
	}{
		{name: "none", labels: nil},
		{name: "foreign tags only", labels: []string{"prod", "team:x"}},
		{name: "ours", labels: mine.Tags(), id: "cres_01jmine", managed: true},
		{name: "another resource", labels: Owner{ResourceID: "cres_01jother", TenantID: "ten_a"}.Tags(), id: "cres_01jother", managed: true, another: true},
		{name: "managed without a resource id", labels: []string{LabelManaged}, managed: true, another: true},
		{name: "a resource tag without managed", labels: []string{LabelResource + ":cres_x"}, id: "cres_x"},
		{name: "labelled by two at once", labels: append(mine.Tags(), LabelResource+":cres_01jother"), id: "cres_01jmine", managed: true, another: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, managed := ManagedBy(tt.labels)
			require.Equal(t, tt.id, id)
			require.Equal(t, tt.managed, managed)
			err := CheckTakeover(tt.labels, mine)
			require.Equal(t, tt.another, errors.Is(err, ErrManagedByAnother), "%v", err)
			if tt.another {
				require.ErrorIs(t, err, providers.ErrRefused)
			}
		})
	}
}

func TestSentinelsAreRefusals(t *testing.T) {
	for _, err := range []error{ErrManagedByAnother, ErrOwnedByName, ErrNotListable, ErrPreview} {
		require.ErrorIs(t, fmt.Errorf("wrapped: %w", err), providers.ErrRefused)
	}
}

func TestCleanSignals(t *testing.T) {
	good := func(id string, at int64) Signal {
		return Signal{ID: id, Severity: SeverityWarning, Title: "run failed", At: at, Kind: "do.app", ProviderID: "app-1"}
	}
	bad := map[string]func(*Signal){
		"severity":          func(s *Signal) { s.Severity = "fatal" },
		"empty title":       func(s *Signal) { s.Title = "  " },
		"multi-line title":  func(s *Signal) { s.Title = "a\nb" },
		"multi-line detail": func(s *Signal) { s.Detail = "a\r\nb" },
		"long detail":       func(s *Signal) { s.Detail = strings.Repeat("x", MaxSignalDetail+1) },
		"no time":           func(s *Signal) { s.At = 0 },
		"no resource":       func(s *Signal) { s.ProviderID = "" },
		"no id":             func(s *Signal) { s.ID = "" },
	}
	in := []Signal{good("a", 10), good("b", 30), good("c", 20), good("d", 30)}
	edge := good("e", 5)
	edge.Detail = strings.Repeat("x", MaxSignalDetail)
	in = append(in, edge)
	for name, spoil := range bad {
		s := good("bad-"+name, 100)
		spoil(&s)
		in = append(in, s)
	}
	var ids []string
	for _, s := range CleanSignals(in) {
		ids = append(ids, s.ID)
	}
	require.Equal(t, []string{"b", "d", "c", "a", "e"}, ids)

	many := make([]Signal, MaxSignals+3)
	for i := range many {
		many[i] = good(fmt.Sprintf("s%04d", i), int64(i+1))
	}
	out := CleanSignals(many)
	require.Len(t, out, MaxSignals)
	require.Equal(t, int64(MaxSignals+3), out[0].At)
}
