package ui

import (
	"reflect"
	"testing"
)

func TestBindHistogram(t *testing.T) {
	var claims []Claim
	for _, ms := range []int64{0, 5, 10, 11, 40, 90, 90, 120, 6000} {
		claims = append(claims, Claim{BindMillis: ms})
	}
	h := bindHistogramOf(claims)
	if h.Count != 8 || h.P50 != 40 || h.P95 != 120 || h.Max != 6000 {
		t.Errorf("count %d p50 %d p95 %d max %d", h.Count, h.P50, h.P95, h.Max)
	}
	var counts []int
	for _, b := range h.Buckets {
		counts = append(counts, b.Count)
	}
	// 5 and 10 are ≤ 10; 11 ≤ 25; 40 ≤ 50; 90, 90 ≤ 100; 120 ≤ 250; 6000 > 5000.
	if want := []int{2, 1, 1, 2, 1, 0, 0, 0, 0, 1}; !reflect.DeepEqual(counts, want) {
		t.Errorf("buckets %v, want %v", counts, want)
	}
	if h.Buckets[0].Label != "0–10 ms" || h.Buckets[9].Label != "> 5000 ms" || h.Buckets[0].Percent != 100 || h.Buckets[1].Percent != 50 {
		t.Errorf("buckets %+v", h.Buckets)
	}
	if h := bindHistogramOf(nil); h.Count != 0 || h.Buckets != nil {
		t.Errorf("no claims: %+v", h)
	}
}
