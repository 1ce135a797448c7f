package reservations

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/store"
)

// Booking locks. A transaction booking an atom first takes the atom's
// advisory lock (pg_try_advisory_xact_lock, in the same INSERT as the
// booking) and holds it to its commit. The lock is what makes a booking
// that has not committed yet visible to the others: READ COMMITTED shows a
// concurrent booker the free atoms of the last commit only, and without
// the lock it would insert onto an atom another transaction is booking,
// wait in the exclusion constraint for that one's commit, get 23P01 and
// place again, one request after the other. With it, an atom whose lock
// is taken is "being booked": the booker leaves it aside and places on the
// others at once, and waits (for those atoms' locks, so for their
// bookers' commits or rollbacks) only when nothing else fits; then it
// reads the free atoms again, which now show those commits.
//
// A per-pool placement lock released before the commit would not do: the
// bookings made under it stay invisible until the commit, so the next
// holder would read them as free. Held to the commit, it would serialize
// every booking of the pool. The atoms' own locks cost nothing when
// requests choose different atoms, which PlaceSpread makes the rule.
//
// The lock ignores the booking's window (two requests for disjoint windows
// of one atom just see each other as busy for a moment): a window-aware
// key could not tell overlapping windows apart. Plans of more than
// maxLockedAtoms atoms book without locks, as the exclusion constraint
// alone allows, to keep PostgreSQL's shared lock table for everyone.
const maxLockedAtoms = 64

// atomKey names an atom: its node and its device id.
type atomKey struct{ node, atom string }

// lockKey is the atom's advisory lock key.
func (k atomKey) lockKey() int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("booking\x00" + k.node + "\x00" + k.atom))
	return int64(h.Sum64())
}

// without is nodes without the atoms in busy.
func without(nodes []placement.Node, busy map[atomKey]bool) []placement.Node {
	if len(busy) == 0 {
		return nodes
	}
	out := make([]placement.Node, len(nodes))
	for i, n := range nodes {
		out[i] = n
		out[i].Atoms = nil
		for _, a := range n.Atoms {
			if !busy[atomKey{n.ID, a.ID}] {
				out[i].Atoms = append(out[i].Atoms, a)
			}
		}
	}
	return out
}

// contendedHalf keeps about half of nodes, a different half for each seed
// and round, so that requests colliding on one pool spread out instead of
// marching together from one best-fit node to the next.
func contendedHalf(nodes []placement.Node, seed uint64, round int) []placement.Node {
	out := make([]placement.Node, 0, len(nodes)/2+1)
	for _, n := range nodes {
		if placement.Seed(fmt.Sprintf("%x/%d/%s", seed, round, n.ID))&1 == 0 {
			out = append(out, n)
		}
	}
	return out
}

// beingBooked is those of the candidates' atoms whose booking lock another
// transaction holds right now: one read of pg_locks instead of a try for
// each atom, once a try found the pool contended. A bigint advisory key
// shows there as classid (high half), objid (low half) and objsubid 1.
func beingBooked(ctx context.Context, tx store.Tx, candidates ...[]placement.Node) (map[atomKey]bool, error) {
	rows, err := tx.Query(ctx, `SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks
		WHERE locktype = 'advisory' AND objsubid = 1 AND granted AND mode = 'ExclusiveLock'
			AND pid <> pg_backend_pid() AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`)
	if err != nil {
		return nil, err
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, err
	}
	held := make(map[int64]bool, len(keys))
	for _, k := range keys {
		held[k] = true
	}
	busy := map[atomKey]bool{}
	for _, nodes := range candidates {
		for _, n := range nodes {
			for _, a := range n.Atoms {
				if k := (atomKey{n.ID, a.ID}); held[k.lockKey()] {
					busy[k] = true
				}
			}
		}
	}
	return busy, nil
}

// awaitBookings waits until the transactions booking the atoms have all
// committed or rolled back. It takes the atoms' locks shared (waiters do
// not queue behind each other), in one statement inside a savepoint, and
// rolls that back, so it holds nothing afterwards. The caller holds no
// booking lock of this request while it waits, so it closes no cycle with
// a booker; a deadlock the database breaks all the same (40P01, with
// locks a caller's earlier bookings hold) is errLostRace.
func awaitBookings(ctx context.Context, tx store.Tx, atoms []atomKey) error {
	keys := make([]int64, len(atoms))
	for i, k := range atoms {
		keys[i] = k.lockKey()
	}
	slices.Sort(keys)
	sp, err := tx.Begin(ctx)
	if err != nil {
		return err
	}
	_, err = sp.Exec(ctx, `SELECT count(pg_advisory_xact_lock_shared(k)) FROM unnest($1::bigint[]) AS k`, keys)
	if rerr := sp.Rollback(ctx); rerr != nil {
		return rerr
	}
	if pgState(err) == "40P01" {
		return errLostRace
	}
	return err
}

// errLostRace is a concurrent booking winning an atom (23P01, or a
// deadlock 40P01): read the free atoms and place again.
var errLostRace = errors.New("a concurrent booking won the atoms")
