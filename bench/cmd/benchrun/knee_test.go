package main

import "testing"

func TestKnee(t *testing.T) {
	steps := func(tp ...float64) []satStep {
		var s []satStep
		for i, v := range tp {
			s = append(s, satStep{Workers: 1 << i, ClaimsPerSec: v})
		}
		return s
	}
	for _, c := range []struct {
		tp    []float64
		want  int
		found bool
	}{
		{[]float64{100, 190, 300, 320, 310}, 3, true},
		{[]float64{100, 200, 400}, 2, false},
		{[]float64{100, 90}, 0, true},
		{[]float64{100, 150, 140, 160, 120}, 3, true}, // a dip is not the knee
		{[]float64{100}, 0, false},
	} {
		k := knee(steps(c.tp...))
		if k.At.Workers != 1<<c.want || k.Found != c.found {
			t.Errorf("knee(%v) = %d workers, %v; want %d, %v", c.tp, k.At.Workers, k.Found, 1<<c.want, c.found)
		}
	}
}

func TestCDFEndsAtHundred(t *testing.T) {
	pts := cdf([]int64{1e6, 2e6, 3e6, 4e6})
	if len(pts) != 4 || pts[3][1] != 100 || pts[0][0] != 1 {
		t.Fatalf("cdf = %v", pts)
	}
}
