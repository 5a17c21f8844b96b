package pglease

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Do: runs, skips, reports a loss during the run, releases on panic.
func TestDo(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, b := f.replica(2, WithLeaseDuration(time.Second), WithHeartbeat(100*time.Millisecond)), f.replica(2)
	c := ctx(t)
	ran := false
	if err := a.Do(c, "job", func(ctx context.Context, le *Lease) error { ran = le.Fence() > 0; return nil }); err != nil || !ran {
		t.Fatalf("Do: %v ran=%v", err, ran)
	}
	held, err := b.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Do(c, "job", func(context.Context, *Lease) error { t.Fatal("ran while held"); return nil }); !errors.Is(err, ErrAlreadyLocked) {
		t.Fatalf("Do on a held key: %v", err)
	}
	_ = held.Unlock(c)
	jobErr := errors.New("job failed")
	err = a.Do(c, "job", func(ctx context.Context, le *Lease) error {
		if _, err := ForceRelease(c, f.admin, "job", WithTable(f.table)); err != nil {
			return err
		}
		<-ctx.Done() // ends with the loss, at the next beat
		return jobErr
	})
	if !errors.Is(err, jobErr) || !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Do with a loss: %v", err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic was swallowed")
			}
		}()
		_ = a.Do(c, "job", func(context.Context, *Lease) error { panic("boom") })
	}()
	if r, _ := f.row("job"); r.Live {
		t.Fatalf("the lease of a panicking job was not released: %+v", r)
	}
}
