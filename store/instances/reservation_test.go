package instances_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	states "github.com/better-compute/better-compute/core/instances"
	"github.com/better-compute/better-compute/core/placement"
	rsvstates "github.com/better-compute/better-compute/core/reservations"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/instances"
	"github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/reservations"
)

// reserve makes the tenant's reservation of gpus GPUs on the pool with
// binding, placed as reservations.create's two transactions place it.
func (f *fixture) reserve(tenantID, poolID, binding string, gpus int) (reservations.Reservation, error) {
	return f.reserveAt(tenantID, poolID, binding, gpus, nil)
}

// reserveAt is reserve with a start (epoch ms; nil: now).
func (f *fixture) reserveAt(tenantID, poolID, binding string, gpus int, start *int64) (reservations.Reservation, error) {
	ctx := context.Background()
	catalog, err := core.DefaultCatalog()
	if err != nil {
		f.t.Fatal(err)
	}
	types := reservations.Types{Reservation: catalog.FullName("reservation"), Pool: catalog.FullName("pool")}
	id := core.NewID("rsv")
	if err := f.st.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		_, err := reservations.Draft(ctx, tx, types, tenantID, id, "idn_owner", reservations.Request{PoolID: poolID,
			Devices: placement.Request{Class: placement.ClassGPU, Count: gpus}, Start: start, Duration: 3600, Binding: binding})
		return err
	}); err != nil {
		return reservations.Reservation{}, err
	}
	var r reservations.Reservation
	err = f.st.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		r, err = reservations.Place(ctx, tx, tenantID, id)
		return err
	})
	return r, err
}

// activate binds the placed reservation as its workflow does (Bind,
// BindStatus, MarkActive) and answers the node commands the bind queued.
func (f *fixture) activate(r reservations.Reservation) int {
	ctx := context.Background()
	f.tx(func(tx store.Tx) error {
		if err := store.SetReservationState(ctx, tx, r.TenantID, r.ID, rsvstates.Placed, rsvstates.Binding, nil); err != nil {
			return err
		}
		return store.QueueBindCommands(ctx, tx, r.ID, time.Now().Add(time.Minute))
	})
	f.tx(func(tx store.Tx) error {
		status, err := store.BindingStatus(ctx, tx, r.ID)
		if err == nil && status != store.BindingBound {
			err = fmt.Errorf("binding status = %s, want bound at once", status)
		}
		if err != nil {
			return err
		}
		return store.SetReservationState(ctx, tx, r.TenantID, r.ID, rsvstates.Binding, rsvstates.Active, nil)
	})
	return f.count(`SELECT count(*) FROM node_commands WHERE created_by = $1`, "reservation:"+r.ID)
}

// createOn drafts and places one instance of the flavor on the
// reservation, for tenantID.
func (f *fixture) createOn(tenantID, flavorID, reservationID string) (domain.Instance, error) {
	return f.createWith(tenantID, f.image, flavorID, reservationID)
}

// bookings counts the open GPU bookings of the reservation.
func (f *fixture) bookings(reservationID string) int {
	return f.count(`SELECT count(*) FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id
		WHERE a.reservation_id = $1 AND upper(b.during) > now()`, reservationID)
}

func TestInstanceOnReservation(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, `{}`, 2)
	r, err := f.reserve(tenant, f.poolID, reservations.BindingInstance, 2)
	if err != nil || r.State != string(rsvstates.Placed) || len(r.Allocations) != 1 || r.Devices.Topology.Type != placement.TopologySameNode {
		t.Fatalf("reserve = %+v, %v", r, err)
	}
	if n := f.activate(r); n != 0 {
		t.Fatalf("the bind queued %d node commands, want none", n)
	}
	flv := f.flavor(8, 16384, 2)
	in, err := f.createOn(tenant, flv, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	alloc := r.Allocations[0]
	if in.State != string(states.Creating) || in.NodeID != alloc.NodeID || in.ReservationID != r.ID || !slices.Equal(in.Devices, alloc.Atoms) {
		t.Fatalf("instance = %+v, want on %s with %v", in, alloc.NodeID, alloc.Atoms)
	}
	// Its GPUs are the reservation's, booked once; its scalars are booked.
	if got := f.count(`SELECT count(*) FROM device_bookings`); got != 2 {
		t.Fatalf("bookings = %d, want the reservation's 2", got)
	}
	if got := f.count(`SELECT vcpu FROM allocations WHERE instance_id = $1 AND released_at IS NULL`, in.ID); got != 8 {
		t.Fatalf("instance vcpu booked = %d", got)
	}
	_, spec, err := nodes.Spec(ctx, f.st.Pool, in.NodeID)
	if err != nil || len(spec.Instances) != 1 || !slices.Equal(spec.Instances[0].Devices, alloc.Atoms) {
		t.Fatalf("spec = %+v, %v", spec.Instances, err)
	}

	// Deleting the instance frees its scalars and leaves the reservation's booking.
	f.tx(func(tx store.Tx) error {
		_, _, err := domain.Change(ctx, tx, tenant, in.ID, states.MethodDelete)
		return err
	})
	f.tx(func(tx store.Tx) error { _, err := domain.Observe(ctx, tx, in.NodeID, true, nil); return err })
	var p domain.Progress
	f.tx(func(tx store.Tx) (err error) { p, err = domain.Converge(ctx, tx, in.ID); return err })
	if !p.Done {
		t.Fatalf("progress = %+v", p)
	}
	if got := f.bookings(r.ID); got != 2 {
		t.Fatalf("reservation bookings after the instance's delete = %d, want 2", got)
	}
	if got := f.count(`SELECT count(*) FROM allocations WHERE instance_id IS NOT NULL AND released_at IS NULL`); got != 0 {
		t.Fatalf("live instance allocations = %d", got)
	}
	if got := f.count(`SELECT count(*) FROM reservations WHERE id = $1 AND state = 'active'`, r.ID); got != 1 {
		t.Fatal("the reservation is no longer active")
	}

	// Another instance may then run on it.
	again, err := f.createOn(tenant, flv, r.ID)
	if err != nil || again.NodeID != alloc.NodeID {
		t.Fatalf("second instance = %+v, %v", again, err)
	}
}

func TestInstanceOnReservationInUse(t *testing.T) {
	f := newFixture(t, `{}`, 1)
	r, err := f.reserve(tenant, f.poolID, reservations.BindingInstance, 1)
	if err != nil {
		t.Fatal(err)
	}
	f.activate(r)
	flv := f.flavor(2, 1024, 1)
	placed := race(t, 6, func() error { _, err := f.createOn(tenant, flv, r.ID); return err },
		func(ce *core.Error) bool {
			return ce.Code == core.CodeConflict && ce.Details["field"] == "reservationId" && ce.Details["reason"] == "inUse"
		})
	if placed != 1 {
		t.Fatalf("placed %d on one reservation, want 1", placed)
	}
	if got := f.count(`SELECT count(*) FROM allocations WHERE instance_id IS NOT NULL`); got != 1 {
		t.Fatalf("instance allocations = %d, want 1", got)
	}
}

func TestInstanceOnReservationRefusals(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, `{}`, 1)
	r, err := f.reserve(tenant, f.poolID, reservations.BindingInstance, 2)
	if err != nil {
		t.Fatal(err)
	}
	f.activate(r)
	hold, err := f.reserve(tenant, f.poolID, reservations.BindingHold, 1)
	if err != nil {
		t.Fatal(err)
	}
	// Another tenant's binding instance reservation on the pool.
	theirs, err := f.reserve(tenant, f.poolID, reservations.BindingInstance, 2)
	if err != nil {
		t.Fatal(err)
	}
	f.exec(`UPDATE reservations SET tenant_id = 'ten_other' WHERE id = $1`, theirs.ID)
	inAnHour := time.Now().Add(time.Hour).UnixMilli()
	future, err := f.reserveAt(tenant, f.poolID, reservations.BindingInstance, 2, &inAnHour)
	if err != nil {
		t.Fatal(err)
	}
	two := f.flavor(4, 4096, 2)
	cases := []struct {
		name                  string
		tenant, flavor, rsvID string
		code                  core.Code
		field, reason         string
	}{
		{"another tenant's", tenant, two, theirs.ID, core.CodeNotFound, "", ""},
		{"absent", tenant, two, "rsv_missing", core.CodeNotFound, "", ""},
		{"fewer GPUs", tenant, f.flavor(4, 4096, 1), r.ID, core.CodeInvalidInput, "flavorId", "gpus"},
		{"more GPUs", tenant, f.flavor(4, 4096, 3), r.ID, core.CodeInvalidInput, "flavorId", "gpus"},
		{"no GPUs", tenant, f.flavor(4, 4096, 0), r.ID, core.CodeInvalidInput, "flavorId", "gpus"},
		{"binding hold", tenant, f.flavor(4, 4096, 1), hold.ID, core.CodeInvalidInput, "reservationId", "binding"},
		{"not begun", tenant, two, future.ID, core.CodeInvalidState, "reservationId", "notStarted"},
		{"too big for the node", tenant, f.flavor(1000, 4096, 2), r.ID, core.CodeInvalidState, "", "noCapacity"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.createOn(tc.tenant, tc.flavor, tc.rsvID)
			ce := core.AsError(err)
			if ce.Code != tc.code || (tc.field != "" && ce.Details["field"] != tc.field) || (tc.reason != "" && ce.Details["reason"] != tc.reason) {
				t.Fatalf("create = %v %+v, want %s %s %s", err, ce.Details, tc.code, tc.field, tc.reason)
			}
			if tc.code == core.CodeNotFound && len(ce.Details) != 0 {
				t.Fatalf("NOT_FOUND with details %+v: another tenant's must read as absent", ce.Details)
			}
		})
	}
	if got := f.count(`SELECT count(*) FROM allocations WHERE instance_id IS NOT NULL`); got != 0 {
		t.Fatalf("instance allocations = %d after refusals", got)
	}
	if got := f.count(`SELECT count(*) FROM instances WHERE state <> 'draft'`); got != 0 {
		t.Fatalf("instances = %d after refusals (only the noCapacity one, refused in the second transaction, is drafted)", got)
	}

	// An ended reservation is refused as such.
	f.tx(func(tx store.Tx) error { _, err := reservations.Release(ctx, tx, tenant, r.ID); return err })
	_, err = f.createOn(tenant, two, r.ID)
	if ce := core.AsError(err); ce.Code != core.CodeInvalidState || ce.Details["reason"] != "ended" {
		t.Fatalf("create on a released reservation = %v %+v", err, ce.Details)
	}
}

func TestReleaseReservationDeletesInstance(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, `{}`, 1)
	r, err := f.reserve(tenant, f.poolID, reservations.BindingInstance, 1)
	if err != nil {
		t.Fatal(err)
	}
	f.activate(r)
	in, err := f.createOn(tenant, f.flavor(2, 2048, 1), r.ID)
	if err != nil {
		t.Fatal(err)
	}
	f.tx(func(tx store.Tx) error {
		_, err := domain.Observe(ctx, tx, in.NodeID, true, []protocol.InstanceStatus{{ID: in.ID, Generation: in.Generation,
			State: protocol.InstanceRunning, VCPU: 2, MemoryMiB: 2048}})
		return err
	})
	f.tx(func(tx store.Tx) error { _, err := domain.Converge(ctx, tx, in.ID); return err })

	// The release deletes the instance in its transaction.
	var ids []string
	f.tx(func(tx store.Tx) (err error) {
		if _, err := reservations.Release(ctx, tx, tenant, r.ID); err != nil {
			return err
		}
		ids, err = domain.OnReservation(ctx, tx, tenant, r.ID)
		return err
	})
	if !slices.Equal(ids, []string{in.ID}) {
		t.Fatalf("instances to signal = %v", ids)
	}
	var got domain.Instance
	f.tx(func(tx store.Tx) (err error) { got, err = domain.Load(ctx, tx, tenant, in.ID, false); return err })
	if got.DesiredState != string(states.DesiredDeleted) || got.State != string(states.Deleting) || got.Generation != in.Generation+1 {
		t.Fatalf("instance after the release = %+v", got)
	}
	if _, spec, _ := nodes.Spec(ctx, f.st.Pool, in.NodeID); len(spec.Instances) != 0 {
		t.Fatalf("spec after the release = %+v", spec.Instances)
	}
	// The node lets it go; the workflow's step ends it.
	f.tx(func(tx store.Tx) error { _, err := domain.Observe(ctx, tx, in.NodeID, true, nil); return err })
	var p domain.Progress
	f.tx(func(tx store.Tx) (err error) { p, err = domain.Converge(ctx, tx, in.ID); return err })
	if !p.Done {
		t.Fatalf("progress = %+v", p)
	}
	if got := f.count(`SELECT count(*) FROM allocations WHERE instance_id = $1 AND released_at IS NOT NULL`, in.ID); got != 1 {
		t.Fatalf("released instance allocations = %d", got)
	}
}

func TestInstanceBindingNeedsVPSHostAndOneNode(t *testing.T) {
	f := newFixture(t, `{}`, 0)
	metal := core.NewID("pool")
	f.exec(`INSERT INTO pools (id, tenant_id, site_id, name, class, gpu_model, gpu_memory_gb, agent, policy, created_by)
		SELECT $1, tenant_id, site_id, $1, 'metal-host', gpu_model, gpu_memory_gb, agent, policy, created_by FROM pools WHERE id = $2`,
		metal, f.poolID)
	_, err := f.reserve(tenant, metal, reservations.BindingInstance, 1)
	if ce := core.AsError(err); ce.Code != core.CodeInvalidInput || ce.Details["field"] != "binding" || ce.Details["reason"] != "poolClass" {
		t.Fatalf("binding instance on a metal-host pool = %v %+v", err, ce.Details)
	}
	catalog, _ := core.DefaultCatalog()
	types := reservations.Types{Reservation: catalog.FullName("reservation"), Pool: catalog.FullName("pool")}
	for _, topo := range []placement.Topology{{Type: placement.TopologyGang, Nodes: 2, PerNode: 1}, {Type: placement.TopologySameNVLinkDomain}} {
		err := f.st.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) error {
			_, err := reservations.Draft(context.Background(), tx, types, tenant, core.NewID("rsv"), "idn_owner", reservations.Request{
				PoolID: f.poolID, Devices: placement.Request{Class: placement.ClassGPU, Count: 2, Topology: topo},
				Duration: 3600, Binding: reservations.BindingInstance})
			return err
		})
		if ce := core.AsError(err); ce.Code != core.CodeInvalidInput || ce.Details["field"] != "devices.topology" || ce.Details["reason"] != "singleNode" {
			t.Fatalf("topology %+v = %v %+v", topo, err, ce.Details)
		}
	}
	if got := f.count(`SELECT count(*) FROM reservations`); got != 0 {
		t.Fatalf("reservations = %d after refusals", got)
	}
}

// Every ending of the reservation deletes the instance on it in the
// ending's transaction.
func TestReservationEndingsDeleteInstance(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name     string
		activate bool
		end      func(f *fixture, tx store.Tx, r reservations.Reservation) error
		state    rsvstates.State
	}{
		{"release", true, func(f *fixture, tx store.Tx, r reservations.Reservation) error {
			_, err := reservations.Release(ctx, tx, tenant, r.ID)
			return err
		}, rsvstates.Released},
		{"cancel while binding", false, func(f *fixture, tx store.Tx, r reservations.Reservation) error {
			_, err := reservations.Cancel(ctx, tx, tenant, r.ID)
			return err
		}, rsvstates.Cancelled},
		{"node lost", true, func(f *fixture, tx store.Tx, r reservations.Reservation) error {
			if _, err := tx.Exec(ctx, `UPDATE nodes SET connectivity = 'lost' WHERE id = $1`, r.Allocations[0].NodeID); err != nil {
				return err
			}
			what, err := reservations.ReconcileNodeHealth(ctx, tx, tenant, r.ID)
			if err == nil && what != reservations.NodeHealthLost {
				err = fmt.Errorf("node health = %q", what)
			}
			return err
		}, rsvstates.Failed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, `{}`, 1)
			r, err := f.reserve(tenant, f.poolID, reservations.BindingInstance, 1)
			if err != nil {
				t.Fatal(err)
			}
			if tc.activate {
				f.activate(r)
			} else {
				f.tx(func(tx store.Tx) error {
					return store.SetReservationState(ctx, tx, tenant, r.ID, rsvstates.Placed, rsvstates.Binding, nil)
				})
			}
			in, err := f.createOn(tenant, f.flavor(2, 2048, 1), r.ID)
			if err != nil {
				t.Fatal(err)
			}
			f.tx(func(tx store.Tx) error { return tc.end(f, tx, r) })
			if got := f.count(`SELECT count(*) FROM reservations WHERE id = $1 AND state = $2`, r.ID, string(tc.state)); got != 1 {
				t.Fatalf("reservation not %s", tc.state)
			}
			if got := f.count(`SELECT count(*) FROM instances WHERE id = $1 AND desired_state = 'deleted' AND state = 'deleting'`, in.ID); got != 1 {
				t.Fatal("the instance is not being deleted")
			}
			if got := f.bookings(r.ID); got != 0 {
				t.Fatalf("open reservation bookings = %d", got)
			}
		})
	}
}
