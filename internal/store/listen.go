package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// notifyProbeSQL is the listener's self-test: a notification on the
// table's channel that the listening connection must receive.
//
//	$1 payload
const notifyProbeSQL = `SELECT pg_notify('pglease_c0533ac085fea582', $1)::text`

// backendPIDSQL reads the pid of the backend serving the statement (the
// listener compares it with the pid announced at connection: a pooler
// announces its own).
const backendPIDSQL = `SELECT pg_backend_pid()`

// NotifyProbe sends payload on the table's channel, through the pool.
func (s *Store) NotifyProbe(ctx context.Context, payload string) error {
	_, err := s.DB.Exec(ctx, s.sql.NotifyProbe, payload)
	return err
}

// Listen makes conn, a connection of its own outside the pool, listen on
// the table's channel.
func (s *Store) Listen(ctx context.Context, conn *pgx.Conn) error {
	_, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.names.Channel}.Sanitize())
	return err
}

// BackendPID reads the pid of the backend serving conn.
func BackendPID(ctx context.Context, conn *pgx.Conn) (uint32, error) {
	var pid uint32
	err := conn.QueryRow(ctx, backendPIDSQL).Scan(&pid)
	return pid, err
}
