package testenv

import (
	"strings"
	"testing"
)

func TestParseRequestLatencies(t *testing.T) {
	raw := strings.Join([]string{
		`# TYPE apiserver_request_duration_seconds histogram`,
		`apiserver_request_duration_seconds_bucket{component="apiserver",group="kairon.zyvor.dev",resource="machines",scope="resource",subresource="status",verb="PATCH",version="v1alpha1",le="0.025"} 7`,
		`apiserver_request_duration_seconds_bucket{component="apiserver",group="kairon.zyvor.dev",resource="machines",scope="resource",subresource="status",verb="PATCH",version="v1alpha1",le="0.05"} 9`,
		`apiserver_request_duration_seconds_bucket{component="apiserver",group="kairon.zyvor.dev",resource="machines",scope="resource",subresource="status",verb="PATCH",version="v1alpha1",le="+Inf"} 10`,
		`apiserver_request_duration_seconds_sum{component="apiserver",group="kairon.zyvor.dev",resource="machines",scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 0.3`,
		`apiserver_request_duration_seconds_count{component="apiserver",group="kairon.zyvor.dev",resource="machines",scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 10`,
		// The same kind from another scope adds up.
		`apiserver_request_duration_seconds_bucket{component="apiserver",group="",resource="events",scope="namespace",subresource="",verb="POST",version="v1",le="0.05"} 4`,
		`apiserver_request_duration_seconds_sum{component="apiserver",group="",resource="events",scope="namespace",subresource="",verb="POST",version="v1"} 0.02`,
		`apiserver_request_duration_seconds_count{component="apiserver",group="",resource="events",scope="namespace",subresource="",verb="POST",version="v1"} 4`,
		`apiserver_request_duration_seconds_bucket{component="apiserver",group="",resource="events",scope="resource",subresource="",verb="POST",version="v1",le="0.05"} 1`,
		`apiserver_request_duration_seconds_sum{component="apiserver",group="",resource="events",scope="resource",subresource="",verb="POST",version="v1"} 0.08`,
		`apiserver_request_duration_seconds_count{component="apiserver",group="",resource="events",scope="resource",subresource="",verb="POST",version="v1"} 2`,
		// Small sums come in exponent form.
		`apiserver_request_duration_seconds_sum{component="apiserver",group="kairon.zyvor.dev",resource="machineclaims",scope="resource",subresource="",verb="POST",version="v1alpha1"} 2.5e-03`,
		`apiserver_request_duration_seconds_count{component="apiserver",group="kairon.zyvor.dev",resource="machineclaims",scope="resource",subresource="",verb="POST",version="v1alpha1"} 1`,
		`apiserver_request_duration_seconds_bucket{component="apiserver",group="kairon.zyvor.dev",resource="machineclaims",scope="resource",subresource="",verb="POST",version="v1alpha1",le="0.05"} 1`,
		// Reads are left out by IsWrite; other metrics are not read.
		`apiserver_request_duration_seconds_count{component="apiserver",group="",resource="pods",scope="resource",subresource="",verb="GET",version="v1"} 99`,
		`apiserver_request_total{code="200",resource="pods",verb="GET"} 99`,
	}, "\n")
	got, err := APIMetrics(raw).Latencies(IsWrite)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]RequestLatency{
		"PATCH machines/status": {Count: 10, Sum: 0.3, Over50ms: 1},
		"POST events":           {Count: 6, Sum: 0.1, Over50ms: 1},
		"POST machineclaims":    {Count: 1, Sum: 0.0025},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, w := range want {
		g := got[k]
		if g.Count != w.Count || g.Over50ms != w.Over50ms || g.Sum < w.Sum-1e-9 || g.Sum > w.Sum+1e-9 {
			t.Errorf("%s: got %+v, want %+v", k, g, w)
		}
	}
	before := map[string]RequestLatency{"PATCH machines/status": {Count: 4, Sum: 0.1, Over50ms: 1}}
	line := LatenciesSince(before, got, 0)
	if wantLine := "PATCH machines/status: 6, mean 33.3 ms, over 50 ms 0; POST events: 6, mean 16.7 ms, over 50 ms 1; POST machineclaims: 1, mean 2.5 ms, over 50 ms 0"; line != wantLine {
		t.Errorf("LatenciesSince = %q, want %q", line, wantLine)
	}
}

func TestEachSeriesReadsRequestTotals(t *testing.T) {
	raw := []byte(strings.Join([]string{
		`# HELP apiserver_request_total Counter of apiserver requests.`,
		`apiserver_request_total{code="200",resource="pods",subresource="",verb="GET"} 99`,
		`apiserver_request_total{code="409",resource="machines",subresource="status",verb="PATCH"} 2`,
		`apiserver_request_duration_seconds_count{resource="pods",verb="GET"} 99`,
	}, "\n"))
	got := map[string]float64{}
	if err := eachSeries(raw, requestTotalLine, func(suffix string, labels map[string]string, v float64) {
		if suffix != "" {
			t.Errorf("suffix %q for apiserver_request_total", suffix)
		}
		got[requestKind(labels)+" "+labels["code"]] += v
	}); err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"GET pods 200": 99, "PATCH machines/status 409": 2}
	if len(got) != len(want) || got["GET pods 200"] != 99 || got["PATCH machines/status 409"] != 2 {
		t.Errorf("got %v, want %v", got, want)
	}
}
