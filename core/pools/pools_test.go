package pools

import (
	"reflect"
	"testing"

	"github.com/better-compute/better-compute/core"
)

func fieldOf(err error) (string, string) {
	e := core.AsError(err)
	if e == nil || e.Code != core.CodeInvalidInput {
		return "", ""
	}
	f, _ := e.Details["field"].(string)
	r, _ := e.Details["reason"].(string)
	return f, r
}

func TestValidateChecksWhatTheSchemaCannot(t *testing.T) {
	two := 2
	cases := []struct {
		name          string
		p             *Policy
		sharing       string
		field, reason string // "" means valid
	}{
		{"no policy", nil, "exclusive", "", ""},
		{"replicas on timeslice", &Policy{Sharing: &Sharing{Replicas: two}}, "timeslice", "", ""},
		{"replicas on exclusive", &Policy{Sharing: &Sharing{Replicas: two}}, "exclusive", "policy.sharing.replicas", "sharing"},
		{"sharing without replicas", &Policy{Sharing: &Sharing{}}, "mps", "policy.sharing.replicas", "required"},
		{"mig layout on mig", &Policy{MigLayout: "all-1g.10gb"}, "mig", "", ""},
		{"mig layout on timeslice", &Policy{MigLayout: "all-1g.10gb"}, "timeslice", "policy.migLayout", "sharing"},
		{"lostAfter", &Policy{LostAfter: "5m"}, "exclusive", "", ""},
		{"lostAfter not a duration", &Policy{LostAfter: "soon"}, "exclusive", "policy.lostAfter", "range"},
		{"lostAfter too long", &Policy{LostAfter: "169h"}, "exclusive", "policy.lostAfter", "range"},
		{"overcommit", &Policy{Overcommit: map[string]float64{"vcpu": 2}}, "exclusive", "", ""},
		{"overcommit below 1", &Policy{Overcommit: map[string]float64{"vcpu": 0.5}}, "exclusive", "policy.overcommit", "range"},
		{"overcommit bad name", &Policy{Overcommit: map[string]float64{"V!": 2}}, "exclusive", "policy.overcommit", "pattern"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Validate(tc.p, tc.sharing)
			if f, r := fieldOf(err); f != tc.field || r != tc.reason || (tc.field == "" && err != nil) {
				t.Fatalf("err = %v, want field %q reason %q", err, tc.field, tc.reason)
			}
			if err == nil && (got.DisruptionBudget == nil || *got.DisruptionBudget != DefaultDisruptionBudget) {
				t.Fatalf("disruption budget = %v, want the default", got.DisruptionBudget)
			}
		})
	}
}

func TestQuotaCheck(t *testing.T) {
	many := Quota{}
	for i := range maxResources + 1 {
		many["r"+string(rune('a'+i%26))+string(rune('a'+i/26))] = 1
	}
	for q, want := range map[*Quota][2]string{
		{"gpu": 8}:  {"", ""},
		{"GPU!": 1}: {"quota.GPU!", "pattern"},
		&many:       {"quota", "maxItems"},
	} {
		if f, r := fieldOf(q.Check()); f != want[0] || r != want[1] {
			t.Errorf("%v: field %q reason %q, want %v", *q, f, r, want)
		}
	}
}

func TestQuotaSchemaBoundsEachAmount(t *testing.T) {
	s, err := core.SchemaFor(reflect.TypeFor[struct {
		Quota Quota `json:"quota"`
	}]())
	if err != nil {
		t.Fatal(err)
	}
	for input, want := range map[string]string{
		`{"quota":{"gpu":4}}`:             "",
		`{"quota":{"gpu":-1}}`:            "range",
		`{"quota":{"gpu":1099511627777}}`: "range",
		`{"quota":{"gpu":1.5}}`:           "type",
	} {
		e := s.Validate([]byte(input))
		reason := ""
		if e != nil {
			reason, _ = e.Details["reason"].(string)
		}
		if (e == nil) != (want == "") || reason != want {
			t.Errorf("%s: %v, want %q", input, e, want)
		}
	}
}
