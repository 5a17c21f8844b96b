package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// connectError renders a failed connection as one line, cause first:
// "cannot connect to HOST:PORT: CAUSE". pgx reports every attempt it made
// (each host, with and without TLS) in one long message; the cause an
// operator needs is, in order: the server's own refusal (database does not
// exist, authentication failed), a network error (connection refused, no
// such host, timeout), else the distinct attempts' errors.
func connectError(err error) error {
	where := "the database"
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) && ce.Config != nil {
		where = address(ce.Config.Host, ce.Config.Port)
	}
	return fmt.Errorf("cannot connect to %s: %s", where, connectCause(err, ce))
}

func address(host string, port uint16) string {
	if strings.HasPrefix(host, "/") { // a Unix socket directory
		return "socket " + host + "/.s.PGSQL." + strconv.Itoa(int(port))
	}
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

func connectCause(err error, ce *pgconn.ConnectError) string {
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
		return fmt.Sprintf("no answer within %v", connectTimeout)
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
