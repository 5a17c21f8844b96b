package statuspage_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/cmd/pglease/internal/statuspage"
)

// TestASlowFirstAuditHoldsNoPage: the first audit runs in the background;
// a page waits for it at most the read timeout, says it is still running,
// and shows its count once it completes.
func TestASlowFirstAuditHoldsNoPage(t *testing.T) {
	gate, returned := make(chan struct{}), make(chan struct{})
	f := newFixture(t, statuspage.Config{ReadTimeout: 300 * time.Millisecond, AuditTimeout: time.Minute, AuditInterval: time.Hour,
		Audit: func(ctx context.Context, _ time.Time) ([]statuspage.Finding, error) {
			defer close(returned)
			select {
			case <-gate:
				return []statuspage.Finding{{Key: "k", Fence: 2, Cause: "unknown"}}, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}})
	s := f.leases(t) // with the audit still held at its gate
	if s.Audit == nil || !strings.Contains(s.Audit.Error, "still running") {
		t.Fatalf("while the first audit runs: %+v, want it said to be still running", s.Audit)
	}
	close(gate)
	<-returned
	for {
		s = f.leases(t)
		if s.Audit != nil && s.Audit.Error == "" {
			break
		}
		if !strings.Contains(s.Audit.Error, "still running") {
			t.Fatalf("after the audit returned: %q", s.Audit.Error)
		}
		time.Sleep(10 * time.Millisecond) // the run is recorded just after it returns
	}
	if s.Audit.Findings != 1 {
		t.Errorf("%d findings, want the audit's 1", s.Audit.Findings)
	}
}

// TestAnAuditPastItsTimeoutIsStopped: a run that outlasts AuditTimeout is
// cancelled and the page says why; Close stops a run in flight.
func TestAnAuditPastItsTimeoutIsStopped(t *testing.T) {
	ended := make(chan error, 10)
	block := func(ctx context.Context, _ time.Time) ([]statuspage.Finding, error) {
		<-ctx.Done()
		ended <- ctx.Err()
		return nil, ctx.Err()
	}
	f := newFixture(t, statuspage.Config{ReadTimeout: 10 * time.Second, AuditTimeout: 200 * time.Millisecond, AuditInterval: time.Hour, Audit: block})
	s := f.leases(t)
	if err := <-ended; !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the audit's context ended with %v, want its deadline", err)
	}
	if s.Audit == nil || !strings.Contains(s.Audit.Error, "took longer than 200ms") {
		t.Errorf("page's audit: %+v, want the timeout named", s.Audit)
	}

	started := make(chan struct{})
	srv := newServer(t, statuspage.Config{DB: f.db, Table: f.table, ReadTimeout: 100 * time.Millisecond, AuditTimeout: time.Hour,
		Audit: func(ctx context.Context, since time.Time) ([]statuspage.Finding, error) {
			close(started)
			return block(ctx, since)
		}})
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/api/leases", nil))
	}()
	<-started
	if err := srv.Close(); err != nil { // waits for the run: it must end
		t.Fatal(err)
	}
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Errorf("Close ended the audit with %v, want it cancelled", err)
	}
	<-served
}
