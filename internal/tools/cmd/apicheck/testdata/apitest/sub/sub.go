// Package sub refers to its parent's types: they are written qualified.
package sub

import "example.com/apitest"

func Make() apitest.Box[string, int] { return apitest.Box[string, int]{} }

var V apitest.Pair[bool]
