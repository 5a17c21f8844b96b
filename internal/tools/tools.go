//go:build tools

// Package tools pins the versions of the programs the repository's scripts
// run (staticcheck) and holds the repository's own check programs. It is a
// module of its own, never published, so that none of its requirements
// reach the library's users.
package tools

import (
	_ "golang.org/x/mod/zip"
	_ "golang.org/x/tools/go/packages"
	_ "honnef.co/go/tools/cmd/staticcheck"
)
