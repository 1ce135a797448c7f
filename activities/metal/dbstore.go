package metal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	coremetal "github.com/better-compute/better-compute/core/metal"
	"github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/metal"
	nodestore "github.com/better-compute/better-compute/store/nodes"
)

// DBStore is Store over PostgreSQL (store/metal): each method is one
// transaction, its writes fenced by op_seq.
type DBStore struct {
	db    *store.Store
	types nodestore.Types
}

// NewDBStore is the activities' Store over db; catalog names the
// authorization rows' types.
func NewDBStore(db *store.Store, catalog *core.Catalog) *DBStore {
	return &DBStore{db: db, types: nodestore.TypesOf(catalog)}
}

var _ Store = (*DBStore)(nil)

// mapErr maps store/metal's errors onto the Store's sentinels.
func mapErr(err error) error {
	var e *core.Error
	switch {
	case err == nil:
		return nil
	case domain.IsSuperseded(err):
		return fmt.Errorf("%w: %v", ErrStale, err)
	case errors.As(err, &e) && e.Code == core.CodeNotFound:
		return fmt.Errorf("%w: %v", ErrNotFound, err)
	}
	return err
}

func (s *DBStore) tx(ctx context.Context, fn func(tx store.Tx) error) error {
	return mapErr(s.db.InTx(ctx, store.ReadWrite, fn))
}

// owned checks that the node is the tenant's (NOT_FOUND otherwise).
func owned(ctx context.Context, tx store.Tx, tenantID, nodeID string) error {
	_, err := nodestore.Get(ctx, tx, tenantID, nodeID, false)
	return err
}

// Load implements Store.
func (s *DBStore) Load(ctx context.Context, tenantID, nodeID string) (Lifecycle, error) {
	var l Lifecycle
	err := s.tx(ctx, func(tx store.Tx) error {
		o, m, err := domain.LoadNode(ctx, tx, tenantID, nodeID)
		if err != nil {
			return err
		}
		open, err := domain.OpenBoot(ctx, tx, nodeID)
		if err != nil {
			return err
		}
		l = Lifecycle{TenantID: o.TenantID, NodeID: nodeID, SiteID: o.SiteID, PoolID: o.PoolID, State: o.State,
			Power: o.Power, Operation: o.Operation, OpSeq: o.OpSeq, Step: o.Step, Origin: o.Origin, OpArgs: o.Args,
			Deadline: o.Deadline, AbortRequested: o.AbortRequested, WorkflowStarted: m.Lifecycle.WorkflowStarted,
			Managed: o.Managed, Inspected: o.Inspected, RedfishAddress: o.Machine.RedfishAddress,
			IPMIAddress: o.Machine.IPMIAddress, Bindings: o.Machine.Bindings, BootMAC: o.Machine.BootMAC,
			OpenBoot: open, HardwareKey: o.HardwareKey}
		if e := m.Lifecycle.LastError; e != nil {
			l.LastError = &LastError{Operation: coremetal.Operation(e.Operation), Step: e.Step, Origin: nodes.ProvisionState(e.Origin),
				Code: e.Code, Reason: e.Reason, Message: e.Message, At: time.UnixMilli(e.At)}
		}
		return nil
	})
	return l, err
}

// MarkStarted implements Store.
func (s *DBStore) MarkStarted(ctx context.Context, tenantID, nodeID string, opSeq int64) error {
	return s.tx(ctx, func(tx store.Tx) error {
		if err := owned(ctx, tx, tenantID, nodeID); err != nil {
			return err
		}
		return domain.MarkStarted(ctx, tx, nodeID, opSeq)
	})
}

// SetStep implements Store.
func (s *DBStore) SetStep(ctx context.Context, tenantID, nodeID string, opSeq int64, step string) error {
	return s.tx(ctx, func(tx store.Tx) error {
		if err := owned(ctx, tx, tenantID, nodeID); err != nil {
			return err
		}
		return domain.SetStep(ctx, tx, nodeID, opSeq, step)
	})
}

// Finish implements Store.
func (s *DBStore) Finish(ctx context.Context, f Finish) error {
	return s.tx(ctx, func(tx store.Tx) error {
		if err := owned(ctx, tx, f.TenantID, f.NodeID); err != nil {
			return err
		}
		return domain.FinishOperation(ctx, tx, s.types, domain.Finish{NodeID: f.NodeID, OpSeq: f.OpSeq,
			Managed: f.Managed, Inspected: f.Inspected, Power: f.Power, State: f.State, WorkflowState: f.WorkflowState})
	})
}

// Fail implements Store.
func (s *DBStore) Fail(ctx context.Context, f Failure) error {
	return s.tx(ctx, func(tx store.Tx) error {
		if err := owned(ctx, tx, f.TenantID, f.NodeID); err != nil {
			return err
		}
		return domain.FailOperation(ctx, tx, s.types, domain.Failure{NodeID: f.NodeID, OpSeq: f.OpSeq,
			Reason: f.Reason, Code: f.Code, Step: f.Step, Message: f.Message, WorkflowState: f.WorkflowState})
	})
}

// SetPower implements Store.
func (s *DBStore) SetPower(ctx context.Context, tenantID, nodeID string, power nodes.Power) error {
	return s.tx(ctx, func(tx store.Tx) error {
		if err := owned(ctx, tx, tenantID, nodeID); err != nil {
			return err
		}
		return nodestore.SetPower(ctx, tx, nodeID, power)
	})
}

func inFlightOf(ps []domain.Pending) []InFlight {
	out := make([]InFlight, len(ps))
	for i, p := range ps {
		out[i] = InFlight{MetalParams: MetalParams{TenantID: p.TenantID, NodeID: p.NodeID, OpSeq: p.OpSeq},
			Operation: p.Operation, Deadline: p.Deadline, OpArgs: p.Args}
	}
	return out
}

// Owed implements Store.
func (s *DBStore) Owed(ctx context.Context, grace time.Duration, limit int) ([]InFlight, error) {
	var out []InFlight
	err := s.tx(ctx, func(tx store.Tx) error {
		ps, err := domain.OwedStarts(ctx, tx, grace, limit)
		out = inFlightOf(ps)
		return err
	})
	return out, err
}

// InFlight implements Store.
func (s *DBStore) InFlight(ctx context.Context, afterNodeID string, grace time.Duration, limit int) ([]InFlight, error) {
	var out []InFlight
	err := s.tx(ctx, func(tx store.Tx) error {
		ps, err := domain.InFlightStarted(ctx, tx, afterNodeID, grace, limit)
		out = inFlightOf(ps)
		return err
	})
	return out, err
}

// NewBoot implements Store.
func (s *DBStore) NewBoot(ctx context.Context, tenantID, nodeID string, opSeq int64, purpose string) (string, error) {
	var id string
	err := s.tx(ctx, func(tx store.Tx) error {
		if err := owned(ctx, tx, tenantID, nodeID); err != nil {
			return err
		}
		b, err := domain.CreateBoot(ctx, tx, nodeID, opSeq, purpose)
		id = b.ID
		return err
	})
	return id, err
}

// bootOf reads the tenant's boot.
func bootOf(ctx context.Context, tx store.Tx, tenantID, bootID string) (domain.Boot, error) {
	b, err := domain.GetBoot(ctx, tx, bootID)
	if err == nil && b.TenantID != tenantID {
		return domain.Boot{}, core.Errorf(core.CodeNotFound, "boot %s not found", bootID)
	}
	return b, err
}

// SetBootSteps implements Store.
func (s *DBStore) SetBootSteps(ctx context.Context, tenantID, bootID string, steps []protocol.RamdiskStep) error {
	return s.tx(ctx, func(tx store.Tx) error {
		b, err := bootOf(ctx, tx, tenantID, bootID)
		if err != nil {
			return err
		}
		return domain.SetBootSteps(ctx, tx, bootID, b.OpSeq, steps)
	})
}

// BootStatus implements Store.
func (s *DBStore) BootStatus(ctx context.Context, tenantID, bootID string) (BootStatus, error) {
	var out BootStatus
	err := s.tx(ctx, func(tx store.Tx) error {
		b, err := bootOf(ctx, tx, tenantID, bootID)
		out = BootStatus{Reported: b.ReportedAt != nil, HardwareKey: b.HardwareKey, Results: b.Results,
			Finished: b.FinishedAt != nil, Joined: b.JoinedAt != nil, JoinError: b.JoinError}
		return err
	})
	return out, err
}

// CloseBoot implements Store.
func (s *DBStore) CloseBoot(ctx context.Context, tenantID, bootID string) error {
	return s.tx(ctx, func(tx store.Tx) error {
		if _, err := bootOf(ctx, tx, tenantID, bootID); err != nil {
			return err
		}
		return domain.FinishBoot(ctx, tx, bootID)
	})
}

// IngestInspection implements Store. A conflict commits nothing: the
// transaction is rolled back and the other node answered.
func (s *DBStore) IngestInspection(ctx context.Context, tenantID, nodeID string, opSeq int64, bootID string) (Ingest, error) {
	var out Ingest
	err := s.tx(ctx, func(tx store.Tx) error {
		b, err := bootOf(ctx, tx, tenantID, bootID)
		if err != nil {
			return err
		}
		if b.NodeID != nodeID {
			return core.Errorf(core.CodeNotFound, "boot %s not found", bootID)
		}
		res, err := domain.IngestInspection(ctx, tx, s.types, bootID, opSeq)
		out.HardwareKey = res.HardwareKey.Key
		return err
	})
	if other := domain.ConflictingNode(err); other != "" {
		return Ingest{ConflictNodeID: other}, nil
	}
	return out, err
}

// CheckRejoin implements Store.
func (s *DBStore) CheckRejoin(ctx context.Context, tenantID, nodeID, bootID string) (Rejoin, error) {
	var out Rejoin
	err := s.tx(ctx, func(tx store.Tx) error {
		b, err := bootOf(ctx, tx, tenantID, bootID)
		if err != nil {
			return err
		}
		if b.NodeID != nodeID {
			return core.Errorf(core.CodeNotFound, "boot %s not found", bootID)
		}
		out.Match, out.Want, out.Got, err = domain.RejoinMatches(ctx, tx, bootID)
		return err
	})
	return out, err
}

// RevokeIdentities implements Store.
func (s *DBStore) RevokeIdentities(ctx context.Context, tenantID, nodeID string, opSeq int64) error {
	return s.tx(ctx, func(tx store.Tx) error {
		if err := owned(ctx, tx, tenantID, nodeID); err != nil {
			return err
		}
		if _, err := domain.LoadOperation(ctx, tx, nodeID, opSeq); err != nil {
			return err
		}
		_, err := nodestore.RevokeIdentities(ctx, tx, nodeID, "retired", "metal.retire")
		return err
	})
}
