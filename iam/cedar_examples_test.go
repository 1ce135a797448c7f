package iam

import (
	"strings"
	"testing"

	"github.com/better-compute/better-compute/iam/policies"
)

func embExample(t *testing.T, env *embTestEnv, tenant, name string) {
	t.Helper()
	text, ok := policies.Get(name)
	if !ok {
		t.Fatalf("no example %q", name)
	}
	env.policy(tenant, name, text)
}

// embReservation is a draft reservation in pool_1 for the resolver.
func embReservation(id, owner string, attrs map[string]any) Resolved {
	return Resolved{TenantID: "acme", Type: "compute-reservation", ID: id, OwnerID: owner,
		ParentType: "compute-pool", ParentID: "pool_1", Attributes: attrs}
}

type embExampleCase struct {
	name   string
	caller *Caller
	action string
	res    Resolved
	allow  bool
}

func embRunExamples(t *testing.T, env *embTestEnv, cases []embExampleCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env.resolver.put(tc.res)
			d := env.authorize(Request{Caller: tc.caller, TenantID: tc.res.TenantID, Action: tc.action,
				Resource: Resource{Type: tc.res.Type, ID: tc.res.ID}})
			if d.Allowed != tc.allow {
				t.Fatalf("decision = %+v, want allowed %v", d, tc.allow)
			}
		})
	}
}

func TestExamplePoliciesParse(t *testing.T) {
	all := policies.All()
	var names []string
	for _, ex := range all {
		names = append(names, ex.Name)
		if _, err := ParsePolicies(ex.Name, ex.Cedar); err != nil {
			t.Errorf("%s: %v", ex.Name, err)
		}
		if !policyNamePattern.MatchString(ex.Name) {
			t.Errorf("%s is not a valid policy name", ex.Name)
		}
	}
	want := []string{policies.BoundedExtend, policies.DataCloudResources, policies.PoolUsersReserveH100, policies.ReadOnlyAuditor}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Fatalf("examples = %v, want %v", names, want)
	}
	if _, ok := policies.Get("../policies"); ok {
		t.Fatalf("Get reads outside the examples")
	}
	text, _ := policies.Get(policies.PoolUsersReserveH100)
	moved := policies.WithTypePrefix(text, "gpu-")
	if !strings.Contains(moved, `"gpu-reservation"`) || strings.Contains(moved, `"compute-reservation"`) ||
		!strings.Contains(moved, `Action::"compute:reservations:create"`) {
		t.Fatalf("WithTypePrefix:\n%s", moved)
	}
}

func TestExamplePoolUsersReserveH100(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	embExample(t, env, "acme", policies.PoolUsersReserveH100)
	alice, aliceC := env.person("acme", "alice")
	bob, bobC := env.person("acme", "bob")
	_, carolC := env.person("acme", "carol")
	env.relate(alice, "user", "compute-pool", "pool_1")
	env.relate(bob, "viewer", "compute-pool", "pool_1")
	h100 := func(gpus, hours any) map[string]any {
		return map[string]any{"gpuModel": "H100", "gpuCount": gpus, "durationHours": hours, "region": "eu"}
	}
	create := "compute:reservations:create"
	embRunExamples(t, env, []embExampleCase{
		{"8 H100 for 72 hours", aliceC, create, embReservation("rsv_1", alice.ID, h100(8, 72)), true},
		{"1 H100 for 1 hour", aliceC, create, embReservation("rsv_2", alice.ID, h100(1, 1)), true},
		{"9 H100", aliceC, create, embReservation("rsv_3", alice.ID, h100(9, 72)), false},
		{"73 hours", aliceC, create, embReservation("rsv_4", alice.ID, h100(8, 73)), false},
		{"72.5 hours rounds up to 73", aliceC, create, embReservation("rsv_5", alice.ID, h100(8, 72.5)), false},
		{"71.5 hours rounds up to 72", aliceC, create, embReservation("rsv_5b", alice.ID, h100(8, 71.5)), true},
		{"JSON numbers", aliceC, create, embReservation("rsv_6", alice.ID, h100(float64(8), float64(72))), true},
		{"A100", aliceC, create, embReservation("rsv_7", alice.ID, map[string]any{"gpuModel": "A100", "gpuCount": 1, "durationHours": 1}), false},
		{"no gpuCount", aliceC, create, embReservation("rsv_8", alice.ID, map[string]any{"gpuModel": "H100", "durationHours": 1}), false},
		{"no durationHours", aliceC, create, embReservation("rsv_9", alice.ID, map[string]any{"gpuModel": "H100", "gpuCount": 1}), false},
		{"a pool viewer", bobC, create, embReservation("rsv_10", bob.ID, h100(1, 1)), false},
		{"no relation on the pool", carolC, create, embReservation("rsv_11", "", h100(1, 1)), false},
		{"another action", aliceC, "compute:reservations:release", embReservation("rsv_12", alice.ID, h100(1, 1)), false},
		{"a user of another pool", aliceC, create, Resolved{TenantID: "acme", Type: "compute-reservation", ID: "rsv_13",
			ParentType: "compute-pool", ParentID: "pool_2", Attributes: h100(1, 1)}, false},
	})
}

func TestExampleBoundedExtend(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	embExample(t, env, "acme", policies.BoundedExtend)
	owner, ownerC := env.person("acme", "owner")
	user, userC := env.person("acme", "user")
	_, strangerC := env.person("acme", "stranger")
	env.relate(user, "user", "compute-pool", "pool_1")
	extend := "compute:reservations:extend"
	hours := func(h any) map[string]any {
		return map[string]any{"gpuModel": "H100", "gpuCount": 8, "durationHours": h}
	}
	cases := []embExampleCase{
		{"the owner to 72 hours", ownerC, extend, embReservation("rsv_1", owner.ID, hours(72)), true},
		{"the owner to 73 hours", ownerC, extend, embReservation("rsv_2", owner.ID, hours(73)), false},
		{"the owner without durationHours", ownerC, extend, embReservation("rsv_3", owner.ID, map[string]any{}), false},
		{"a pool user to 72 hours", userC, extend, embReservation("rsv_4", owner.ID, hours(72)), true},
		{"a pool user to 100 hours", userC, extend, embReservation("rsv_5", owner.ID, hours(100)), false},
		{"a stranger", strangerC, extend, embReservation("rsv_6", owner.ID, hours(1)), false},
	}
	embRunExamples(t, env, cases)

	// The cap is a forbid: it holds against any other permit.
	env.policy("acme", "everything", permitAll)
	embRunExamples(t, env, []embExampleCase{
		{"with a broad permit, 72 hours", strangerC, extend, embReservation("rsv_7", owner.ID, hours(72)), true},
		{"with a broad permit, 73 hours", strangerC, extend, embReservation("rsv_8", owner.ID, hours(73)), false},
		{"with a broad permit, no durationHours", ownerC, extend, embReservation("rsv_9", owner.ID, nil), false},
		{"with a broad permit, other actions are not capped", ownerC, "compute:reservations:release", embReservation("rsv_10", owner.ID, hours(500)), true},
	})
}

func TestExampleDataCloudResources(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	embExample(t, env, "acme", policies.DataCloudResources)
	_, alice := env.person("acme", "alice")
	create := "compute:cloud-resources:create"
	crs := func(id string, attrs map[string]any) Resolved {
		return Resolved{TenantID: "acme", Type: "compute-cloud-resource", ID: id, Attributes: attrs}
	}
	cases := []embExampleCase{
		{"a database", alice, create, crs("crs_1", map[string]any{"family": "data", "kind": "postgres"}), true},
		{"a compute resource", alice, create, crs("crs_2", map[string]any{"family": "compute", "kind": "k8s"}), false},
		{"no family", alice, create, crs("crs_3", map[string]any{"kind": "postgres"}), false},
		{"read is not granted", alice, "compute:cloud-resources:read", crs("crs_4", map[string]any{"family": "data"}), false},
	}
	embRunExamples(t, env, cases)
	env.policy("acme", "everything", permitAll)
	embRunExamples(t, env, []embExampleCase{
		{"with a broad permit, data", alice, create, crs("crs_5", map[string]any{"family": "data"}), true},
		{"with a broad permit, not data", alice, create, crs("crs_6", map[string]any{"family": "network"}), false},
		{"with a broad permit, no family", alice, create, crs("crs_7", nil), false},
	})
}

func TestExampleReadOnlyAuditor(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	embExample(t, env, "acme", policies.ReadOnlyAuditor)
	_, auditor := env.person("acme", "auditor", "auditors")
	_, other := env.person("acme", "other", "operators")
	pool := embPool("acme", "pool_1", nil)
	scope := Resolved{TenantID: "acme", Type: "compute-tenant", ID: "acme"}
	node := Resolved{TenantID: "acme", Type: "compute-node", ID: "node_1", ParentType: "compute-pool", ParentID: "pool_1"}
	cases := []embExampleCase{
		{"read a pool", auditor, "compute:pools:read", pool, true},
		{"list reservations", auditor, "compute:reservations:read", scope, true},
		{"read usage", auditor, "compute:usage:read", scope, true},
		{"read a node", auditor, "compute:nodes:read", node, true},
		{"manage a pool", auditor, "compute:pools:manage", pool, false},
		{"exec on a node", auditor, "compute:nodes:exec", node, false},
		{"create a project", auditor, "compute:projects:manage", scope, false},
		{"not an auditor", other, "compute:pools:read", pool, false},
	}
	embRunExamples(t, env, cases)
	env.policy("acme", "everything", permitAll)
	embRunExamples(t, env, []embExampleCase{
		{"with a broad permit, still no manage", auditor, "compute:pools:manage", pool, false},
		{"with a broad permit, reads", auditor, "compute:pools:read", pool, true},
		{"with a broad permit, others may manage", other, "compute:pools:manage", pool, true},
	})
	// Group membership is read at each decision.
	idn, err := env.admin.SetIdentityGroups(env.ctx, SetIdentityGroupsInput{TenantID: "acme", IdentityID: auditor.IdentityID})
	if err != nil || len(idn.Groups) != 0 {
		t.Fatalf("%+v, %v", idn, err)
	}
	embRunExamples(t, env, []embExampleCase{
		{"out of the group, the broad permit applies", auditor, "compute:pools:manage", pool, true},
	})
}
