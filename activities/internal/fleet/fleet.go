// Package fleet seeds the small fleet the activities' tests run against and
// reads back what the activities wrote.
package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/better-compute/better-compute/store"
)

// Seed inserts a site, a pool, a node with two GPUs and a reservation res_1
// in state with one allocation over both: gpu-0's booking has begun
// ([now-1h, now+1h)), gpu-1's has not ([now+1h, now+2h)).
func Seed(t *testing.T, s *store.Store, state string) {
	t.Helper()
	ctx := context.Background()
	for _, q := range []string{
		`INSERT INTO sites (id, tenant_id, name, region, iam_region, kind, created_by)
			VALUES ('site_1', 'ten_root', 's', 'eu', 'eu', 'shared', 'u')`,
		`INSERT INTO pools (id, tenant_id, site_id, name, class, gpu_model, gpu_memory_gb, agent, created_by)
			VALUES ('pool_1', 'ten_root', 'site_1', 'p', 'metal-host', 'h100', 80, 'bcd', 'u')`,
		`INSERT INTO nodes (id, tenant_id, pool_id, name) VALUES ('node_1', 'ten_root', 'pool_1', 'n')`,
		`INSERT INTO devices (node_id, device_id, tenant_id, pool_id, class, bookable, attributes)
			VALUES ('node_1', 'gpu-0', 'ten_root', 'pool_1', 'gpu', true, '{"index": 0}'),
				('node_1', 'gpu-1', 'ten_root', 'pool_1', 'gpu', true, '{"index": 1}')`,
		`INSERT INTO reservations (id, tenant_id, owner_identity_id, pool_id, state, devices, starts_at, ends_at)
			VALUES ('res_1', 'ten_a', 'usr_1', 'pool_1', '` + state + `', '{"class": "gpu", "count": 2}', now() - interval '1 hour', now() + interval '1 hour')`,
		`INSERT INTO allocations (id, tenant_id, reservation_id, node_id, atoms)
			VALUES ('alloc_1', 'ten_a', 'res_1', 'node_1', '{gpu-0,gpu-1}')`,
		`INSERT INTO device_bookings (device_node_id, device_id, allocation_id, tenant_id, pool_id, during, kind) VALUES
			('node_1', 'gpu-0', 'alloc_1', 'ten_a', 'pool_1', tstzrange(now() - interval '1 hour', now() + interval '1 hour'), 'hold'),
			('node_1', 'gpu-1', 'alloc_1', 'ten_a', 'pool_1', tstzrange(now() + interval '1 hour', now() + interval '2 hours'), 'hold')`,
	} {
		if _, err := s.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// State is res_1's state.
func State(t *testing.T, s *store.Store) string {
	t.Helper()
	var st string
	if err := s.Pool.QueryRow(context.Background(), `SELECT state FROM reservations WHERE id = 'res_1'`).Scan(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// A Booking is one of alloc_1's device bookings.
type Booking struct {
	Device       string
	Lower, Upper time.Time
}

// Bookings are alloc_1's device bookings, by device.
func Bookings(t *testing.T, s *store.Store) []Booking {
	t.Helper()
	rows, err := s.Pool.Query(context.Background(), `SELECT device_id, lower(during), upper(during)
		FROM device_bookings WHERE allocation_id = 'alloc_1' ORDER BY device_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []Booking
	for rows.Next() {
		var b Booking
		if err := rows.Scan(&b.Device, &b.Lower, &b.Upper); err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
