// Package connerr renders a failed PostgreSQL connection as one line, the
// same for every command of the pglease CLI and for `pglease serve`'s
// pages: "cannot connect to HOST:PORT: CAUSE".
package connerr

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Is reports whether err is a failure to connect (pgx's *pgconn.ConnectError
// anywhere in its chain), as opposed to an error from a working connection.
func Is(err error) bool {
	var ce *pgconn.ConnectError
	return errors.As(err, &ce)
}

// Line renders a failed connection as one line, cause first:
// "cannot connect to HOST:PORT: CAUSE". pgx reports every attempt it made
// (each host, with and without TLS) in one long message; the cause an
// operator needs is, in order: the server's own refusal (database does not
// exist, authentication failed), a network error (connection refused, no
// such host, timeout), else the distinct attempts' errors. timeout is the
// bound the caller put on the attempt, named when it ran out.
func Line(err error, timeout fmt.Stringer) string {
	where := "the database"
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) && ce.Config != nil {
		where = address(ce.Config.Host, ce.Config.Port)
	}
	return fmt.Sprintf("cannot connect to %s: %s", where, cause(err, ce, timeout))
}

func address(host string, port uint16) string {
	if strings.HasPrefix(host, "/") { // a Unix socket directory
		return "socket " + host + "/.s.PGSQL." + strconv.Itoa(int(port))
	}
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

func cause(err error, ce *pgconn.ConnectError, timeout fmt.Stringer) string {
	var (
		pe  *pgconn.PgError
		dns *net.DNSError
		op  *net.OpError
	)
	switch {
	case errors.As(err, &pe):
		return pe.Message
	case errors.As(err, &dns):
		return "cannot resolve host " + strconv.Quote(dns.Name) + ": " + dns.Err
	case errors.As(err, &op):
		return innermost(op.Err).Error()
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("no answer within %v", timeout)
	case ce != nil:
		return attempts(ce.Unwrap())
	}
	return err.Error()
}

// innermost follows a chain of single wrappers to its end (the errno).
func innermost(err error) error {
	for {
		u := errors.Unwrap(err)
		if u == nil {
			return err
		}
		err = u
	}
}

// attempts lists the distinct errors of pgx's connection attempts, without
// their "host:port (host): " prefixes.
func attempts(err error) string {
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	var out []string
	seen := map[string]bool{}
	for _, e := range errs {
		msg := e.Error()
		if u := errors.Unwrap(e); u != nil {
			msg = u.Error()
		}
		if !seen[msg] {
			seen[msg] = true
			out = append(out, msg)
		}
	}
	return strings.Join(out, "; ")
}
