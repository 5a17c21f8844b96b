package main

import (
	"errors"

	"github.com/pglease/pglease/cmd/pglease/internal/connerr"
)

// connectError renders a failed connection as one line, cause first:
// "cannot connect to HOST:PORT: CAUSE" (see package connerr; `pglease serve`
// gives the same line on its pages).
func connectError(err error) error {
	return errors.New(connerr.Line(err, connectTimeout))
}
