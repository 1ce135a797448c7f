package reservations

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/better-compute/better-compute/store"
)

// Starter starts reservation workflows off the API's request path. The
// reservation row is the outbox: a live reservation whose
// workflow_started_at is null owes its workflow a start, so nothing an
// admission acknowledged is lost when this process dies before the start.
//
// The create path hands the committed reservation's id to Owe, which never
// blocks. Run starts the owed workflows, a bounded number at once, records
// the starts in batches (one UPDATE per batch), and every ScanPeriod (and
// when it begins) scans the table for starts owed longer than ScanGrace:
// those another process handed over and never started (it crashed), and
// those Owe dropped because its queue was full. Several API replicas scan
// the same table and may start one workflow twice; that is harmless, as
// StartReservation keeps a running workflow. The reconciler
// (ReconcileReservationsWorkflow) stays the safety net.
type Starter struct {
	store     *store.Store
	temporal  client.Client
	taskQueue string
	logger    *slog.Logger
	opts      StarterOptions

	owed chan string // ids handed over by Owe, not yet read

	mu      sync.Mutex
	pending map[string]struct{} // ids owed, starting or awaiting their mark here
}

// StarterOptions tune a Starter; zero fields take the defaults.
type StarterOptions struct {
	// InFlight bounds the workflow starts in flight at once (default 16).
	InFlight int
	// Queue is how many handed-over ids wait before Owe drops one (default
	// 4096); the scan finds what it drops.
	Queue int
	// ScanPeriod is how often the table is scanned for owed starts
	// (default 1 s).
	ScanPeriod time.Duration
	// ScanGrace is how long a start must have been owed before a scan takes
	// it (default 2 s), so a scan does not race the handoff of the replica
	// that admitted the reservation. Tests set it to a nanosecond.
	ScanGrace time.Duration
	// MarkBatch bounds the starts recorded by one UPDATE (default 256).
	MarkBatch int
}

// startTimeout bounds one workflow start; one that times out is left owed.
const startTimeout = 30 * time.Second

// markLinger is how long the recorder waits for more starts to record in
// the same statement once it has one.
const markLinger = 5 * time.Millisecond

// NewStarter makes the starter of one process; Run runs it.
func NewStarter(st *store.Store, c client.Client, taskQueue string, logger *slog.Logger, opts StarterOptions) *Starter {
	if opts.InFlight <= 0 {
		opts.InFlight = 16
	}
	if opts.Queue <= 0 {
		opts.Queue = 4096
	}
	if opts.ScanPeriod <= 0 {
		opts.ScanPeriod = time.Second
	}
	if opts.ScanGrace <= 0 {
		opts.ScanGrace = 2 * time.Second
	}
	if opts.MarkBatch <= 0 {
		opts.MarkBatch = 256
	}
	if logger == nil {
		logger = slog.Default()
	}
	return &Starter{store: st, temporal: c, taskQueue: taskQueue, logger: logger, opts: opts,
		owed: make(chan string, opts.Queue), pending: map[string]struct{}{}}
}

// Owe hands over the reservation whose admission just committed, so its
// workflow is started. It never blocks: with the queue full the id is
// dropped, and the scan starts it. The tenant is implied by the id.
func (s *Starter) Owe(_ string, id string) {
	if !s.claim(id) {
		return // already on its way here
	}
	select {
	case s.owed <- id:
	default:
		s.release(id)
	}
}

// claim marks id pending here; false when it already was.
func (s *Starter) claim(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.pending[id]; ok {
		return false
	}
	s.pending[id] = struct{}{}
	return true
}

func (s *Starter) release(ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		delete(s.pending, id)
	}
}

// Run starts owed workflows until ctx ends. Starts in flight then fail and
// stay owed, for the next scan of any replica.
func (s *Starter) Run(ctx context.Context) error {
	work := make(chan ReservationParams, s.opts.InFlight)
	marks := make(chan string, s.opts.Queue)
	var starters, recorder sync.WaitGroup
	for range s.opts.InFlight {
		starters.Go(func() { s.startLoop(ctx, work, marks) })
	}
	recorder.Go(func() { s.markLoop(ctx, marks) })
	s.feed(ctx, work)
	close(work)
	starters.Wait()
	close(marks)
	recorder.Wait()
	return nil
}

// feed reads handed-over ids in batches and scans the table, and sends what
// is owed to the starters.
func (s *Starter) feed(ctx context.Context, work chan<- ReservationParams) {
	tick := time.NewTicker(s.opts.ScanPeriod)
	defer tick.Stop()
	s.scan(ctx, work)
	batch := make([]string, 0, s.opts.MarkBatch)
	for {
		select {
		case <-ctx.Done():
			return
		case id := <-s.owed:
			batch = append(batch[:0], id)
		more:
			for len(batch) < cap(batch) {
				select {
				case id := <-s.owed:
					batch = append(batch, id)
				default:
					break more
				}
			}
			s.load(ctx, batch, work)
		case <-tick.C:
			s.scan(ctx, work)
		}
	}
}

// load reads what the handed-over ids' workflows need, in one read, and
// sends those still owed to the starters; an id replayed after its start
// was recorded owes nothing.
func (s *Starter) load(ctx context.Context, ids []string, work chan<- ReservationParams) {
	var owed []store.UnstartedReservation
	err := s.store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		owed, err = store.OwedReservationStarts(ctx, tx, ids)
		return err
	})
	if err != nil {
		if ctx.Err() == nil {
			s.logger.WarnContext(ctx, "reading reservations whose workflows are owed; the scan retries", "reservations", len(ids), "error", err)
		}
		s.release(ids...)
		return
	}
	found := make(map[string]bool, len(owed))
	for _, u := range owed {
		found[u.ID] = true
	}
	for _, id := range ids {
		if !found[id] {
			s.release(id)
		}
	}
	for i, u := range owed {
		select {
		case work <- paramsOf(u):
		case <-ctx.Done():
			for _, left := range owed[i:] {
				s.release(left.ID)
			}
			return
		}
	}
}

// scan finds starts owed longer than the grace that are not pending here,
// and sends them to the starters.
func (s *Starter) scan(ctx context.Context, work chan<- ReservationParams) {
	var owed []store.UnstartedReservation
	err := s.store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		owed, err = store.UnstartedReservations(ctx, tx, s.opts.ScanGrace, s.opts.MarkBatch)
		return err
	})
	if err != nil {
		if ctx.Err() == nil {
			s.logger.WarnContext(ctx, "scanning for owed reservation workflow starts", "error", err)
		}
		return
	}
	for _, u := range owed {
		if !s.claim(u.ID) {
			continue
		}
		select {
		case work <- paramsOf(u):
		case <-ctx.Done():
			s.release(u.ID)
			return
		}
	}
}

// startLoop is one starter: it starts each workflow it is sent and passes
// the started ids to the recorder. A failed start stays owed.
func (s *Starter) startLoop(ctx context.Context, work <-chan ReservationParams, marks chan<- string) {
	for p := range work {
		sctx, cancel := context.WithTimeout(ctx, startTimeout)
		err := StartReservation(sctx, s.temporal, s.taskQueue, p)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				s.logger.WarnContext(ctx, "starting a reservation's workflow; the scan retries", "reservation", p.ReservationID, "error", err)
			}
			s.release(p.ReservationID)
			continue
		}
		marks <- p.ReservationID
	}
}

// markLoop records started workflows, as many as are ready (up to
// MarkBatch) in one statement. It records what was started even as ctx
// ends, so no replica starts them again needlessly.
func (s *Starter) markLoop(ctx context.Context, marks <-chan string) {
	batch := make([]string, 0, s.opts.MarkBatch)
	linger := time.NewTimer(markLinger)
	defer linger.Stop()
	for id := range marks {
		batch = append(batch[:0], id)
		linger.Reset(markLinger)
	more:
		for len(batch) < cap(batch) {
			select {
			case id, ok := <-marks:
				if !ok {
					break more
				}
				batch = append(batch, id)
			case <-linger.C:
				break more
			}
		}
		s.mark(ctx, batch)
		s.release(batch...)
	}
}

// mark records the batch's starts. A reservation that ended after the read
// its start was made from (cancelled while the start was in flight, its
// cancel signal finding no workflow yet) gets the changed signal, so its
// new run reads the row and ends instead of waiting for its start time.
func (s *Starter) mark(ctx context.Context, batch []string) {
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var ended []string
	err := s.store.InTx(mctx, store.ReadWrite, func(tx store.Tx) (err error) {
		ended, err = store.MarkReservationWorkflowsStarted(mctx, tx, batch)
		return err
	})
	if err != nil {
		s.logger.WarnContext(ctx, "recording started reservation workflows; they will be started again, harmlessly", "reservations", len(batch), "error", err)
		return
	}
	for _, id := range ended {
		err := s.temporal.SignalWorkflow(mctx, id, "", SignalChanged, nil)
		var gone *serviceerror.NotFound
		if err != nil && !errors.As(err, &gone) {
			s.logger.WarnContext(ctx, "signalling an ended reservation's new workflow", "reservation", id, "error", err)
		}
	}
}
