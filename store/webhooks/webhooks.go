// Package webhooks is the webhooks domain's store (docs/webhooks.md): the
// subscriptions, their deliveries and attempts, and the two steps of the
// delivery loop the workflow runs: FanOut (the events after a webhook's
// cursor into its deliveries) and Next/Record (its oldest pending delivery
// out, the attempt's result in).
package webhooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	rules "github.com/better-compute/better-compute/core/webhooks"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/secrets"
)

// Prefixes of the ids.
const (
	IDPrefix         = "whk"
	DeliveryIDPrefix = "msg"
)

// sealPurpose binds a sealed signing secret to this use.
const sealPurpose = "webhook-signing-secret"

// Backlog bounds a webhook's pending deliveries: past it the fan-out waits
// (the events stay in the outbox, after the webhook's cursor).
const Backlog = 1000

// Webhook is a subscription as the API answers it; never its secret.
type Webhook struct {
	ID          string   `json:"id"`
	TenantID    string   `json:"tenantId"`
	URL         string   `json:"url"`
	Description string   `json:"description,omitempty"`
	EventTypes  []string `json:"eventTypes"`
	State       string   `json:"state"`
	// SecretVersion counts rotations; PreviousSecretValidUntil is when the
	// rotated-out secret stops signing (while a rotation overlaps).
	SecretVersion            int    `json:"secretVersion"`
	PreviousSecretValidUntil *int64 `json:"previousSecretValidUntil,omitempty"`
	LastError                string `json:"lastError,omitempty"`
	FailingSince             *int64 `json:"failingSince,omitempty"`
	// Pending counts deliveries not yet delivered nor failed.
	Pending   int    `json:"pending"`
	CreatedBy string `json:"createdBy"`
	CreatedAt int64  `json:"createdAt"`
	UpdatedAt int64  `json:"updatedAt"`
}

// Key is the webhook's place in its tenant's list.
func (w Webhook) Key() store.Key { return store.Key{At: w.CreatedAt, ID: w.ID} }

// Delivery is one message to one webhook with its last attempts.
type Delivery struct {
	ID            string          `json:"id"`
	WebhookID     string          `json:"webhookId"`
	EventID       string          `json:"eventId,omitempty"`
	EventType     string          `json:"eventType"`
	State         string          `json:"state"`
	Attempts      int             `json:"attempts"`
	NextAttemptAt *int64          `json:"nextAttemptAt,omitempty"`
	CreatedAt     int64           `json:"createdAt"`
	DeliveredAt   *int64          `json:"deliveredAt,omitempty"`
	Payload       json.RawMessage `json:"payload"`
	LastAttempts  []Attempt       `json:"lastAttempts"`
	// ordinal is its place in its webhook's send order.
	ordinal int64
}

// Key is the delivery's place in its webhook's list: send order, newest
// first.
func (d Delivery) Key() store.Key { return store.Key{Seq: d.ordinal} }

// Attempt is one try at a delivery.
type Attempt struct {
	N          int    `json:"n"`
	At         int64  `json:"at"`
	StatusCode int    `json:"statusCode"`
	LatencyMs  int    `json:"latencyMs"`
	Response   string `json:"response,omitempty"`
	Error      string `json:"error,omitempty"`
}

// lastAttempts is how many attempts a delivery answers with.
const lastAttempts = 5

var columns = `w.id, w.tenant_id, w.url, w.description, w.event_types, w.state, w.secret_version,
	CASE WHEN w.previous_until > now() THEN ` + store.MsOf("w.previous_until") + ` END, w.last_error, ` + store.MsOf("w.failing_since") + `,
	(SELECT count(*) FROM webhook_deliveries d WHERE d.webhook_id = w.id AND d.state = 'pending'),
	w.created_by, ` + store.MsOf("w.created_at") + `, ` + store.MsOf("w.updated_at")

func scan(row pgx.Row) (Webhook, error) {
	var w Webhook
	err := row.Scan(&w.ID, &w.TenantID, &w.URL, &w.Description, &w.EventTypes, &w.State, &w.SecretVersion,
		&w.PreviousSecretValidUntil, &w.LastError, &w.FailingSince, &w.Pending, &w.CreatedBy, &w.CreatedAt, &w.UpdatedAt)
	return w, err
}

// NotFound is the error of a webhook the tenant does not have.
func NotFound(id string) error {
	return core.Errorf(core.CodeNotFound, "webhook %s not found", id).WithDetails(map[string]any{"field": "webhookId"})
}

// New is what webhooks.create is given (the URL already checked).
type New struct {
	URL, Description string
	EventTypes       []string
}

func secretAD(id string, version int) []byte { return []byte(fmt.Sprintf("%s\x00%d", id, version)) }

// Create records a webhook of the tenant and answers it with its signing
// secret, the one time it is shown. It takes the events published after
// it: its cursor is the tenant's last event number now.
func Create(ctx context.Context, tx store.Tx, vault *secrets.Vault, tenantID, by string, n New) (Webhook, string, error) {
	if err := rules.CheckPatterns(n.EventTypes); err != nil {
		return Webhook{}, "", err
	}
	secret, err := rules.NewSecret()
	if err != nil {
		return Webhook{}, "", err
	}
	id := core.NewID(IDPrefix)
	kek, sealed, err := vault.Seal(sealPurpose, []byte(secret), secretAD(id, 1))
	if err != nil {
		return Webhook{}, "", err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO webhooks (id, tenant_id, url, description, event_types, state, secret_kek, secret_sealed,
			cursor, created_by)
		VALUES ($1, $2, $3, $4, $5, 'active', $6, $7, COALESCE((SELECT last FROM event_sequences WHERE tenant_id = $2), 0), $8)`,
		id, tenantID, n.URL, n.Description, n.EventTypes, kek, sealed, by); err != nil {
		return Webhook{}, "", err
	}
	w, err := Get(ctx, tx, tenantID, id)
	return w, secret, err
}

// Get reads a live webhook of the tenant; another tenant's, a deleted one
// and a missing one are the same NOT_FOUND.
func Get(ctx context.Context, tx store.DBTX, tenantID, id string) (Webhook, error) {
	w, err := scan(tx.QueryRow(ctx, `SELECT `+columns+` FROM webhooks w WHERE w.id = $1 AND w.tenant_id = $2 AND w.deleted_at IS NULL`,
		id, tenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Webhook{}, NotFound(id)
	}
	return w, err
}

// List reads the tenant's live webhooks, oldest first, after the page's key.
func List(ctx context.Context, tx store.Tx, tenantID string, page store.PageQuery) ([]Webhook, error) {
	after := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT `+columns+` FROM webhooks w WHERE w.tenant_id = $1 AND w.deleted_at IS NULL
		AND (`+store.MsOf("w.created_at")+`, w.id) > ($3, $4) ORDER BY `+store.MsOf("w.created_at")+`, w.id LIMIT $2`,
		tenantID, page.Fetch(), after.At, after.ID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Webhook, error) { return scan(r) })
}

// Change is what webhooks.update changes; nil fields are kept. Enabled
// true makes a failing or disabled webhook active again (its queued
// deliveries go out, oldest first); false disables it (events still queue).
type Change struct {
	URL, Description *string
	EventTypes       []string
	Enabled          *bool
}

// Update changes a live webhook of the tenant.
func Update(ctx context.Context, tx store.Tx, tenantID, id string, ch Change) (Webhook, error) {
	if ch.EventTypes != nil {
		if err := rules.CheckPatterns(ch.EventTypes); err != nil {
			return Webhook{}, err
		}
	}
	var state *string
	if ch.Enabled != nil {
		s := rules.StateDisabled
		if *ch.Enabled {
			s = rules.StateActive
		}
		state = &s
	}
	tag, err := tx.Exec(ctx, `UPDATE webhooks SET url = COALESCE($3, url), description = COALESCE($4, description),
			event_types = COALESCE($5, event_types), state = COALESCE($6, state),
			failing_since = CASE WHEN $6 IS NULL THEN failing_since END, last_error = CASE WHEN $6 IS NULL THEN last_error ELSE '' END,
			updated_at = now()
		WHERE id = $1 AND tenant_id = $2 AND deleted_at IS NULL`, id, tenantID, ch.URL, ch.Description, ch.EventTypes, state)
	if err != nil {
		return Webhook{}, err
	}
	if tag.RowsAffected() == 0 {
		return Webhook{}, NotFound(id)
	}
	return Get(ctx, tx, tenantID, id)
}

// RotateSecret gives the webhook a new signing secret, answered once; the
// previous one keeps signing (both signatures go out) for
// rules.RotationOverlap.
func RotateSecret(ctx context.Context, tx store.Tx, vault *secrets.Vault, tenantID, id string) (Webhook, string, error) {
	var version int
	err := tx.QueryRow(ctx, `SELECT secret_version FROM webhooks WHERE id = $1 AND tenant_id = $2 AND deleted_at IS NULL FOR UPDATE`,
		id, tenantID).Scan(&version)
	if errors.Is(err, pgx.ErrNoRows) {
		return Webhook{}, "", NotFound(id)
	}
	if err != nil {
		return Webhook{}, "", err
	}
	secret, err := rules.NewSecret()
	if err != nil {
		return Webhook{}, "", err
	}
	kek, sealed, err := vault.Seal(sealPurpose, []byte(secret), secretAD(id, version+1))
	if err != nil {
		return Webhook{}, "", err
	}
	if _, err := tx.Exec(ctx, `UPDATE webhooks SET previous_kek = secret_kek, previous_sealed = secret_sealed,
			previous_until = now() + $2 * interval '1 second', secret_kek = $3, secret_sealed = $4, secret_version = secret_version + 1,
			updated_at = now() WHERE id = $1`, id, rules.RotationOverlap.Seconds(), kek, sealed); err != nil {
		return Webhook{}, "", err
	}
	w, err := Get(ctx, tx, tenantID, id)
	return w, secret, err
}

// Delete removes a live webhook of the tenant: nothing more is sent to it;
// its deliveries stay readable by id for the record, not listed.
func Delete(ctx context.Context, tx store.Tx, tenantID, id string) (Webhook, error) {
	w, err := Get(ctx, tx, tenantID, id)
	if err != nil {
		return Webhook{}, err
	}
	_, err = tx.Exec(ctx, `UPDATE webhooks SET deleted_at = now(), updated_at = now() WHERE id = $1`, id)
	return w, err
}

var deliveryColumns = `d.ordinal, d.id, d.webhook_id, d.event_id, d.event_type, d.state, d.attempts,
	CASE WHEN d.state = 'pending' THEN ` + store.MsOf("d.next_attempt_at") + ` END, ` + store.MsOf("d.created_at") + `, ` +
	store.MsOf("d.delivered_at") + `, d.payload`

func scanDelivery(row pgx.Row) (Delivery, error) {
	var d Delivery
	var payload []byte
	err := row.Scan(&d.ordinal, &d.ID, &d.WebhookID, &d.EventID, &d.EventType, &d.State, &d.Attempts, &d.NextAttemptAt, &d.CreatedAt,
		&d.DeliveredAt, &payload)
	d.Payload, d.LastAttempts = payload, []Attempt{}
	return d, err
}

// Deliveries reads a live webhook's deliveries, last queued first, each with its
// last attempts (newest first).
func Deliveries(ctx context.Context, tx store.Tx, tenantID, webhookID string, page store.PageQuery) ([]Delivery, error) {
	if _, err := Get(ctx, tx, tenantID, webhookID); err != nil {
		return nil, err
	}
	after := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT `+deliveryColumns+` FROM webhook_deliveries d WHERE d.webhook_id = $1
		AND ($3 = 0 OR d.ordinal < $3) ORDER BY d.ordinal DESC LIMIT $2`, webhookID, page.Fetch(), after.Seq)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Delivery, error) { return scanDelivery(r) })
	if err != nil {
		return nil, err
	}
	return out, withAttempts(ctx, tx, out)
}

// withAttempts fills each delivery's last attempts, in one query for all.
func withAttempts(ctx context.Context, tx store.DBTX, ds []Delivery) error {
	ids := make([]string, len(ds))
	at := map[string]int{}
	for i, d := range ds {
		ids[i], at[d.ID] = d.ID, i
	}
	rows, err := tx.Query(ctx, `SELECT delivery_id, n, `+store.MsOf("at")+`, status_code, latency_ms, response, error
		FROM (SELECT *, row_number() OVER (PARTITION BY delivery_id ORDER BY n DESC) AS rank
			FROM webhook_attempts WHERE delivery_id = ANY($1)) a
		WHERE rank <= $2 ORDER BY delivery_id, n DESC`, ids, lastAttempts)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var a Attempt
		if err := rows.Scan(&id, &a.N, &a.At, &a.StatusCode, &a.LatencyMs, &a.Response, &a.Error); err != nil {
			return err
		}
		ds[at[id]].LastAttempts = append(ds[at[id]].LastAttempts, a)
	}
	return rows.Err()
}

func getDelivery(ctx context.Context, tx store.DBTX, webhookID, id string) (Delivery, error) {
	d, err := scanDelivery(tx.QueryRow(ctx, `SELECT `+deliveryColumns+` FROM webhook_deliveries d WHERE d.id = $1 AND d.webhook_id = $2`,
		id, webhookID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Delivery{}, core.Errorf(core.CodeNotFound, "delivery %s not found", id).WithDetails(map[string]any{"field": "deliveryId"})
	}
	if err != nil {
		return Delivery{}, err
	}
	ds := []Delivery{d}
	err = withAttempts(ctx, tx, ds)
	return ds[0], err
}

// Redeliver queues one of a live webhook's deliveries again, to go out
// next (its id unchanged, so a receiver that has it deduplicates), with a
// fresh retry horizon; a failing webhook becomes active again. A delivery
// of another webhook or tenant is NOT_FOUND.
func Redeliver(ctx context.Context, tx store.Tx, tenantID, webhookID, id string) (Delivery, error) {
	if _, err := Get(ctx, tx, tenantID, webhookID); err != nil {
		return Delivery{}, err
	}
	tag, err := tx.Exec(ctx, `UPDATE webhook_deliveries SET state = 'pending', next_attempt_at = now(), first_attempt_at = NULL,
			delivered_at = NULL WHERE id = $1 AND webhook_id = $2`, id, webhookID)
	if err != nil {
		return Delivery{}, err
	}
	if tag.RowsAffected() == 0 {
		return Delivery{}, core.Errorf(core.CodeNotFound, "delivery %s not found", id).WithDetails(map[string]any{"field": "deliveryId"})
	}
	if _, err := tx.Exec(ctx, `UPDATE webhooks SET state = 'active', failing_since = NULL, last_error = '', updated_at = now()
		WHERE id = $1 AND state = 'failing'`, webhookID); err != nil {
		return Delivery{}, err
	}
	return getDelivery(ctx, tx, webhookID, id)
}

// Ping queues a test event (webhook.ping) to a live webhook, after every
// event published before it (it fans those out first).
func Ping(ctx context.Context, tx store.Tx, tenantID, webhookID string) (Delivery, error) {
	if _, err := Get(ctx, tx, tenantID, webhookID); err != nil {
		return Delivery{}, err
	}
	if _, _, err := FanOut(ctx, tx, webhookID); err != nil {
		return Delivery{}, err
	}
	id := core.NewID(DeliveryIDPrefix)
	payload, err := json.Marshal(map[string]any{"type": rules.PingType, "timestamp": time.Now().UTC().Format(time.RFC3339Nano),
		"data": map[string]any{"webhookId": webhookID}})
	if err != nil {
		return Delivery{}, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO webhook_deliveries (id, webhook_id, tenant_id, event_type, payload, state)
		VALUES ($1, $2, $3, $4, $5, 'pending')`, id, webhookID, tenantID, rules.PingType, payload); err != nil {
		return Delivery{}, err
	}
	return getDelivery(ctx, tx, webhookID, id)
}

// scanEvents bounds the events one fan-out reads.
const scanEvents = 500

// FanOut moves the events published after the webhook's cursor that it
// subscribes to into its deliveries, in event order, while its backlog has
// room, and moves the cursor past every event it read (taken or not
// wanted). It answers how many deliveries it queued, and whether the
// webhook is gone (deleted). The webhook row is locked, so two fan-outs
// never take an event twice.
func FanOut(ctx context.Context, tx store.Tx, webhookID string) (queued int, gone bool, err error) {
	var tenantID string
	var patterns []string
	var cursor int64
	var deleted bool
	err = tx.QueryRow(ctx, `SELECT tenant_id, event_types, cursor, deleted_at IS NOT NULL FROM webhooks WHERE id = $1 FOR UPDATE`,
		webhookID).Scan(&tenantID, &patterns, &cursor, &deleted)
	if errors.Is(err, pgx.ErrNoRows) || deleted {
		return 0, true, nil
	}
	if err != nil {
		return 0, false, err
	}
	var pending int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE webhook_id = $1 AND state = 'pending'`, webhookID).
		Scan(&pending); err != nil {
		return 0, false, err
	}
	room := Backlog - pending
	if room <= 0 {
		return 0, false, nil
	}
	rows, err := tx.Query(ctx, `SELECT id, tenant_seq, type, resource_type, resource_id, project_id, data, created_at FROM events
		WHERE tenant_id = $1 AND tenant_seq > $2 ORDER BY tenant_seq LIMIT $3`, tenantID, cursor, scanEvents)
	if err != nil {
		return 0, false, err
	}
	type event struct {
		id, typ, resourceType, resourceID, projectID string
		seq                                          int64
		data                                         json.RawMessage
		at                                           time.Time
	}
	var events []event
	for rows.Next() {
		var e event
		if err := rows.Scan(&e.id, &e.seq, &e.typ, &e.resourceType, &e.resourceID, &e.projectID, &e.data, &e.at); err != nil {
			rows.Close()
			return 0, false, err
		}
		events = append(events, e)
	}
	if err := rows.Err(); err != nil {
		return 0, false, err
	}
	last := cursor
	for _, e := range events {
		if rules.Matches(patterns, e.typ) {
			if queued == room {
				break
			}
			payload, err := json.Marshal(map[string]any{"type": e.typ, "timestamp": e.at.UTC().Format(time.RFC3339Nano),
				"data": map[string]any{"eventId": e.id, "seq": e.seq, "resourceType": e.resourceType, "resourceId": e.resourceID,
					"projectId": e.projectID, "data": e.data}})
			if err != nil {
				return 0, false, err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO webhook_deliveries (id, webhook_id, tenant_id, event_id, event_type, payload, state)
				VALUES ($1, $2, $3, $4, $5, $6, 'pending') ON CONFLICT DO NOTHING`,
				core.NewID(DeliveryIDPrefix), webhookID, tenantID, e.id, e.typ, payload); err != nil {
				return 0, false, err
			}
			queued++
		}
		last = e.seq
	}
	if last != cursor {
		_, err = tx.Exec(ctx, `UPDATE webhooks SET cursor = $2 WHERE id = $1`, webhookID, last)
	}
	return queued, false, err
}

// Outgoing is a delivery to send now.
type Outgoing struct {
	DeliveryID string
	URL        string
	Body       []byte
	Secrets    []string
	// Attempt is the attempt's number (1 for the first).
	Attempt int
}

// Next is the webhook's oldest pending delivery when it is due and the
// webhook active; otherwise nil and how long until it is due (0: nothing
// queued, or the webhook is not active).
func Next(ctx context.Context, tx store.Tx, vault *secrets.Vault, webhookID string) (*Outgoing, time.Duration, error) {
	var state, url, kek string
	var sealed, prevSealed []byte
	var prevKek *string
	var version int
	var overlapping bool
	err := tx.QueryRow(ctx, `SELECT state, url, secret_kek, secret_sealed, secret_version, previous_kek, previous_sealed,
			COALESCE(previous_until > now(), false)
		FROM webhooks WHERE id = $1 AND deleted_at IS NULL`, webhookID).
		Scan(&state, &url, &kek, &sealed, &version, &prevKek, &prevSealed, &overlapping)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && state != rules.StateActive) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	var o Outgoing
	var due float64
	err = tx.QueryRow(ctx, `SELECT id, payload::text, attempts, GREATEST(extract(epoch FROM next_attempt_at - now()), 0)::float8
		FROM webhook_deliveries WHERE webhook_id = $1 AND state = 'pending' ORDER BY ordinal LIMIT 1`, webhookID).
		Scan(&o.DeliveryID, &o.Body, &o.Attempt, &due)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	if due > 0 {
		return nil, time.Duration(due * float64(time.Second)), nil
	}
	o.URL, o.Attempt = url, o.Attempt+1
	secret, err := vault.Open(sealPurpose, kek, sealed, secretAD(webhookID, version))
	if err != nil {
		return nil, 0, fmt.Errorf("webhook %s: opening its secret: %w", webhookID, err)
	}
	o.Secrets = []string{string(secret)}
	if overlapping && prevKek != nil {
		prev, err := vault.Open(sealPurpose, *prevKek, prevSealed, secretAD(webhookID, version-1))
		if err != nil {
			return nil, 0, fmt.Errorf("webhook %s: opening its previous secret: %w", webhookID, err)
		}
		o.Secrets = append(o.Secrets, string(prev))
	}
	return &o, 0, nil
}

// Result is an attempt's outcome, as drivers/webhooks answers it.
type Result struct {
	Status   int
	Latency  time.Duration
	Response string
	Err      string
	OK       bool
}

// Record writes attempt n of a delivery and its consequence: delivered;
// retried after retry (rules.RetryAfter); or, past rules.Horizon from the
// first attempt, failed, and its webhook failing. An attempt already
// recorded (a retried activity) changes nothing. It answers the delivery's
// state.
func Record(ctx context.Context, tx store.Tx, deliveryID string, n int, r Result, retry time.Duration) (string, error) {
	tag, err := tx.Exec(ctx, `INSERT INTO webhook_attempts (delivery_id, n, status_code, latency_ms, response, error)
		SELECT $1, $2, $3, $4, $5, $6 FROM webhook_deliveries WHERE id = $1 AND state = 'pending' AND attempts = $2 - 1
		ON CONFLICT DO NOTHING`, deliveryID, n, r.Status, r.Latency.Milliseconds(), r.Response, truncate(r.Err))
	if err != nil {
		return "", err
	}
	if tag.RowsAffected() == 0 {
		var state string
		err := tx.QueryRow(ctx, `SELECT state FROM webhook_deliveries WHERE id = $1`, deliveryID).Scan(&state)
		return state, err
	}
	if r.OK {
		_, err := tx.Exec(ctx, `UPDATE webhook_deliveries SET state = 'delivered', attempts = $2, delivered_at = now(),
			first_attempt_at = COALESCE(first_attempt_at, now()) WHERE id = $1`, deliveryID, n)
		return rules.DeliveryDelivered, err
	}
	var state, webhookID string
	err = tx.QueryRow(ctx, `UPDATE webhook_deliveries SET attempts = $2, first_attempt_at = COALESCE(first_attempt_at, now()),
			next_attempt_at = now() + $3 * interval '1 millisecond',
			state = CASE WHEN now() - COALESCE(first_attempt_at, now()) >= $4 * interval '1 second' THEN 'failed' ELSE 'pending' END
		WHERE id = $1 RETURNING state, webhook_id`, deliveryID, n, retry.Milliseconds(), rules.Horizon.Seconds()).Scan(&state, &webhookID)
	if err != nil || state != rules.DeliveryFailed {
		return state, err
	}
	why := r.Err
	if why == "" {
		why = fmt.Sprintf("HTTP %d", r.Status)
	}
	_, err = tx.Exec(ctx, `UPDATE webhooks SET state = 'failing', failing_since = now(), updated_at = now(),
			last_error = $2 WHERE id = $1 AND state = 'active'`, webhookID,
		truncate(fmt.Sprintf("delivery %s failed for %s: %s", deliveryID, rules.Horizon, why)))
	return state, err
}

func truncate(s string) string {
	if len(s) <= 1024 {
		return s
	}
	return strings.ToValidUTF8(s[:1024], "")
}

// Live is the ids of live webhooks, oldest first, at most limit: the
// reconciler starts each one's workflow.
func Live(ctx context.Context, tx store.Tx, limit int) ([]string, error) {
	rows, err := tx.Query(ctx, `SELECT id FROM webhooks WHERE deleted_at IS NULL ORDER BY created_at, id LIMIT $1`, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
