package node_test

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// bindSample is one claim of TestEgressBindLatency: which run, with or
// without spec.egress, its status.bindMillis and create → Bound as the
// watching client saw it.
type bindSample struct {
	run        string
	egress     bool
	bindMillis int64
	watched    time.Duration
}

// A p99 over the 200 claims of one run is its third slowest claim, so one
// run's "egress adds" at p99 is the difference of two order statistics that
// swing by tens of milliseconds from run to run. Runs that append their
// claims to one file (KAIRON_EGRESS_BENCH_SAMPLES) are reported pooled as
// well: the p99 of a thousand claims of each kind rests on its ten slowest.

// appendBindSamples adds samples to the file at path, one line per claim:
// run, egress or plain, bindMillis, create → Bound in microseconds.
func appendBindSamples(path string, samples []bindSample) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	for _, s := range samples {
		kind := "plain"
		if s.egress {
			kind = "egress"
		}
		fmt.Fprintf(w, "%s,%s,%d,%d\n", s.run, kind, s.bindMillis, s.watched.Microseconds())
	}
	return errors.Join(w.Flush(), f.Close())
}

// readBindSamples reads a file appendBindSamples wrote.
func readBindSamples(path string) ([]bindSample, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []bindSample
	for i, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		s, err := parseBindSample(line)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, i+1, err)
		}
		out = append(out, s)
	}
	return out, nil
}

func parseBindSample(line string) (bindSample, error) {
	f := strings.Split(line, ",")
	if len(f) != 4 || f[0] == "" {
		return bindSample{}, fmt.Errorf("want run,egress|plain,bindMillis,watchedMicros, got %q", line)
	}
	s := bindSample{run: f[0]}
	switch f[1] {
	case "egress":
		s.egress = true
	case "plain":
	default:
		return bindSample{}, fmt.Errorf("kind %q is neither egress nor plain", f[1])
	}
	bind, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil || bind < 0 {
		return bindSample{}, fmt.Errorf("bindMillis %q is not a count of milliseconds", f[2])
	}
	watched, err := strconv.ParseInt(f[3], 10, 64)
	if err != nil || watched < 0 {
		return bindSample{}, fmt.Errorf("watched %q is not a count of microseconds", f[3])
	}
	s.bindMillis, s.watched = bind, time.Duration(watched)*time.Microsecond
	return s, nil
}

// percentile is the p-th percentile of sorted xs, the benchmark's rank:
// xs[(n-1)·p/100], so p99 of 200 is the third slowest.
func percentile(sorted []time.Duration, p int) time.Duration {
	return sorted[(len(sorted)-1)*p/100]
}

// bindMeasure picks one of a sample's two measures.
type bindMeasure func(bindSample) time.Duration

func byBindMillis(s bindSample) time.Duration { return time.Duration(s.bindMillis) * time.Millisecond }
func byWatch(s bindSample) time.Duration      { return s.watched }

// egressAdds is what spec.egress adds to measure at percentile p:
// p-th of the egress claims minus p-th of the plain ones.
func egressAdds(samples []bindSample, measure bindMeasure, p int) time.Duration {
	egress, plain := splitSorted(samples, measure)
	return percentile(egress, p) - percentile(plain, p)
}

func splitSorted(samples []bindSample, measure bindMeasure) (egress, plain []time.Duration) {
	for _, s := range samples {
		if s.egress {
			egress = append(egress, measure(s))
		} else {
			plain = append(plain, measure(s))
		}
	}
	slices.Sort(egress)
	slices.Sort(plain)
	return egress, plain
}

// addsInterval is a 95% bootstrap interval of egressAdds at p: both kinds
// resampled with replacement, rounds times. It takes the claims as
// independent draws, which claims of one run on one machine are only
// roughly; the per-run figures show how far runs differ.
func addsInterval(samples []bindSample, measure bindMeasure, p, rounds int, rng *rand.Rand) (lo, hi time.Duration) {
	egress, plain := splitSorted(samples, measure)
	adds := make([]time.Duration, rounds)
	e, q := make([]time.Duration, len(egress)), make([]time.Duration, len(plain))
	for r := range adds {
		for i := range e {
			e[i] = egress[rng.IntN(len(egress))]
		}
		for i := range q {
			q[i] = plain[rng.IntN(len(plain))]
		}
		slices.Sort(e)
		slices.Sort(q)
		adds[r] = percentile(e, p) - percentile(q, p)
	}
	return middle95(adds)
}

// middle95 is the range of the middle 95% of xs, which it sorts.
func middle95(xs []time.Duration) (lo, hi time.Duration) {
	slices.Sort(xs)
	return xs[len(xs)*25/1000], xs[len(xs)*975/1000]
}

// runsInterval is a 95% bootstrap interval of egressAdds at p that
// resamples whole runs (with replacement, rounds times), so that what
// differs between runs (the machine's load, the control plane's start)
// counts. With a handful of runs it is coarse.
func runsInterval(runs []string, perRun map[string][]bindSample, measure bindMeasure, p, rounds int, rng *rand.Rand) (lo, hi time.Duration) {
	adds := make([]time.Duration, rounds)
	var pooled []bindSample
	for r := range adds {
		pooled = pooled[:0]
		for range runs {
			pooled = append(pooled, perRun[runs[rng.IntN(len(runs))]]...)
		}
		adds[r] = egressAdds(pooled, measure, p)
	}
	return middle95(adds)
}

// pooledReport describes the claims of every run in samples: how many,
// what egress adds at p50 and p99 by each measure with the p99's
// bootstrap interval (over claims; with three runs or more, also over
// runs), and each run's own p99 figures.
func pooledReport(samples []bindSample) []string {
	var runs []string
	perRun := map[string][]bindSample{}
	for _, s := range samples {
		if _, ok := perRun[s.run]; !ok {
			runs = append(runs, s.run)
		}
		perRun[s.run] = append(perRun[s.run], s)
	}
	for _, run := range runs {
		if e, q := splitSorted(perRun[run], byWatch); len(e) == 0 || len(q) == 0 {
			return []string{fmt.Sprintf("run %s has no claims of one kind", run)}
		}
	}
	egress, plain := splitSorted(samples, byWatch)
	if len(egress) == 0 || len(plain) == 0 {
		return []string{"no claims of one kind in the samples"}
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }
	out := []string{fmt.Sprintf("pooled over %d runs: %d claims with egress, %d without; p99 is the %d-th fastest",
		len(runs), len(egress), len(plain), (len(egress)-1)*99/100+1)}
	rng := rand.New(rand.NewPCG(1, 2)) // the same interval for the same file
	for _, m := range []struct {
		name    string
		measure bindMeasure
	}{{"status.bindMillis", byBindMillis}, {"create → Bound (watch)", byWatch}} {
		lo, hi := addsInterval(samples, m.measure, 99, 2000, rng)
		interval := fmt.Sprintf("95%% bootstrap interval %s to %s ms", ms(lo), ms(hi))
		if len(runs) >= 3 {
			lo, hi = runsInterval(runs, perRun, m.measure, 99, 2000, rng)
			interval += fmt.Sprintf("; %s to %s ms resampling whole runs", ms(lo), ms(hi))
		}
		line := fmt.Sprintf("%s: egress adds %s ms at p50, %s ms at p99 (%s); each run's p99:",
			m.name, ms(egressAdds(samples, m.measure, 50)), ms(egressAdds(samples, m.measure, 99)), interval)
		for _, run := range runs {
			line += " " + ms(egressAdds(perRun[run], m.measure, 99))
		}
		out = append(out, line)
	}
	return out
}
