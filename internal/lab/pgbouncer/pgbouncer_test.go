package pgbouncer

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// The port picked for PgBouncer can be taken by another process before
// PgBouncer binds it; something then answers there that is not ours. Start
// notices (PgBouncer exits: it cannot listen) and starts on another port.
func TestStartPicksAnotherPortWhenItsIsTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	taken := ln.Addr().(*net.TCPAddr).Port
	free, picks := pickPort, 0
	pickPort = func() (int, error) {
		if picks++; picks == 1 {
			return taken, nil
		}
		return free()
	}
	defer func() { pickPort = free }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := Start(ctx, Options{TargetPort: 1}) // PgBouncer dials its server only for a client
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	if b.Port() == taken || picks < 2 || !strings.Contains(b.Log(), "listening on "+b.Addr()) {
		t.Fatalf("started on port %d (taken: %d) after %d picks; log:\n%s", b.Port(), taken, picks, b.Log())
	}
}
