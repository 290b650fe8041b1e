package node_test

import (
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestBindSamplesRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "samples.csv")
	first := []bindSample{{run: "a", egress: true, bindMillis: 12, watched: 15300 * time.Microsecond}, {run: "a", bindMillis: 7, watched: 9 * time.Millisecond}}
	second := []bindSample{{run: "b", egress: true, bindMillis: 40, watched: 51 * time.Millisecond}}
	for _, s := range [][]bindSample{first, second} {
		if err := appendBindSamples(path, s); err != nil {
			t.Fatal(err)
		}
	}
	got, err := readBindSamples(path)
	if err != nil {
		t.Fatal(err)
	}
	want := append(first, second...)
	if len(got) != len(want) {
		t.Fatalf("read %d samples, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("sample %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestParseBindSampleRejects(t *testing.T) {
	for _, line := range []string{
		"",
		"a,egress,12",
		",egress,12,100",
		"a,both,12,100",
		"a,plain,-1,100",
		"a,plain,12,1.5",
		"a,plain,12,100,extra",
	} {
		if s, err := parseBindSample(line); err == nil {
			t.Errorf("parseBindSample(%q) = %+v, want an error", line, s)
		}
	}
}

func TestEgressAddsAtPercentiles(t *testing.T) {
	var samples []bindSample
	// 100 of each: plain i ms, egress i+10 ms for i in 1..100, and one
	// egress straggler that only the max sees.
	for i := 1; i <= 100; i++ {
		samples = append(samples,
			bindSample{run: "r", bindMillis: int64(i), watched: time.Duration(i) * time.Millisecond},
			bindSample{run: "r", egress: true, bindMillis: int64(i + 10), watched: time.Duration(i+10) * time.Millisecond})
	}
	samples[len(samples)-1].bindMillis = 500
	for _, p := range []int{50, 99} {
		if got := egressAdds(samples, byBindMillis, p); got != 10*time.Millisecond {
			t.Errorf("egress adds at p%d by bindMillis = %v, want 10ms", p, got)
		}
		if got := egressAdds(samples, byWatch, p); got != 10*time.Millisecond {
			t.Errorf("egress adds at p%d as watched = %v, want 10ms", p, got)
		}
	}
	lo, hi := addsInterval(samples, byWatch, 99, 500, rand.New(rand.NewPCG(1, 2)))
	if lo > 10*time.Millisecond || hi < 10*time.Millisecond || hi-lo > 20*time.Millisecond {
		t.Errorf("bootstrap interval [%v, %v] should hold 10ms and be narrow", lo, hi)
	}
}

func TestPooledReportNamesEveryRun(t *testing.T) {
	var samples []bindSample
	for _, run := range []string{"first", "second"} {
		for i := range 50 {
			samples = append(samples,
				bindSample{run: run, bindMillis: int64(i), watched: time.Duration(i) * time.Millisecond},
				bindSample{run: run, egress: true, bindMillis: int64(i + 5), watched: time.Duration(i+5) * time.Millisecond})
		}
	}
	lines := pooledReport(samples)
	if len(lines) != 3 || !strings.Contains(lines[0], "pooled over 2 runs: 100 claims with egress, 100 without") {
		t.Fatalf("report: %q", lines)
	}
	for _, l := range lines[1:] {
		if !strings.Contains(l, "5.0 ms at p99") || !strings.HasSuffix(l, "each run's p99: 5.0 5.0") {
			t.Errorf("line %q: want 5.0 ms at p99 pooled and in each run", l)
		}
	}
	if got := pooledReport(samples[:1]); len(got) != 1 || !strings.Contains(got[0], "no claims of one kind") {
		t.Errorf("one kind only: %q", got)
	}
}

func TestRunsIntervalSpansTheRuns(t *testing.T) {
	// Two kinds of run: egress adds 0 ms in one, 20 ms in the other.
	perRun := map[string][]bindSample{}
	runs := []string{"calm", "busy", "calm2", "busy2"}
	for _, run := range runs {
		extra := int64(0)
		if strings.HasPrefix(run, "busy") {
			extra = 20
		}
		for i := range 100 {
			perRun[run] = append(perRun[run],
				bindSample{run: run, bindMillis: int64(i)},
				bindSample{run: run, egress: true, bindMillis: int64(i) + extra})
		}
	}
	lo, hi := runsInterval(runs, perRun, byBindMillis, 50, 1000, rand.New(rand.NewPCG(1, 2)))
	if lo != 0 || hi != 20*time.Millisecond {
		t.Errorf("interval over runs = [%v, %v], want [0s, 20ms]: all calm and all busy both drawn", lo, hi)
	}
	same := map[string][]bindSample{"a": perRun["busy"], "b": perRun["busy2"], "c": perRun["busy"]}
	lo, hi = runsInterval([]string{"a", "b", "c"}, same, byBindMillis, 50, 200, rand.New(rand.NewPCG(1, 2)))
	if lo != 20*time.Millisecond || hi != 20*time.Millisecond {
		t.Errorf("alike runs: interval [%v, %v], want exactly 20ms", lo, hi)
	}
}

func TestPooledReportResamplesRunsFromThree(t *testing.T) {
	var samples []bindSample
	for _, run := range []string{"a", "b", "c"} {
		for i := range 50 {
			samples = append(samples,
				bindSample{run: run, bindMillis: int64(i), watched: time.Duration(i) * time.Millisecond},
				bindSample{run: run, egress: true, bindMillis: int64(i + 5), watched: time.Duration(i+5) * time.Millisecond})
		}
	}
	for _, l := range pooledReport(samples)[1:] {
		if !strings.Contains(l, "5.0 to 5.0 ms resampling whole runs") {
			t.Errorf("line %q: want the interval over runs", l)
		}
	}
	// A run with claims of one kind only cannot give its own p99.
	lines := pooledReport(append(samples, bindSample{run: "d", egress: true, bindMillis: 3}))
	if len(lines) != 1 || !strings.Contains(lines[0], "run d has no claims of one kind") {
		t.Errorf("report with a one-kind run: %q", lines)
	}
}
