// Package apitest exercises apicheck's formatting: one of each kind of
// exported name. api_test.go compares its API lines with apitest.golden.
package apitest

import (
	"context"
	"io"
	"time"
)

const Untyped = "s"

const Typed time.Duration = 3 * time.Second

const Float = 1.0 / 3

const (
	A Mode = iota
	B
)

const unexportedConst = 1

type Mode int

func (m Mode) String() string { return "" }

var ErrX error

var Counter, Other int

// Deprecated: use New.
func Old() {}

func New(ctx context.Context, opts ...Option) (*Thing, error) { return nil, nil }

func Generic[K comparable, V any, S ~[]V](m map[K]V, s S) S { return s }

func Union[D DB](d D) {}

type Option func(*config)

type config struct{}

type DB interface {
	*Thing | *Other2
}

type Number interface {
	~int | ~int64 | ~float64
}

type Other2 struct{}

type Thing struct {
	Name    string
	Nested  struct{ X, y int }
	Fn      func(a, b int, rest ...string) (int, error)
	Ch      <-chan struct{}
	Arr     [4]byte
	M       map[string][]*Thing
	Iface   interface{ Do(int) error }
	private int
	io.Reader
	*Embedded
	base
	// Deprecated: gone soon.
	Legacy bool
}

type base struct {
	Promoted string
	Name     int // shadowed by Thing.Name
	hidden   int
}

func (base) FromBase() int     { return 0 }
func (*base) PtrFromBase()     {}
func (base) unexportedMethod() {}

type Embedded struct{ E int }

func (*Embedded) Embed() {}

func (t *Thing) Close() error { return nil }

func (t Thing) Value() int { return 0 }

type Box[T any, N Number] struct {
	Val T
	Num N
}

func (b *Box[T, N]) Get() T { return b.Val }

func (b Box[U, M]) Sum(n M) M { return n }

type Pair[T any] = Box[T, int]

type Alias = Thing

type Reader interface {
	io.Reader
	ReadAll(ctx context.Context) ([]byte, error)
}

type Sealed interface {
	Public()
	sealed()
}

type Empty interface{}

type Both interface {
	Number
	comparable
	String() string
}
