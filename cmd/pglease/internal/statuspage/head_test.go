package statuspage_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"testing"
	"time"

	"github.com/pglease/pglease/cmd/pglease/internal/statuspage"
)

// HEAD /events answers the stream's status and headers and ends: a
// keep-alive client's next request, on the same connection, is answered.
// A HEAD that streamed on would never end (writes to a HEAD response are
// discarded, so none fails, and the connection stays open), and the GET
// would wait behind it forever: the test gives the GET 10s, and its
// requests' contexts end with the test, so that it ends either way.
func TestHeadEventsEnds(t *testing.T) {
	f := newFixture(t, statuspage.Config{})
	stop, cancel := context.WithCancel(context.Background())
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, done := context.WithCancel(r.Context())
		defer done()
		defer context.AfterFunc(stop, done)()
		f.srv.ServeHTTP(w, r.WithContext(c))
	}))
	t.Cleanup(hs.Close)
	t.Cleanup(cancel) // before hs.Close: ends a stream that never would
	tr := &http.Transport{MaxConnsPerHost: 1}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	resp, err := cl.Head(hs.URL + "/events")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Errorf("HEAD /events: %d, Content-Type %q; want GET's 200 text/event-stream", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var reused bool
	c := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
	})
	req, err := http.NewRequestWithContext(c, http.MethodGet, hs.URL+"/healthz", nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	resp, err = cl.Do(req)
	if err != nil {
		t.Fatalf("GET /healthz after HEAD /events, on the same connection: %v after %v", err, time.Since(start).Round(time.Millisecond))
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /healthz after HEAD /events: %d", resp.StatusCode)
	}
	if !reused {
		t.Errorf("GET /healthz did not reuse HEAD /events' connection: the test proves nothing")
	}
	// A HEAD with an invalid view is refused as the GET is.
	resp, err = cl.Head(hs.URL + "/events?limit=x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("HEAD /events?limit=x: %d, want 400", resp.StatusCode)
	}
}
