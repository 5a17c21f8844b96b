package main

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// cancelHandler sends the server a cancel request when a statement's
// context ends (pgx's default only closes the socket, and the server would
// go on waiting for a lock, then commit), and gives the connection
// cancelGrace to answer before it is dropped.
//
// Unlike pgx's CancelRequestContextWatcherHandler, it does not cut the
// cancel request short when the statement ends first (the server's
// "canceling statement" answer usually arrives before the cancel
// connection is closed): it lets the request finish, within cancelGrace. A
// client that closes its cancel connection first can crash PgBouncer
// ("FATAL ... disconnect_client(): bad client state: 0",
// pgbouncer/pgbouncer#801; 1.18 did in TestCommandsThroughPgBouncer),
// ending every client's connections.
type cancelHandler struct {
	conn *pgconn.PgConn
	done chan struct{}
}

func (h *cancelHandler) HandleCancel(context.Context) {
	deadline := time.Now().Add(cancelGrace)
	_ = h.conn.Conn().SetDeadline(deadline)
	done := make(chan struct{})
	h.done = done
	go func() {
		defer close(done)
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		defer cancel()
		_ = h.conn.CancelRequest(ctx)
	}()
}

func (h *cancelHandler) HandleUnwatchAfterCancel() {
	<-h.done
	_ = h.conn.Conn().SetDeadline(time.Time{})
}
