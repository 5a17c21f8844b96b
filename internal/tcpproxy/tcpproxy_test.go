package tcpproxy

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// echo starts a line echo server and returns its address.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn, timeout time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	_, err := bufio.NewReader(c).ReadString('\n')
	return err
}

func TestModes(t *testing.T) {
	p, err := New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := roundTrip(c, 2*time.Second); err != nil {
		t.Fatalf("pass: %v", err)
	}
	// Black hole: the bytes are held, nothing comes back.
	p.SetMode(BlackHole)
	if err := roundTrip(c, 200*time.Millisecond); err == nil {
		t.Fatal("black hole: got a reply")
	}
	// Pass again: the held bytes go through, and their reply comes back
	// (read here, so that the Drop check below cannot read it instead).
	p.SetMode(Pass)
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		t.Fatalf("pass after black hole: the held bytes got no reply: %v", err)
	}
	// Drop: open connections are reset, new ones closed at once.
	p.SetMode(Drop)
	if p.Mode() != Drop {
		t.Fatal("mode")
	}
	if err := roundTrip(c, 2*time.Second); err == nil {
		t.Fatal("drop: the old connection still works")
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err == nil {
		if err := roundTrip(c2, 2*time.Second); err == nil {
			t.Fatal("drop: a new connection works")
		}
		c2.Close()
	}
	// Pass again: new connections work.
	p.SetMode(Pass)
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if err := roundTrip(c3, 2*time.Second); err != nil {
		t.Fatalf("pass after drop: %v", err)
	}
	// Delay.
	p.SetDelay(50 * time.Millisecond)
	t0 := time.Now()
	if err := roundTrip(c3, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d < 100*time.Millisecond {
		t.Fatalf("delay: round trip took %v, want at least 2×50ms", d)
	}
}
