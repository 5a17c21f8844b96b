package statuspage

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// Paging limits of a view.
const (
	DefaultLimit = 50         // rows per page when the request names none
	MaxLimit     = 500        // the most rows one page may ask for
	MaxOffset    = 10_000_000 // beyond any table the page is meant for
)

// ErrView marks a request whose view (filters, sort, paging) is invalid.
var ErrView = errors.New("statuspage: invalid view")

// View is what one page shows: filters, sort and paging, from the query
// string of /, /events and /api/leases. Its zero value (after
// normalisation) is the first page of every lease in natural key order.
// Views are comparable: equal views share their reads.
type View struct {
	Prefix string `json:"prefix"` // key prefix; "" for every key
	Holder string `json:"holder"` // exact holder; "" for every holder
	States string `json:"state"`  // comma-separated states, sorted; "" for all
	Sort   string `json:"sort"`   // key, holder, state, fence, acquired, expires
	Desc   bool   `json:"desc"`
	Offset int    `json:"offset"`
	Limit  int    `json:"limit"`
}

// parseView reads a view from a query string: prefix, holder, state
// (repeated or comma-separated), sort, order (asc or desc), offset, limit.
// Anything out of range is an error that names the parameter; nothing is
// silently clamped.
func parseView(q url.Values) (View, error) {
	v := View{Prefix: q.Get("prefix"), Holder: q.Get("holder"), Sort: q.Get("sort"), Limit: DefaultLimit}
	for name := range q {
		switch name {
		case "prefix", "holder", "state", "sort", "order", "offset", "limit":
		default:
			return View{}, fmt.Errorf("%w: unknown parameter %q (use prefix, holder, state, sort, order, offset, limit)", ErrView, name)
		}
	}
	if len(v.Prefix) > 512 || len(v.Holder) > 512 {
		return View{}, fmt.Errorf("%w: prefix and holder are at most 512 bytes", ErrView)
	}
	for name, s := range map[string]string{"prefix": v.Prefix, "holder": v.Holder} {
		if err := checkText(name, s); err != nil {
			return View{}, fmt.Errorf("%w: %v", ErrView, err)
		}
	}
	var states []string
	for _, s := range q["state"] {
		for _, st := range strings.Split(s, ",") {
			if st = strings.TrimSpace(st); st == "" {
				continue
			}
			if !slices.Contains(States, st) {
				return View{}, fmt.Errorf("%w: state %q (use %s)", ErrView, st, strings.Join(States, ", "))
			}
			if !slices.Contains(states, st) {
				states = append(states, st)
			}
		}
	}
	slices.Sort(states)
	v.States = strings.Join(states, ",")
	if v.Sort == "" {
		v.Sort = "key"
	}
	if _, ok := orders[v.Sort]; !ok {
		return View{}, fmt.Errorf("%w: sort %q (use key, holder, state, fence, acquired, expires)", ErrView, v.Sort)
	}
	switch q.Get("order") {
	case "", "asc":
	case "desc":
		v.Desc = true
	default:
		return View{}, fmt.Errorf("%w: order %q (use asc or desc)", ErrView, q.Get("order"))
	}
	var err error
	if v.Offset, err = intParam(q, "offset", 0, 0, MaxOffset); err != nil {
		return View{}, err
	}
	if v.Limit, err = intParam(q, "limit", DefaultLimit, 1, MaxLimit); err != nil {
		return View{}, err
	}
	return v, nil
}

func intParam(q url.Values, name string, def, lo, hi int) (int, error) {
	s := q.Get(name)
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%w: %s %q: want a whole number from %d to %d", ErrView, name, s, lo, hi)
	}
	return n, nil
}

// filtered reports whether the view keeps only some rows (the page read
// then counts them; otherwise the summary's total is the count).
func (v View) filtered() bool { return v.Prefix != "" || v.Holder != "" || v.States != "" }

// args are pageSQL's parameters for the view.
func (v View) args() []any {
	var holder, states any
	if v.Holder != "" {
		holder = v.Holder
	}
	if v.States != "" {
		states = strings.Split(v.States, ",")
	}
	return []any{v.Prefix, holder, states, v.Limit, v.Offset, v.filtered()}
}

// query is the view as a query string, defaults left out.
func (v View) query() url.Values {
	q := url.Values{}
	set := func(k, val string) {
		if val != "" {
			q.Set(k, val)
		}
	}
	set("prefix", v.Prefix)
	set("holder", v.Holder)
	set("state", v.States)
	if v.Sort != "key" {
		set("sort", v.Sort)
	}
	if v.Desc {
		q.Set("order", "desc")
	}
	if v.Offset != 0 {
		q.Set("offset", strconv.Itoa(v.Offset))
	}
	if v.Limit != DefaultLimit {
		q.Set("limit", strconv.Itoa(v.Limit))
	}
	return q
}

// URL returns the view as a relative URL ("?…", or "./" for the default
// view), for the page's links.
func (v View) URL() string {
	if q := v.query().Encode(); q != "" {
		return "?" + q
	}
	return "./"
}

// SortURL is the view sorted by col: ascending, or descending when it is
// already sorted ascending by col; back to the first page.
func (v View) SortURL(col string) string {
	v.Desc = v.Sort == col && !v.Desc
	v.Sort, v.Offset = col, 0
	return v.URL()
}

// SortMark is "▲" or "▼" on the column the view is sorted by.
func (v View) SortMark(col string) string {
	switch {
	case v.Sort != col:
		return ""
	case v.Desc:
		return "▼"
	}
	return "▲"
}

// PageURL is the view at another offset.
func (v View) PageURL(offset int) string {
	v.Offset = max(0, offset)
	return v.URL()
}

// StateURL is the view filtered to one state (every state for ""), first page.
func (v View) StateURL(state string) string {
	v.States, v.Offset = state, 0
	return v.URL()
}

// HolderURL is the view filtered to one holder, first page.
func (v View) HolderURL(holder string) string {
	v.Holder, v.Offset = holder, 0
	return v.URL()
}
