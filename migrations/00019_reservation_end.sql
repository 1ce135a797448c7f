-- +goose Up
-- Why and when a reservation ended. end_reason is set once, by the step
-- that begins the ending (the window's end, a lapsed lease, a release, a
-- cancellation, a preemption, a lost node or a failure); ended_at when the
-- reservation reaches a terminal state. A lease lapse and a release both
-- end released, and only end_reason tells them apart.
ALTER TABLE reservations
    ADD COLUMN end_reason text CHECK (end_reason IN ('end', 'lease', 'release', 'cancel', 'preempted', 'nodeLost', 'failed')),
    ADD COLUMN ended_at   timestamptz;

-- +goose Down
ALTER TABLE reservations DROP COLUMN ended_at, DROP COLUMN end_reason;
