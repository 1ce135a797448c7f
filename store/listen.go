package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Listen holds a dedicated connection LISTENing on channel until ctx ends
// or the connection fails (the caller reconnects). connected runs once the
// LISTEN is in place: whatever happened before may have been missed, so it
// is where the caller resynchronises. Each notification's payload goes to
// receive.
func (s *Store) Listen(ctx context.Context, channel string, connected func(), receive func(payload string)) error {
	conn, err := pgx.ConnectConfig(ctx, s.Pool.Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("store: listen %s: connect: %w", channel, err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		conn.Close(closeCtx)
	}()
	if _, err := conn.Exec(ctx, `LISTEN `+pgx.Identifier{channel}.Sanitize()); err != nil {
		return fmt.Errorf("store: listen %s: %w", channel, err)
	}
	connected()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("store: listen %s: %w", channel, err)
		}
		receive(n.Payload)
	}
}
