package fleet

import (
	"testing"

	"github.com/better-compute/better-compute/core"
)

func TestDiff(t *testing.T) {
	site := Site{Name: "fra-1", Kind: "shared", Region: "eu-central", IAMRegion: "eu-central-1"}
	pool := Pool{Name: "a", Site: "fra-1", Class: "metal-host", GPUModel: "H100", GPUMemoryGb: 80, Sharing: "exclusive", Agent: "bcd", BillingMode: "metered"}
	live := Live{Document: Document{Sites: []Site{site}, Pools: []Pool{pool}},
		SiteIDs: map[string]string{"fra-1": "site_1"}, PoolIDs: map[string]string{"a": "pool_1"}, Busy: map[string]bool{}}
	with := func(f func(*Pool)) Pool { p := pool; f(&p); return p }
	for _, tc := range []struct {
		name    string
		want    Document
		busy    bool
		kept    bool
		ops     []string // op kind name
		refused int
	}{
		{"same", Document{Sites: []Site{site}, Pools: []Pool{pool}}, false, false, nil, 0},
		{"update", Document{Sites: []Site{site}, Pools: []Pool{with(func(p *Pool) { p.Agent = "none" })}}, false, false, []string{"update pool a"}, 0},
		{"immutable", Document{Sites: []Site{site}, Pools: []Pool{with(func(p *Pool) { p.GPUModel = "A100" })}}, false, false, []string{"update pool a"}, 1},
		{"delete all", Document{}, false, false, []string{"delete pool a", "delete site fra-1"}, 0},
		{"delete busy", Document{Sites: []Site{site}}, true, false, []string{"delete pool a"}, 1},
		{"delete kept site", Document{}, false, true, []string{"delete pool a", "delete site fra-1"}, 1},
		{"create first", Document{Sites: []Site{site, {Name: "ams-1", Kind: "shared", Region: "eu-west", IAMRegion: "eu-west-1"}},
			Pools: []Pool{pool, with(func(p *Pool) { p.Name = "b"; p.Site = "ams-1" })}}, false, false, []string{"create site ams-1", "create pool b"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			live.Busy["a"], live.Kept = tc.busy, map[string]bool{"fra-1": tc.kept}
			changes := Diff(live, tc.want)
			var got []string
			for _, c := range changes {
				got = append(got, c.Op+" "+c.Kind+" "+c.Name)
			}
			if len(got) != len(tc.ops) {
				t.Fatalf("changes = %q, want %q", got, tc.ops)
			}
			for i := range got {
				if got[i] != tc.ops[i] {
					t.Fatalf("changes = %q, want %q", got, tc.ops)
				}
			}
			if n := len(Refused(changes)); n != tc.refused {
				t.Fatalf("%d refused, want %d", n, tc.refused)
			}
		})
	}
}

func TestDigestIgnoresOrder(t *testing.T) {
	a := Document{Sites: []Site{{Name: "b"}, {Name: "a"}}}
	b := Document{Sites: []Site{{Name: "a"}, {Name: "b"}}}
	if Digest(a) != Digest(b) || Digest(a) == Digest(Document{}) {
		t.Fatal("digest depends on order or ignores content")
	}
}

func TestParse(t *testing.T) {
	schema, err := Schema()
	if err != nil {
		t.Fatal(err)
	}
	for text, field := range map[string]string{
		`{"apiVersion":"better-compute/fleet/v1","sites":[{"name":"a","kind":"shared","region":"eu","iamRegion":"eu-west-1"}]}`:                                                   "",
		"apiVersion: better-compute/fleet/v1\nsites:\n- {name: a, kind: moon, region: eu, iamRegion: eu-west-1}\n":                                                                "document.sites.0.kind",
		"apiVersion: better-compute/fleet/v1\nsites:\n- {name: a, kind: shared, region: eu, iamRegion: eu-west-1}\n- {name: a, kind: shared, region: eu, iamRegion: eu-west-1}\n": "document.sites.1.name",
	} {
		_, err := Parse(schema, text)
		if field == "" {
			if err != nil {
				t.Errorf("%s: %v", text, err)
			}
			continue
		}
		if e := core.AsError(err); e == nil || e.Code != core.CodeInvalidInput || e.Details["field"] != field {
			t.Errorf("%s = %v, want INVALID_INPUT on %s", text, err, field)
		}
	}
}
