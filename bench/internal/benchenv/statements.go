package benchenv

import "context"

// StatStatements reads statements' server execution times from
// pg_stat_statements, when the server has it loaded (shared_preload_libraries).
type StatStatements struct {
	q  Querier
	ok bool
}

// NewStatStatements creates the extension if need be and resets its
// counters; without pg_stat_statements on the server, every read reports
// nothing.
func NewStatStatements(ctx context.Context, q Querier) *StatStatements {
	s := &StatStatements{q: q}
	if _, err := q.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return s
	}
	_, err := q.Exec(ctx, `SELECT pg_stat_statements_reset()`)
	s.ok = err == nil
	return s
}

// ExecMicros is the mean execution time, in µs, since the reset, of the
// most called statement whose text contains substr (the executor's time
// only: not parsing, planning, the commit or the round trip).
func (s *StatStatements) ExecMicros(substr string) (float64, bool) {
	if !s.ok {
		return 0, false
	}
	var us float64
	err := s.q.QueryRow(context.Background(), `SELECT mean_exec_time * 1000 FROM pg_stat_statements
WHERE strpos(query, $1) > 0 OR (query IN ('SELECT 1', 'SELECT $1') AND $1 = 'SELECT 1')
ORDER BY calls DESC LIMIT 1`, substr).Scan(&us)
	return us, err == nil
}
