package pgserver

import (
	"fmt"
	"net"
	neturl "net/url"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/tcpproxy"
)

// Proxy is a TCP proxy in front of a PostgreSQL server that can stall or cut
// the connections that go through it, as a network partition or an
// unreachable host would. Give one replica its pool through a Proxy to see
// what happens when that replica loses its lease: the lease is lost, and
// another replica takes it over.
type Proxy struct {
	p   *tcpproxy.Proxy
	url string
}

// NewProxy starts a proxy on a free loopback port in front of the server of
// the connection string url, which must be reached over TCP. It forwards
// traffic until told otherwise. Close it when done.
func NewProxy(url string) (*Proxy, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("pgserver: proxy: %w", err)
	}
	if strings.HasPrefix(cfg.Host, "/") {
		return nil, fmt.Errorf("pgserver: proxy: %s is a Unix socket; the proxy needs a TCP address", cfg.Host)
	}
	p, err := tcpproxy.New(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	if err != nil {
		return nil, fmt.Errorf("pgserver: proxy: %w", err)
	}
	return &Proxy{p: p, url: viaAddr(url, p.Port())}, nil
}

// viaAddr returns the connection string url with its host and port replaced
// by 127.0.0.1 and port.
func viaAddr(url string, port int) string {
	if u, err := neturl.Parse(url); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		return u.String()
	}
	// Keyword/value form: a later setting overrides an earlier one.
	return fmt.Sprintf("%s host=127.0.0.1 port=%d", url, port)
}

// URL returns the connection string of the server, through the proxy.
func (p *Proxy) URL() string { return p.url }

// Stall holds every byte sent either way, forwarding nothing: connections
// hang, as they do across a network partition. New connections are
// accepted and hang too.
func (p *Proxy) Stall() { p.p.SetMode(tcpproxy.BlackHole) }

// Cut closes every connection through the proxy and closes new ones at once,
// as a host that is up but unreachable answers.
func (p *Proxy) Cut() { p.p.SetMode(tcpproxy.Drop) }

// Restore forwards traffic again after Stall or Cut. After Stall, the bytes
// held are delivered late, as a network that heals delivers them.
func (p *Proxy) Restore() { p.p.SetMode(tcpproxy.Pass) }

// CloseConns closes every connection open through the proxy; the proxy goes
// on accepting new ones (after Stall, they hang).
func (p *Proxy) CloseConns() { p.p.DropAll() }

// Close stops the proxy and closes its connections.
func (p *Proxy) Close() error { return p.p.Close() }
