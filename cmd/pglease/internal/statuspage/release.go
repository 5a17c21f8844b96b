package statuspage

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease"
)

const (
	releasePrefix = "/api/leases/"
	releaseSuffix = "/release"
)

// releasePath recognises /api/leases/{key}/release on the escaped path and
// returns the key, percent-decoded ("" when it does not decode), or the
// query's key parameter when the path has none (/api/leases//release?key=..,
// for the keys "." and "..", which a browser would resolve as path steps).
func releasePath(u *url.URL) (string, bool) {
	p := u.EscapedPath()
	if !strings.HasPrefix(p, releasePrefix) || !strings.HasSuffix(p, releaseSuffix) ||
		len(p) < len(releasePrefix)+len(releaseSuffix) {
		return "", false
	}
	return pathKey(u, p[len(releasePrefix):len(p)-len(releaseSuffix)]), true
}

// forceReleaseWait is how long a force release from the page waits for
// the key's row (held by a fenced transaction) before it fails, releasing
// nothing; forceReleaseDeadline is its context's deadline, from which
// ForceRelease sets the server's lock_timeout to forceReleaseWait (a
// quarter of the deadline less).
const (
	forceReleaseWait     = 5 * time.Second
	forceReleaseDeadline = forceReleaseWait * 4 / 3
)

// releaseResult is the JSON answer of a successful force release.
type releaseResult struct {
	Key      string `json:"key"`
	Holder   string `json:"holder"`    // the evicted holder
	OldFence int64  `json:"old_fence"` // the evicted lease's fence
	NewFence int64  `json:"new_fence"` // the fence the row now carries
	WasLive  bool   `json:"was_live"`  // the lease was held when evicted
}

// handleRelease serves POST /api/leases/{key}/release. It is refused (403)
// unless force release was enabled, the request is not cross-origin (Origin,
// Sec-Fetch-Site), and it carries "Authorization: Bearer <token>". No cookie
// is ever set or read, so a browser cannot attach the credential on its own.
func (s *Server) handleRelease(w http.ResponseWriter, r *http.Request, key string) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "use POST"})
		return
	}
	if !s.cfg.AllowForceRelease {
		writeJSON(w, http.StatusForbidden, map[string]string{"error": "force release is disabled: start pglease serve with --allow-force-release and a token"})
		return
	}
	if err := http.NewCrossOriginProtection().Check(r); err != nil {
		s.log.Warn("pglease serve: cross-origin force release refused", "key", key, "origin", r.Header.Get("Origin"), "remote", r.RemoteAddr)
		writeJSON(w, http.StatusForbidden, map[string]string{"error": "cross-origin request refused"})
		return
	}
	if !s.tokenOK(r.Header.Get("Authorization")) {
		s.log.Warn("pglease serve: force release with a missing or wrong token refused", "key", key, "remote", r.RemoteAddr)
		writeJSON(w, http.StatusForbidden, map[string]string{"error": "missing or wrong token (Authorization: Bearer <token>)"})
		return
	}
	// The deadline bounds the wait for the row on the server too
	// (ForceRelease sets lock_timeout from it): behind a fenced transaction
	// the release fails, releasing nothing, after about forceReleaseWait.
	rctx, cancel := context.WithTimeout(r.Context(), forceReleaseDeadline)
	defer cancel()
	fr, err := pglease.ForceRelease(rctx, s.cfg.DB, key, pglease.WithTable(s.cfg.Table))
	var pe *pgconn.PgError
	switch {
	case errors.Is(err, pglease.ErrInvalidKey):
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	case errors.Is(err, pglease.ErrUnknownKey):
		writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
		return
	case errors.As(err, &pe) && pe.Code == "55P03": // lock_not_available: the wait for the row ran out, rolled back
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": fmt.Sprintf(
			"nothing was released: a fenced transaction of the holder still locks the row of %q after %v (until it commits or rolls back); retry later",
			key, forceReleaseWait)})
		return
	case err != nil:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": s.explain(err)})
		return
	}
	s.log.Warn("pglease serve: lease force-released", "key", fr.Key, "holder", fr.Holder,
		"old_fence", fr.OldFence, "new_fence", fr.NewFence, "was_live", fr.WasLive, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, releaseResult(fr))
}

// tokenOK compares the bearer token in constant time (over SHA-256 digests,
// so the comparison does not leak the token's length either).
func (s *Server) tokenOK(header string) bool {
	got, ok := strings.CutPrefix(header, "Bearer ")
	if !ok || got == "" {
		return false
	}
	a, b := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(s.cfg.Token))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}
