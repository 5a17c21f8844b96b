package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/cmd/pglease/internal/statuspage"
	"github.com/pglease/pglease/pgleasetest"
)

// tickList is a Schedule with the listed ticks (in order) and none after.
type tickList []time.Time

func (ts tickList) Next(t time.Time) time.Time {
	for _, x := range ts {
		if x.After(t) {
			return x
		}
	}
	return time.Time{}
}

// TestStatusPageMarksOverdue: in a real browser, the live page (no reload)
// marks a scheduled key red as overdue once its next tick passes with no
// run, counts it in the summary and the window's title, links it to its
// key page, which shows the schedule and the overdue tick in red; a
// catch-up run clears the mark, again without a reload.
func TestStatusPageMarksOverdue(t *testing.T) {
	table, a := setup(t, "worker-a@host-1", 30*time.Second)
	ctx := testCtx(t)
	const step = 3 * time.Second
	t0 := time.Now().Add(time.Second).Truncate(time.Millisecond)
	ticks := tickList{t0, t0.Add(step), t0.Add(time.Hour)}
	for key, s := range map[string]tickList{"nightly": ticks, "weekly": {t0.Add(time.Hour)}} {
		if _, err := a.RegisterSchedule(ctx, key, pglease.JobSchedule{Spec: "test " + key, Schedule: s}); err != nil {
			t.Fatal(err)
		}
	}
	db := pgleasetest.DB(t, 4)
	base := serve(t, statuspage.Config{DB: db, Table: table})
	br := newBrowser(t)

	time.Sleep(time.Until(ticks[0]))
	run := lock(t, a, "nightly", pglease.Tick(ticks[0]), pglease.NextTick(ticks[1]))
	if err := run.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lock(t, a, "weekly")
	br.do(t, "open the page", chromedp.Navigate(base+"/"))
	br.waitFor(t, "the first live render", `(window.__pgleaseLog || []).length > 0`)
	if time.Now().Before(ticks[1].Add(-500 * time.Millisecond)) {
		if got := eval[string](t, br, `document.querySelector('#overdue li.overdues').textContent`); got != "0 overdue" {
			t.Errorf("before the missed tick: %q, want \"0 overdue\"", got)
		}
	} else {
		t.Log("the page opened too late to see the key before its tick was due")
	}

	// Every replica is "down" across ticks[1]: the page marks it by itself.
	br.waitFor(t, "the overdue mark", `document.querySelector('#overdue li.overdues').textContent === '1 overdue'`)
	type mark struct {
		Rows    []string `json:"rows"`
		Red     bool     `json:"red"`
		ChipRed bool     `json:"chip_red"`
		Title   string   `json:"title"`
		Tip     string   `json:"tip"`
		Link    string   `json:"link"`
		Visible bool     `json:"visible"`
	}
	m := eval[mark](t, br, `(function () { var red = `+isRed+`;
  var rows = Array.from(document.querySelectorAll('#leases tr.overdue')), od = document.querySelector('#leases tr.overdue .od');
  var r = od ? od.getBoundingClientRect() : null;
  return { rows: rows.map(function (r) { return r.dataset.key; }), red: !!od && red(getComputedStyle(od).backgroundColor),
    chip_red: red(getComputedStyle(document.querySelector('#overdue li.overdues')).color), title: document.title,
    tip: od ? od.title : '', link: document.querySelector('#overdue a').textContent, visible: !!r && r.width > 10 && r.height > 5 };
})()`)
	due := ticks[1].UTC().Format("2006-01-02 15:04:05.000Z")
	if len(m.Rows) != 1 || m.Rows[0] != "nightly" || !m.Red || !m.ChipRed || !m.Visible ||
		!strings.HasPrefix(m.Title, "1 overdue · pglease") || m.Tip != "tick due "+due+" has not run" || m.Link != "nightly due "+due {
		t.Fatalf("overdue mark: %+v", m)
	}
	br.checkClean(t)

	href := eval[string](t, br, `document.querySelector('#overdue a').href`) // the key page, from the chip
	if href != base+"/key/nightly" {
		t.Fatalf("the chip links to %q", href)
	}
	br.do(t, "open the key page", chromedp.Navigate(href))
	br.waitFor(t, "the key page", `!!document.querySelector('#schedule')`)
	type keyMark struct {
		Key, Due string
		Red      bool
	}
	k := eval[keyMark](t, br, `(function () { var od = document.querySelector('#schedule .od');
  return { Key: document.querySelector('#key').textContent, Due: document.querySelector('#next-due').textContent,
    Red: !!od && (`+isRed+`)(getComputedStyle(od).backgroundColor) }; })()`)
	if k.Key != "nightly" || !strings.HasPrefix(k.Due, due+" overdue no run has claimed it") || !k.Red {
		t.Fatalf("key page: %+v", k)
	}
	br.checkClean(t)

	// A replica catches the tick up: the mark goes, without a reload.
	br.do(t, "back to the table", chromedp.Navigate(base+"/"))
	br.waitFor(t, "the overdue mark again", `document.querySelectorAll('#leases tr.overdue').length === 1`)
	catchUp := lock(t, a, "nightly", pglease.Tick(ticks[1]), pglease.NextTick(ticks[2]), pglease.CatchUp())
	if err := catchUp.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	br.waitFor(t, "the mark to clear", `document.querySelector('#overdue li.overdues').textContent === '0 overdue' &&
  document.querySelectorAll('#leases tr.overdue, #leases .od').length === 0 && document.title.indexOf('pglease') === 0`)
	br.checkClean(t)
}
