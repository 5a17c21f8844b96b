// Package tcpproxy is a small TCP proxy for fault-injection tests: it sits
// between a replica's pool and PostgreSQL and can pass traffic, delay it,
// black-hole it (accept and forward nothing, as a partition looks to TCP),
// drop it (reset every connection and refuse new ones, as a host that is up
// but unreachable answers), or drop every connection once.
package tcpproxy

import (
	"io"
	"net"
	"sync"
	"time"
)

// Mode says what the proxy does with traffic.
type Mode int

const (
	Pass      Mode = iota // forward
	BlackHole             // hold bytes, forward nothing (connections hang)
	Drop                  // close open connections, and new ones at once
)

// Proxy forwards 127.0.0.1:<Port> to a target address.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	mode  Mode
	delay time.Duration
	conns map[net.Conn]struct{}
	wake  chan struct{} // closed when the mode changes
	wg    sync.WaitGroup
	done  bool
}

// New starts a proxy to target ("host:port").
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, wake: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listening address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the proxy's listening port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// SetMode switches between passing, black-holing and dropping traffic.
// Switching to Drop closes every open connection.
func (p *Proxy) SetMode(m Mode) {
	p.mu.Lock()
	p.mode = m
	close(p.wake)
	p.wake = make(chan struct{})
	p.mu.Unlock()
	if m == Drop {
		p.DropAll()
	}
}

// Mode is the current mode.
func (p *Proxy) Mode() Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// SetDelay adds latency to every chunk forwarded (0: none).
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// DropAll closes every open connection (new ones are still accepted).
func (p *Proxy) DropAll() {
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.done = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.DropAll()
	p.SetMode(Pass) // wake waiters so they exit
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.Mode() == Drop {
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !p.track(c, up) {
			return
		}
		p.wg.Add(2)
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		for _, c := range cs {
			_ = c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		_ = dst.Close()
		_ = src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.wait() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			return
		}
	}
}

// wait blocks while the proxy black-holes traffic and applies the delay; it
// returns false when the proxy is closing.
func (p *Proxy) wait() bool {
	for {
		p.mu.Lock()
		mode, delay, wake, done := p.mode, p.delay, p.wake, p.done
		p.mu.Unlock()
		if done {
			return false
		}
		if mode == BlackHole {
			<-wake
			continue
		}
		if mode == Drop {
			return false
		}
		if delay > 0 {
			time.Sleep(delay)
		}
		return true
	}
}
